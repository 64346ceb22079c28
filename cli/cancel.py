"""``speceyes cancel BATCH|JOB``: stop a batch (or one job) of the job store; what has
finished is kept."""

from __future__ import annotations

import argparse
import json

from cli.options import add_store_flags, settings_from_args
from common.pipeline.cancel import cancel_batch, cancel_job
from common.store.db import open_store
from common.store.reads import find_batch, get_job, require_batch


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Cancel a batch (by name or id) or one job (by id). Jobs that wait are cancelled at "
        "once; running ones stop at the end of their step (a fast micro-batch finishes, an "
        "agent's trajectory stops before its next generation). What has finished is kept, "
        "counted and exported. Cancelling again changes nothing; `speceyes resume BATCH` "
        "takes a cancelled batch up again without redoing done work."
    )
    parser.add_argument("target", metavar="BATCH|JOB", help="a batch's name or id, or a job's id")
    parser.add_argument("--json", action="store_true", help="the counts as one JSON object")
    add_store_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    sessions = open_store(settings_from_args(args).database_url, create=False)
    with sessions.begin() as session:
        batch = find_batch(session, args.target)
        job = get_job(session, args.target) if batch is None else None
        if batch is None and job is None:
            require_batch(session, args.target)  # (the error, with the names it comes close to)
        if batch is not None:
            what, done = f"batch {batch.name} ({batch.id})", cancel_batch(session, batch.id)
        else:
            assert job is not None
            what, done = f"job {job.id}", cancel_job(session, job)
    if args.json:
        figures = {"cancelled": done.cancelled, "stopping": done.stopping, "kept": done.finished}
        print(json.dumps({"target": args.target, **figures}))
        return 0
    print(
        f"{what}: {done.cancelled} cancelled, {done.stopping} stopping at the end of their "
        f"step, {done.finished} finished before and kept"
    )
    return 0
