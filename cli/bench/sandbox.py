"""``speceyes bench sandbox``: one execution of model-written code (``lab.bench.sandbox``)."""

from __future__ import annotations

import argparse
from typing import get_args

from common.sandbox import Isolation
from lab.bench import sandbox


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run trivial and image-cropping programs through the code sandbox, "
        "the way a Thyme trajectory does (a spare guest process started during the "
        "model's step, --gap-s apart), and without the spare (a cold start each time). "
        "Prints the median and p90 milliseconds from handing over the code to the result. "
        "Target: well under the model's own time per step (< 100 ms here)."
    )
    parser.add_argument("--runs", type=int, default=20, help="executions per program (20)")
    parser.add_argument(
        "--isolation",
        choices=get_args(Isolation),
        default="bubblewrap",
        help="what isolates the code (bubblewrap)",
    )
    parser.add_argument(
        "--gap-s", type=float, default=0.3, help="the model's time between executions (0.3)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    print(f"sandbox overhead per execution ({args.runs} runs each, {args.isolation})")
    for row in sandbox.bench_sandbox(args.isolation, args.runs, args.gap_s):
        label = f"{row.program}, {'spare started ahead' if row.spare else 'cold start'}"
        print(f"  {label:<28} median {row.median_ms:6.1f} ms   p90 {row.p90_ms:6.1f} ms")
    return 0
