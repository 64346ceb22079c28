"""``speceyes bench``: throughput figures, printed (never asserted by tests)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from cli.options import add_model_flags, settings_from_args


def register(commands: Any) -> None:
    parser = commands.add_parser("bench", help="measure throughput")
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    fast = kinds.add_parser(
        "fast",
        help="fast-stage (phases I-III) jobs/s against batch size",
        description="Run phases I-III over synthetic queries at each batch size and print "
        "jobs/s. Every job is screened AND speculated (the fast stage's worst case), so the "
        "figure does not depend on what a model happens to decide. Defaults to the tiny "
        "checkpoints on this machine.",
    )
    fast.add_argument(
        "--batch-sizes", default="1,4,16,32", help="comma-separated batch sizes (1,4,16,32)"
    )
    fast.add_argument("--jobs", type=int, default=64, help="jobs per batch size (64)")
    fast.add_argument("--image-size", default="640x480", help="synthetic image size WxH (640x480)")
    add_model_flags(fast)
    fast.set_defaults(run=run_fast, small="tiny", large="tiny")


def run_fast(args: argparse.Namespace) -> int:
    from common.backends import load_models
    from common.bench import synthetic_queries
    from common.funnel import gate_stage, screen_stage, speculate_stage

    settings = settings_from_args(args)
    sizes = [int(size) for size in args.batch_sizes.split(",")]
    width, height = (int(side) for side in args.image_size.lower().split("x"))
    models = load_models(settings)
    queries = synthetic_queries(args.jobs, width, height)
    # Warm-up: first calls pay one-off costs (allocations, kernel selection).
    screen_stage(queries[:2], models.large, max_new_tokens=settings.screen_max_new_tokens)
    speculate_stage(queries[:2], models.small, max_new_tokens=4, top_k=settings.gate_top_k)

    device = getattr(models.large, "device", "-")
    print(
        f"fast stage on {settings.large_model} (screen) + {settings.small_model} (speculate), "
        f"{args.jobs} jobs of {width}x{height}, device {device}"
    )
    print(f"{'batch':>5} {'screen s':>9} {'speculate s':>12} {'gate s':>7} {'jobs/s':>8}")
    for size in sizes:
        seconds = {"screen": 0.0, "speculate": 0.0, "gate": 0.0}
        for start in range(0, len(queries), size):
            batch = queries[start : start + size]
            began = time.perf_counter()
            screen_stage(batch, models.large, max_new_tokens=settings.screen_max_new_tokens)
            seconds["screen"] += time.perf_counter() - began
            began = time.perf_counter()
            answers = speculate_stage(
                batch,
                models.small,
                max_new_tokens=settings.speculate_max_new_tokens,
                top_k=settings.gate_top_k,
            )
            seconds["speculate"] += time.perf_counter() - began
            began = time.perf_counter()
            gate_stage([a for a in answers if not isinstance(a, Exception)], settings.gate)
            seconds["gate"] += time.perf_counter() - began
        total = sum(seconds.values())
        print(f"{size:>5} {seconds['screen']:>9.2f} {seconds['speculate']:>12.2f} "
              f"{seconds['gate']:>7.3f} {len(queries) / total:>8.1f}")  # fmt: skip
    return 0
