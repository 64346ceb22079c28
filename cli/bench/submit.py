"""``speceyes bench submit``: a large corpus into PostgreSQL (``lab.bench.submission``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from cli.options import add_settings, add_store_flags, settings_from_args
from lab.bench import submission


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a synthetic corpus of --rows rows (a Parquet table with an image column, or "
        "WebDataset shards with --shards), then submit it as `annotate` does into a scratch "
        "database beside --db (PostgreSQL; dropped afterwards), in a process of its own: "
        "print rows/s and that process's peak memory. No broker: the figure is reading, "
        "hashing and writing rows. Targets (issue 33): at least 5,000 rows/s, under 500 MB."
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows (1,000,000)")
    parser.add_argument(
        "--shards", action="store_true", help="WebDataset shards instead of a Parquet table"
    )
    add_settings(parser, "sources.submit_rows", flag="--chunk-rows")
    add_store_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    kind = "WebDataset shards" if args.shards else "a Parquet table"
    with submission.scratch_folder() as scratch:
        with tqdm(total=args.rows, desc="writing", unit="row", file=sys.stderr) as bar:
            if args.shards:
                source = submission.write_shards(Path(scratch) / "shards", args.rows, bar.update)
            else:
                path = Path(scratch) / "corpus.parquet"
                source = str(submission.write_table(path, args.rows, bar.update))
        print(
            f"submitting {args.rows} rows of {kind} into PostgreSQL, chunks of "
            f"{settings.sources.submit_rows} rows"
        )
        figures = submission.measure(source, settings.database_url, settings)
    print(
        f"submitted {figures.rows} rows ({figures.jobs_created} jobs) in {figures.seconds:.1f} s "
        f"= {figures.rows_per_s:.0f} rows/s; peak memory of the submitting process "
        f"{figures.peak_mb:.0f} MB"
    )
    return 0
