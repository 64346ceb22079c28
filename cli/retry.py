"""``speceyes retry BATCH`` and ``speceyes resume BATCH``: run a batch's failed or
cancelled jobs again, under the same batch, and follow them to their end (here, or on
the workers, as ``annotate`` does)."""

from __future__ import annotations

import argparse

from cli.compose import make_dispatcher
from cli.follow import follow, print_summary, say_line
from cli.options import add_pipeline_flags, require_shared_store, settings_from_args
from common.pipeline.cancel import Requeued, resume_batch, retry_batch
from common.store.db import open_store
from common.store.reads import require_batch


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run a batch's failed and cancelled jobs again, under the same batch (its done "
        "jobs are kept as they are), and follow them to the end: here, or on the workers "
        "with --broker. --reason CODE takes only the jobs that failed (or were cancelled) "
        "with that code: `speceyes jobs list BATCH --status failed` shows the codes."
    )
    _arguments(parser)
    parser.add_argument("--reason", metavar="CODE", help="only the jobs with this error code")
    parser.set_defaults(run=run, requeue="retry")


def configure_resume(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Take a cancelled batch up again: its cancelled jobs wait for the stage they "
        "stopped in, and run (here, or on the workers with --broker). Done work is not "
        "redone; failed jobs stay failed (speceyes retry runs those)."
    )
    _arguments(parser)
    parser.set_defaults(run=run, requeue="resume", reason=None)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("batch", metavar="BATCH", help="the batch's name or id")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_pipeline_flags(parser)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    require_shared_store(settings)
    sessions = open_store(settings.database_url, create=False)
    with sessions() as session:
        batch = require_batch(session, args.batch)
        name, batch_id = batch.name, batch.id
    dispatcher = make_dispatcher(settings, sessions, say=say_line)
    try:
        dispatcher.check()
        if args.requeue == "resume":
            requeued: Requeued = resume_batch(sessions, dispatcher, batch_id)
        else:
            requeued = retry_batch(sessions, dispatcher, batch_id, args.reason)
        print(f"batch {name} ({batch_id}): {len(requeued.job_ids)} jobs run again")
        result = follow(dispatcher, sessions, batch_id, args.no_progress)
    finally:
        dispatcher.close()
    print_summary(result, name)
    if result.interrupted:
        return 130
    return 1 if result.counts.failures or result.counts.cancellations else 0
