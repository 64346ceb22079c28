"""``speceyes bench accounting``: the accounting's claims against the runs they speak of,
on SpecEyes-Synth with the shipped synth models (times are a machine's: printed, never
asserted).

Per split (the manifest, V*, HR-Bench, POPE layouts of one generated corpus):

- ``annotate --estimate N`` in one store, then the full run in a fresh one: the accepted
  share, the model time and the wall time each against the interval the estimate gave;
- the funnel (with ``--audit-rate``) and an agent-alone run (``--baseline``) of the
  same rows: the "saved" figure and its interval against what was measured, the
  agent-alone run's time on the rows the funnel accepted less the funnel's fast stage
  and its audits (the rows both ran through the agent are the same work twice: their
  difference is noise, not a saving).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import tempfile
from pathlib import Path
from typing import Any

from cli.main import main
from common.contracts import AnsweredBy, Usage
from common.store.db import open_store
from common.store.listing import Window, batches_page
from common.store.overview import overview
from common.store.reads import batch_results, require_batch

SPLITS = ("manifest.jsonl", "vstar", "hr_bench_synth.tsv", "POPE")
MODELS = ["--small", "synth", "--large", "synth", "--threshold", "0.9", "--no-progress"]
_SHARE = re.compile(r"answered by the small model\s+([\d.]+)% \(([\d.]+)% to ([\d.]+)%\)")
_MODEL = re.compile(r"model time, whole corpus\s+([\d.]+) s \(([\d.]+) s to ([\d.]+) s\)")
_WALL = re.compile(r"wall time on this deployment\s+([\d.]+) s \(([\d.]+) s .* to ([\d.]+) s at")
_DONE = re.compile(r"small model \d+ \(([\d.]+)% of jobs\)")
_TOOK = re.compile(r"this run\s+\d+ jobs in ([\d.]+) s")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n", 1)[1] if __doc__ else None
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--items", type=int, default=100, help="synth items (100)")
    parser.add_argument("--sample", type=int, default=40, help="--estimate's rows (40)")
    parser.add_argument("--seed", type=int, default=7, help="the corpus's seed (7)")
    parser.add_argument(
        "--audit-rate",
        default="0.25",
        help="the funnel runs' audit share (0.25: enough audits of accepted jobs to be the "
        "saved figure's basis; 0: the basis falls back to the agent's other runs)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="speceyes-bench-accounting-") as folder:
        root = Path(folder)
        _quiet(
            [
                "synth",
                "generate",
                str(root / "synth"),
                "--items",
                str(args.items),
                "--seed",
                str(args.seed),
            ]
        )
        print(f"estimate (--estimate {args.sample}) against the full run; figure: full (interval)")
        print(f"{'split':<20} {'accepted %':<24} {'model s':<22} {'wall s':<22}")
        for index, split in enumerate(SPLITS):
            source = str(root / "synth" / split)
            sampled = f"sqlite:///{root / f'estimate{index}.db'}"
            said = _quiet(
                ["annotate", source, *MODELS, "--db", sampled, "--estimate", str(args.sample)]
            )
            whole = f"sqlite:///{root / f'whole{index}.db'}"
            ran = _quiet(["annotate", source, *MODELS, "--db", whole])
            model_s = _model_seconds(whole)
            cells = [
                _cell(float(_find(_DONE, ran)[0]), _find(_SHARE, said)[1:]),
                _cell(model_s, _find(_MODEL, said)[1:]),
                _cell(float(_find(_TOOK, ran)[0]), _find(_WALL, said)[1:]),
            ]
            print(f"{split:<20} " + " ".join(f"{cell:<22}" for cell in cells))
        print(
            "\nsaved against the agent alone, model seconds; figure: measured (estimate, interval)"
        )
        for index, split in enumerate(SPLITS):
            db = f"sqlite:///{root / f'saved{index}.db'}"
            source = str(root / "synth" / split)
            audited = ["--audit-rate", args.audit_rate]
            _quiet(["annotate", source, *MODELS, *audited, "--db", db, "--name", "funnel"])
            _quiet(["annotate", source, *MODELS, "--db", db, "--name", "alone", "--baseline"])
            measured, saved = measured_saving(db)
            if saved is None:
                print(f"{split:<20} no estimate (too few agent runs)")
                continue
            held = "inside" if saved.low <= measured <= saved.high else "OUTSIDE"
            print(
                f"{split:<20} {measured:7.2f} ({saved.seconds:.2f}, {saved.low:.2f} to "
                f"{saved.high:.2f}; {saved.basis}) {held}"
            )
    return 0


def _quiet(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(argv)
    return out.getvalue()


def _find(pattern: re.Pattern[str], text: str) -> tuple[str, ...]:
    found = pattern.search(text)
    if found is None:
        raise RuntimeError(f"the bench could not read its run's output:\n{text}")
    return found.groups()


def _cell(value: float, interval: tuple[str, ...]) -> str:
    low, high = float(interval[0]), float(interval[1])
    held = "" if low <= value <= high else " OUT"
    return f"{value:.1f} ({low:.1f}-{high:.1f}){held}"


def _model_seconds(database: str) -> float:
    sessions = open_store(database, create=False)
    with sessions() as session:
        (line,) = batches_page(session, Window(None, everyone=True))[0]
        return overview(session, line.batch.id).usage.spent.total_s


def measured_saving(database: str) -> tuple[float, Any]:
    """In a store holding a batch ``funnel`` and an agent-alone batch ``alone`` of the
    same rows: what the funnel saved as measured (the agent-alone run's time on the rows
    the funnel accepted, less the funnel's fast stage and audits), and its ``Saved``."""
    sessions = open_store(database, create=False)
    with sessions() as session:
        funnel_id, alone_id = (require_batch(session, name).id for name in ("funnel", "alone"))
        usage = overview(session, funnel_id).usage
        accepted = {
            item.item_id
            for item, job in batch_results(session, funnel_id)
            if job.answered_by == AnsweredBy.SMALL
        }
        skipped = sum(
            Usage.of(job.agent_usage).total_s
            for item, job in batch_results(session, alone_id)
            if item.item_id in accepted
        )
    sessions.close()
    audits = usage.spent.seconds.get("audit", 0.0)  # (compute the funnel spent too)
    return skipped - usage.fast_s - audits, usage.saved()
