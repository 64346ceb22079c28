"""``speceyes audit``: the online audit's figures, and resuming after a drift alarm."""

from __future__ import annotations

import argparse

from sqlalchemy import select

from cli.options import add_store_flags, settings_from_args
from cli.output import say
from common.pipeline.audit import describe, figures
from common.store import audits
from common.store.db import open_store
from common.store.reads import require_batch
from common.store.tables import Batch


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "A share of accepted answers (--audit-rate, default 2%%) also runs "
        "through the agent; when they stop agreeing, a batch raises a drift alarm and the "
        "deployment acts as --on-drift says (warn, raise-tau, pause)."
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    status = actions.add_parser("status", help="agreement per batch, alarms, controls")
    status.add_argument("batches", nargs="*", metavar="BATCH", help="ids or names (all: none)")
    status.set_defaults(run=run_status)
    resume = actions.add_parser(
        "resume",
        help="after a drift alarm: accept again at the configured tau",
        description="Clear what an alarm set for the whole deployment (a raised tau, "
        "accepting paused). Batch alarms stay on record.",
    )
    resume.set_defaults(run=run_resume)
    for sub in (status, resume):
        add_store_flags(sub)


def run_status(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    sessions = open_store(settings.database_url, create=False)
    with sessions() as session:
        if args.batches:
            batches = [require_batch(session, name) for name in args.batches]
        else:
            batches = list(session.scalars(select(Batch).order_by(Batch.created_at)))
        for batch in batches:
            lines = describe(session, settings, batch) if batch is not None else []
            if batch is not None and lines:
                say(f"{batch.name} ({batch.id})")
                print("\n".join(lines))
        overall = figures(session, settings)
        print(f"overall      {overall.agreed} of {overall.audited} audited answers agree")
        controls = audits.controls(session)
    if controls:
        shown = ", ".join(f"{name} = {value}" for name, value in sorted(controls.items()))
        print(f"controls     {shown} (speceyes audit resume clears them)")
    return 0


def run_resume(args: argparse.Namespace) -> int:
    sessions = open_store(settings_from_args(args).database_url, create=False)
    with sessions.begin() as session:
        cleared = audits.clear_controls(session)
    print("accepting again at the configured tau" if cleared else "nothing to resume")
    return 0
