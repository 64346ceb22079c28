"""``speceyes db upgrade``: bring the job store's schema up to date (and nothing else);
``speceyes db prune``: remove the jobs that finished before a date (retention).

Opening the store only checks its schema (a new database gets it; an older one is
refused): migrating a shared database is this command's job, run once per deployment
(the ``migrate`` service of docker-compose.yml), never a side effect of a worker
starting.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sqlalchemy.exc import OperationalError

from cli.options import add_store_flags, iso_moment, settings_from_args
from common.errors import ConfigurationError
from common.store.db import make_engine, migrate, open_store, schema_revision
from common.store.retention import prune


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    upgrade = actions.add_parser(
        "upgrade",
        help="apply every pending migration",
        description="Migrate the job store's schema to the one this version needs (a "
        "new database is made). Back up a store with data first.",
    )
    add_store_flags(upgrade)
    upgrade.set_defaults(run=run_upgrade)
    prune = actions.add_parser(
        "prune",
        help="remove the jobs that finished before a date (retention)",
        description="Remove the jobs that finished (done, failed or cancelled) before "
        "--finished-before, with their rows in every batch, the batches left empty, and "
        "the uploaded images (under api.upload_dir) no job left names. Never a job that "
        "has not finished, nor any job of a batch that still has one (an open batch keeps "
        "every row it counts and exports). Works in slices of 1,000 jobs, one transaction "
        "each: it can be stopped and run again.",
    )
    prune.add_argument(
        "--finished-before",
        required=True,
        type=iso_moment,
        metavar="DATE",
        help="an ISO date or time (UTC unless it says), e.g. 2026-09-01",
    )
    prune.add_argument(
        "--keep-reviewed", action="store_true", help="keep the jobs a person reviewed"
    )
    prune.add_argument("--dry-run", action="store_true", help="count them, remove nothing")
    add_store_flags(prune)
    prune.set_defaults(run=run_prune)


def run_upgrade(args: argparse.Namespace) -> int:
    url = settings_from_args(args).database_url
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        Path(url.removeprefix("sqlite:///")).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = make_engine(url)
    try:
        before = schema_revision(engine)
        migrate(engine)
        after = schema_revision(engine)
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise ConfigurationError(f"cannot migrate the job store: {reason}") from None
    finally:
        engine.dispose()
    said = "already at" if before == after else f"from {before or 'nothing'} to"
    print(f"job store {said} revision {after}")
    return 0


def run_prune(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    sessions = open_store(settings.database_url, create=False)
    try:
        done = prune(
            sessions,
            before=args.finished_before,
            keep_reviewed=args.keep_reviewed,
            upload_dir=settings.api.upload_dir,
            dry_run=args.dry_run,
            on_slice=lambda so_far: print(
                f"  {so_far.jobs:,} jobs removed so far", file=sys.stderr
            ),
        )
    finally:
        sessions.close()
    when = args.finished_before.isoformat()
    if args.dry_run:
        print(f"{done.jobs:,} jobs finished before {when} would be removed (nothing was)")
        return 0
    print(
        f"removed {done.jobs:,} jobs finished before {when}: {done.batch_rows:,} batch rows, "
        f"{done.batches:,} batches left empty, {done.images:,} uploaded images"
    )
    return 0
