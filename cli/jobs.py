"""``speceyes jobs``: look at one job, trajectory included."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cli.options import add_store_flags, settings_from_args
from common.errors import InvalidInput

FIELDS = (
    "id", "status", "answered_by", "final_answer", "question", "options", "image_path",
    "screen_needs_tools", "screen_text", "small_answer", "confidence", "gate", "defer_reason",
    "error_code", "error_message", "attempts", "created_at", "fast_started_at", "gated_at",
    "agent_started_at", "finished_at",
)  # fmt: skip


def register(commands: Any) -> None:
    parser = commands.add_parser("jobs", help="look at jobs")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show", help="one job with its trajectory", description="Print one job: every "
        "phase's result, timestamps, and the agent's trajectory step by step."
    )  # fmt: skip
    show.add_argument("job_id", metavar="ID")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    add_store_flags(show)
    show.set_defaults(run=run_show)


def run_show(args: argparse.Namespace) -> int:
    from common.store.db import open_store
    from common.store.reads import get_job

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
            print(f"{name:<19} {value}")
    for step in (trajectory or {}).get("steps", []):
        print(
            f"--- step {step['index'] + 1} ({step['finish_reason']}, "
            f"{step['new_tokens']} tokens, {step['generate_seconds']:.2f} s)"
        )
        print(step["text"])
        if step.get("box_original"):
            print(f"    zoom {step['box_model']} (model view) -> {step['box_original']} (original)")
        if step.get("code") is not None:
            stopped = f", stopped: {step['sandbox_stop']}" if step.get("sandbox_stop") else ""
            print(f"    code ran in the sandbox ({step['tool_seconds']:.2f} s{stopped})")
            if step.get("code_output"):
                print("    printed: " + step["code_output"][:500].replace("\n", "\n             "))
            for image in step.get("images") or []:
                print(f"    image {image['width']}x{image['height']} ({image['pixels_sha256']})")
        if step.get("observation"):
            print(f"    -> {step['observation']}")
    return 0
