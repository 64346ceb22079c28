"""``speceyes bench synth``: the SpecEyes-Synth report (``lab.synth.report``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.options import (
    add_model_flags,
    flag_defaults,
    settings_from_args,
)
from common.backends import load_models
from lab.synth.report import format_report, run_report, save


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "On a held-out synth set, with the shipped synth models: small-only, "
        "agent-only and funnel accuracy; beta and alpha; the embedded runner's jobs/s "
        "against --baseline; accepted vs rejected accuracy of each gate at tau 0.97 and "
        "0.98; a PNG of accuracy and speedup against tau."
    )
    parser.add_argument("--items", type=int, default=160, help="held-out items (160)")
    parser.add_argument("--seed", type=int, default=99, help="held-out seed (99)")
    parser.add_argument("--plot", type=Path, default=Path("synth-report.png"))
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    parser.add_argument(
        "--threshold",
        type=float,
        metavar="TAU",
        help="the funnel run's gate threshold (min gate; default 0.98, or "
        "SPECEYES_GATE_THRESHOLD); the gate table shows 0.97 and 0.98 whatever it is",
    )
    add_model_flags(parser)
    parser.set_defaults(run=run, **flag_defaults(small_model="synth", large_model="synth"))


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    models = load_models(settings)
    report = run_report(
        models,
        settings,
        count=args.items,
        seed=args.seed,
        plot_path=args.plot,
        on_log=lambda line: print(line, flush=True),
    )
    print(format_report(report))
    if args.json:
        save(report, args.json)
    return 0
