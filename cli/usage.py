"""``speceyes usage``: what the job store's jobs used, by day, tenant and stage."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta

from cli.options import add_store_flags, iso_moment, settings_from_args
from cli.output import say
from common.errors import InvalidInput
from common.store import usage
from common.store.db import open_store


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "What the jobs that finished in a window used, by day (UTC) and tenant: jobs, "
        "model seconds per phase (screen, speculate, gate, agent, sandbox; a batched "
        "call's time shared by its jobs, GPU-seconds on a GPU) and tokens. With "
        "SPECEYES_ACCOUNTING_PRICE_PER_GPU_HOUR set, their cost too. GET /v1/usage "
        "gives a tenant its own."
    )
    parser.add_argument(
        "--from", dest="start", type=iso_moment, help="ISO 8601 (default 7 days ago)"
    )
    parser.add_argument("--to", dest="end", type=iso_moment, help="ISO 8601, before (default now)")
    parser.add_argument("--tenant", help="one tenant's (default: every one; '' the CLI's)")
    parser.add_argument("--json", action="store_true", help="one JSON object per day and tenant")
    add_store_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    end = args.end or datetime.now(UTC)
    start = args.start or end - timedelta(days=7)
    if start >= end:
        raise InvalidInput("--from must be before --to")
    whose: str | object | None = usage.EVERY_TENANT
    if args.tenant is not None:
        whose = args.tenant or None
    sessions = open_store(settings.database_url, create=False)
    with sessions() as session:
        days = usage.by_day(session, whose, start, end)
    price = settings.accounting.price_per_gpu_hour
    shown = [day.to_dict(price) for day in days]
    if args.json:
        for record in shown:
            print(json.dumps(record))
        return 0
    if not shown:
        say(f"no jobs finished from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC")
        return 0
    phases = sorted({phase for record in shown for phase in record["seconds"]})
    header = ["DAY", "TENANT", "JOBS", *(f"{p.upper()} S" for p in phases), "TOTAL S"]
    header += ["TOKENS IN", "TOKENS OUT", *(["COST"] if price is not None else [])]
    rows = [
        [
            record["day"],
            record["tenant"] if record["tenant"] is not None else "(cli)",
            str(record["jobs"]),
            *(f"{record['seconds'].get(p, 0.0):.1f}" for p in phases),
            f"{record['total_s']:.1f}",
            str(record["tokens_in"]),
            str(record["tokens_out"]),
            *([f"{record['cost']:.4f}"] if price is not None else []),
        ]
        for record in shown
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        say("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    return 0
