"""``speceyes db upgrade``: bring the job store's schema up to date (and nothing else).

Opening the store only checks its schema (a new database gets it; an older one is
refused): migrating a shared database is this command's job, run once per deployment
(the ``migrate`` service of docker-compose.yml), never a side effect of a worker
starting.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sqlalchemy.exc import OperationalError

from cli.options import add_store_flags, settings_from_args
from common.errors import ConfigurationError
from common.store.db import make_engine, migrate, schema_revision


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
