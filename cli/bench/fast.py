"""``speceyes bench fast``: phases I-III against the batch size (``lab.bench.fast``)."""

from __future__ import annotations

import argparse

from cli.options import (
    add_model_flags,
    flag_defaults,
    settings_from_args,
)
from common.backends import load_models
from lab.bench import fast, workload


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run phases I-III over synthetic queries at each batch size and print "
        "jobs/s. Every job is screened AND speculated (the fast stage's worst case), so the "
        "figure does not depend on what a model happens to decide. Defaults to the tiny "
        "checkpoints on this machine."
    )
    parser.add_argument(
        "--batch-sizes", default="1,4,16,32", help="comma-separated batch sizes (1,4,16,32)"
    )
    parser.add_argument("--jobs", type=int, default=64, help="jobs per batch size (64)")
    parser.add_argument(
        "--depths",
        default="0",
        help="comma-separated speculation depths, a row group each: 0 (the paper), or "
        "e.g. 0,1,2 (the small model may zoom that many times; the row counts its zooms)",
    )
    parser.add_argument(
        "--image-size", default="640x480", help="synthetic image size WxH (640x480)"
    )
    add_model_flags(parser)
    parser.set_defaults(run=run, **flag_defaults(small_model="tiny", large_model="tiny"))


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    sizes = [int(size) for size in args.batch_sizes.split(",")]
    depths = [int(depth) for depth in args.depths.split(",")]
    width, height = (int(side) for side in args.image_size.lower().split("x"))
    models = load_models(settings)
    queries = workload.synthetic_queries(args.jobs, width, height)
    device = getattr(models.large, "device", "-")
    print(
        f"fast stage on {settings.models.large.name} (screen) + "
        f"{settings.models.small.name} (speculate), "
        f"{args.jobs} jobs of {width}x{height}, device {device}"
    )
    print(
        f"{'depth':>5} {'batch':>5} {'screen s':>9} {'speculate s':>12} {'gate s':>7} "
        f"{'zooms':>6} {'jobs/s':>8}"
    )
    for row in fast.bench_fast(models, queries, sizes, settings.funnel, depths):
        print(
            f"{row.depth:>5} {row.batch_size:>5} {row.screen_s:>9.2f} {row.speculate_s:>12.2f} "
            f"{row.gate_s:>7.3f} {row.zooms:>6} {row.jobs_per_s:>8.1f}"
        )
    return 0
