"""``speceyes db upgrade``: bring the job store's schema up to date (and nothing else).

Every command that opens the store migrates it first anyway; this is for deployments
that run migrations as their own step (the ``migrate`` service of docker-compose.yml).
"""

from __future__ import annotations

import argparse
from typing import Any

from cli.options import add_store_flags, settings_from_args


def register(commands: Any) -> None:
    parser = commands.add_parser("db", help="job store schema (migrations)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    upgrade = actions.add_parser("upgrade", help="apply every pending migration")
    add_store_flags(upgrade)
    upgrade.set_defaults(run=run_upgrade)


def run_upgrade(args: argparse.Namespace) -> int:
    from sqlalchemy import text

    from common.store.db import open_store

    settings = settings_from_args(args)
    sessions = open_store(settings.database_url)
    with sessions() as session:
        revision = session.scalar(text("select version_num from alembic_version"))
    sessions.kw["bind"].dispose()
    print(f"job store at revision {revision}")
    return 0
