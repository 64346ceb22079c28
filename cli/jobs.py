"""``speceyes jobs``: a batch's jobs (``list``), or one job, trajectory included (``show``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cli.options import add_store_flags, settings_from_args
from cli.output import say
from common.contracts import JobStatus
from common.errors import InvalidInput
from common.store.db import open_store
from common.store.listing import Window, jobs_page
from common.store.reads import batch_results, get_job, require_batch
from common.store.tables import iso_utc

FIELDS = (
    "id",
    "status",
    "answered_by",
    "final_answer",
    "question",
    "options",
    "image_path",
    "screen_needs_tools",
    "screen_text",
    "small_answer",
    "confidence",
    "gate",
    "defer_reason",
    "error_code",
    "error_message",
    "attempts",
    "created_at",
    "fast_started_at",
    "gated_at",
    "agent_started_at",
    "finished_at",
    "audit_answer",
    "audit_agrees",
    "reviewed_answer",
    "reviewer",
    "reviewed_at",
)


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show",
        help="one job with its trajectory",
        description="Print one job: every "
        "phase's result, timestamps, and the agent's trajectory step by step.",
    )
    show.add_argument("job_id", metavar="ID")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    add_store_flags(show)
    show.set_defaults(run=run_show)
    listing = actions.add_parser(
        "list",
        help="a batch's jobs (row id, job id, status, why it failed), or the newest jobs",
        description="List a batch's jobs in row order: the row's id (a folder's file path, "
        "or the manifest's id), the job id (for `jobs show`), its status, who answered and "
        "the answer, or the error code and reason. `--status failed` lists what failed. "
        "Without BATCH: the store's newest jobs, sent one by one or in batches (as GET "
        "/v1/jobs lists them), 50 unless --limit says otherwise.",
    )
    listing.add_argument(
        "batch", metavar="BATCH", nargs="?", help="batch id, or name (the newest of it)"
    )
    listing.add_argument(
        "--status", choices=[status.value for status in JobStatus], help="only jobs in this status"
    )
    listing.add_argument("--limit", type=int, help="at most this many rows")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    add_store_flags(listing)
    listing.set_defaults(run=run_list)


def run_list(args: argparse.Namespace) -> int:
    sessions = open_store(settings_from_args(args).database_url, create=False)
    if args.batch is None:
        return _newest(sessions, args)
    shown = 0
    with sessions() as session:
        batch = require_batch(session, args.batch)
        for item, job in batch_results(session, batch.id, status=args.status):
            if args.limit is not None and shown >= args.limit:
                break
            record = {
                "id": item.item_id,
                "job_id": job.id,
                "status": job.status,
                "answered_by": job.answered_by,
                "answer": job.final_answer,
                "error_code": job.error_code,
                "error": job.error_message,
            }
            if args.json:
                print(json.dumps(record, ensure_ascii=False))
            elif job.status == JobStatus.FAILED:
                say(f"{item.item_id}  {job.id}  failed  {job.error_code}: {job.error_message}")
            else:
                answer = f"  {job.answered_by}: {job.final_answer}" if job.final_answer else ""
                say(f"{item.item_id}  {job.id}  {job.status}{answer}")
            shown += 1
    if not shown and not args.json:
        which = f" {args.status}" if args.status else ""
        say(f"no{which} jobs in batch {batch.id} ({batch.name})")
    return 0


def _newest(sessions: Any, args: argparse.Namespace) -> int:
    """The store's newest jobs, whatever their batch (the store function GET /v1/jobs
    reads): job id, when it was made, status, and the answer or the error."""
    window = Window(None, everyone=True, limit=args.limit or 50)
    with sessions() as session:
        jobs, _ = jobs_page(session, window, status=args.status)
    for job in jobs:
        if args.json:
            record = {
                "job_id": job.id,
                "created_at": iso_utc(job.created_at),
                "status": job.status,
                "answered_by": job.answered_by,
                "answer": job.final_answer,
                "error_code": job.error_code,
                "error": job.error_message,
            }
            print(json.dumps(record, ensure_ascii=False))
        elif job.status == JobStatus.FAILED:
            made = iso_utc(job.created_at)
            say(f"{job.id}  {made}  failed  {job.error_code}: {job.error_message}")
        else:
            answer = f"  {job.answered_by}: {job.final_answer}" if job.final_answer else ""
            say(f"{job.id}  {iso_utc(job.created_at)}  {job.status}{answer}")
    if not jobs and not args.json:
        say(f"no{f' {args.status}' if args.status else ''} jobs in this job store")
    return 0


def run_show(args: argparse.Namespace) -> int:
    sessions = open_store(settings_from_args(args).database_url, create=False)
    with sessions() as session:
        job = get_job(session, args.job_id)
        if job is None:
            raise InvalidInput(f"no job {args.job_id!r} in this job store")
        record = {name: getattr(job, name) for name in FIELDS}
        trajectory = job.trajectory
    if args.json:
        print(json.dumps({**record, "trajectory": trajectory}, default=str, indent=2))
        return 0
    for name, value in record.items():
        if value is not None:
            say(f"{name:<19} {value}")
    for step in (trajectory or {}).get("steps", []):
        say(
            f"--- step {step['index'] + 1} ({step['finish_reason']}, "
            f"{step['new_tokens']} tokens, {step['generate_seconds']:.2f} s)"
        )
        say(step["text"])
        if step.get("box_original"):
            say(f"    zoom {step['box_model']} (model view) -> {step['box_original']} (original)")
        if step.get("code") is not None:
            say(f"    code ran in the sandbox ({_sandbox_use(step)})")
            if step.get("code_output"):
                say("    printed: " + step["code_output"][:500].replace("\n", "\n             "))
            for image in step.get("images") or []:
                say(f"    image {image['width']}x{image['height']} ({image['pixels_sha256']})")
        if step.get("observation"):
            say(f"    -> {step['observation']}")
    return 0


def _sandbox_use(step: dict[str, Any]) -> str:
    said = f"{step['tool_seconds']:.2f} s"
    if step.get("sandbox_cpu_s") is not None:
        said += f", {step['sandbox_cpu_s']:.2f} CPU s, {step['sandbox_peak_mb']:.0f} MB"
    if step.get("sandbox_stop"):
        said += f", stopped: {step['sandbox_stop']}"
    return said
