"""``speceyes batches``: the batches of a job store, newest first, with their counts."""

from __future__ import annotations

import argparse
import json

from cli.options import add_store_flags, settings_from_args
from cli.output import say
from common.contracts import JobStatus
from common.store.db import open_store
from common.store.listing import Window, batches_page
from common.store.tables import as_utc, iso_utc


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List the batches of the job store, newest first: name, id, when it was created, "
        "and its jobs by status. A batch's name (or id) is what export, report, calibrate "
        "and `jobs list` take."
    )
    parser.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    add_store_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    sessions = open_store(settings_from_args(args).database_url, create=False)
    with sessions() as session:
        lines, _ = batches_page(session, Window(None, everyone=True, limit=args.limit))
    if args.json:
        for line in lines:
            record = {
                "name": line.batch.name,
                "id": line.batch.id,
                "created_at": iso_utc(line.batch.created_at),
                "jobs": line.jobs,
                "by_status": dict(line.by_status),
            }
            print(json.dumps(record))
        return 0
    if not lines:
        print("no batches in this job store (speceyes annotate SOURCE makes one)")
        return 0
    width = max(12, *(len(line.batch.name) for line in lines))
    say(f"{'NAME':<{width}}  {'ID':<32}  {'CREATED (UTC)':<16}  JOBS  DONE  FAILED  UNFINISHED")
    for line in lines:
        done, failed = line.by_status[JobStatus.DONE], line.by_status[JobStatus.FAILED]
        created = as_utc(line.batch.created_at).strftime("%Y-%m-%d %H:%M UTC")
        say(
            f"{line.batch.name:<{width}}  {line.batch.id}  {created:<16}  {line.jobs:>4}  "
            f"{done:>4}  {failed:>6}  {line.unfinished:>10}"
        )
    return 0
