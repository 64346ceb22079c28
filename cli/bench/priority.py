"""``speceyes bench priority``: a single high job's wait behind a waiting corpus
(``lab.bench.priority``)."""

from __future__ import annotations

import argparse

from cli.options import add_store_flags, settings_from_args
from lab.bench import priority


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Fill a scratch store with --waiting queued jobs (one corpus, normal priority), "
        "start the embedded runner at zero model cost (the scripted backend), then send "
        "one job at high priority: print its wait from commit to answer, and, for "
        "contrast, what a normal job sent then would have waited (the corpus left ahead of "
        "it at the pace measured). A scratch PostgreSQL database beside --db when --db is "
        "PostgreSQL (dropped afterwards), else a SQLite file. Target (issue 46): under 2 s "
        "at 100,000 waiting."
    )
    parser.add_argument("--waiting", type=int, default=100_000, help="jobs waiting (100,000)")
    parser.add_argument("--batch-size", type=int, default=32, help="fast micro-batch (32)")
    add_store_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    database_url = settings_from_args(args).database_url
    store = "PostgreSQL" if database_url and database_url.startswith("postgresql") else "SQLite"
    print(f"{args.waiting} jobs waiting in a scratch {store} store; one high job sent ...")
    figures = priority.measure(args.waiting, database_url, args.batch_size)
    print(f"seeded in {figures.seed_s:.1f} s; sent with {figures.waiting} corpus jobs ahead of it")
    print(
        f"high job's wait {figures.wait_s:.2f} s (commit to answer); a normal job sent then "
        f"would wait about {figures.normal_wait_s:.0f} s (the corpus at {figures.pace:.0f} jobs/s)"
    )
    return 0
