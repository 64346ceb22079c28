"""``speceyes export``: a batch's results to a file."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.options import add_store_flags, settings_from_args
from cli.output import say
from common.export import batch_rows, check_format, write_rows
from common.store.db import open_store
from common.store.reads import require_batch


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write one row per batch row: id, image, question, options, status, "
        "answer, answered_by (small / large), confidence, defer_reason, error."
    )
    parser.add_argument("batch", metavar="BATCH", help="batch id, or name (the newest of it)")
    parser.add_argument("--out", type=Path, required=True, help="FILE.jsonl or FILE.parquet")
    parser.add_argument(
        "--audit-disagreements",
        action="store_true",
        help="only the audited rows where the agent disagreed with the accepted answer",
    )
    add_store_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    check_format(args.out)
    sessions = open_store(settings_from_args(args).database_url, create=False)
    with sessions() as session:
        batch = require_batch(session, args.batch)
        rows = batch_rows(session, batch.id, audit_disagreements=args.audit_disagreements)
        count = write_rows(rows, args.out)
    say(f"wrote {count} rows of batch {batch.id} ({batch.name}) to {args.out}")
    return 0
