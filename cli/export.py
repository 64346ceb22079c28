"""``speceyes export``: a batch's results to a file."""

from __future__ import annotations

import argparse

from cli.options import add_settings, add_store_flags, settings_from_args
from cli.output import say
from common.store.db import open_store
from common.store.export import batch_rows, check_output, export, parts_of
from common.store.reads import require_batch


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write one row per batch row: id, image, question, options, status, "
        "answer, answered_by (small / large), confidence, defer_reason, error."
    )
    parser.add_argument("batch", metavar="BATCH", help="batch id, or name (the newest of it)")
    parser.add_argument(
        "--out",
        required=True,
        metavar="TARGET",
        help="FILE.jsonl, FILE.parquet, or DIR/ (or s3://bucket/prefix/): Parquet parts of "
        "--shard-rows rows; a URL is written through fsspec",
    )
    add_settings(parser, "sources.export_shard_rows")
    parser.add_argument(
        "--audit-disagreements",
        action="store_true",
        help="only the audited rows where the agent disagreed with the accepted answer",
    )
    add_store_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    output = check_output(args.out)
    settings = settings_from_args(args)
    sessions = open_store(settings.database_url, create=False)
    with sessions() as session:
        batch = require_batch(session, args.batch)
        rows = batch_rows(session, batch.id, audit_disagreements=args.audit_disagreements)
        count, files = export(rows, output, settings.sources.export_shard_rows, batch.id)
    where = f"{parts_of(files)} under {args.out}" if output.layout == "parquet" else args.out
    say(f"wrote {count} rows of batch {batch.id} ({batch.name}) to {where}")
    return 0
