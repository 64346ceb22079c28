"""``speceyes bench scale``: each operation's cost as the store grows (``lab.bench.scale``)."""

from __future__ import annotations

import argparse
import os
import platform
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from fastapi.testclient import TestClient

from api.app import create_app
from cli.options import add_store_flags, settings_from_args
from common.config import Settings
from common.errors import InvalidInput
from common.pipeline.dispatch import Dispatcher, StoreOnly
from common.store.db import Store
from lab.bench import scale
from workers.queues import CeleryDispatcher

# (label, Figures attribute, format)
ROWS = [
    ("submit, ms/job", "submit_ms_per_job", "{:.3f}"),
    ("claim of 32, ms", "claim_ms", "{:.2f}"),
    ("record, ms/job", "record_ms_per_job", "{:.3f}"),
    ("reconciler tick, ms", "tick_ms", "{:.1f}"),
    ("review page, ms", "review_ms", "{:.1f}"),
    ("rows page half-way down, ms", "rows_ms", "{:.1f}"),
    ("batch page, ms", "batch_page_ms", "{:.1f}"),
    ("  its first request, ms", "batch_page_cold_ms", "{:.1f}"),
    ("  its overview made in, s", "overview_s", "{:.1f}"),
    ("  its overview, us/job (a pass)", "overview_us_per_job", "{:.1f}"),
    ("export, ms/job", "export_ms_per_job", "{:.4f}"),
    ("export process peak, MB", "export_peak_mb", "{:.0f}"),
    ("Redis bytes/queued job", "redis_bytes_per_job", "{:.1f}"),
    ("database bytes/job", "db_bytes_per_job", "{:.0f}"),
]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Grow one scratch store through --jobs sizes (one batch, half answered, half "
        "queued with their messages; written by SQL at zero model cost) and, at each, time "
        "a corpus submitted, a claim of 32, their answers recorded, a reconciler tick, a "
        "review page, a rows page half-way down the cursor and the batch's export; print "
        "Redis's and the database's bytes per job, and each figure's ratio between the "
        "largest size and the smallest (target: at most 1.5 on PostgreSQL). With --db "
        "PostgreSQL a scratch database beside it (dropped afterwards) and the broker of "
        "--broker / SPECEYES_BROKER_URL under a scratch key prefix (removed afterwards); "
        "else a scratch SQLite file and no broker (the embedded store)."
    )
    parser.add_argument(
        "--jobs",
        default="10000,100000,1000000",
        help="the sizes, comma-separated, growing (10000,100000,1000000)",
    )
    parser.add_argument("--broker", metavar="URL", help="Redis for the broker's figures")
    add_store_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        sizes = [int(part.replace("_", "")) for part in args.jobs.split(",")]
    except ValueError:
        raise InvalidInput(f"--jobs takes sizes such as 10000,100000: not {args.jobs!r}") from None
    if not sizes or sizes != sorted(set(sizes)) or sizes[0] < 100:
        raise InvalidInput("--jobs: growing sizes of at least 100, each once")
    settings = settings_from_args(args)
    url = settings.database_url or ""
    postgres = url.startswith("postgresql")
    broker = args.broker or settings.broker.url
    dispatcher_for: Callable[[Settings], Dispatcher] | None = None
    if postgres and broker:
        prefix = f"bench-scale-{uuid.uuid4().hex[:8]}:"  # (its keys removed afterwards)
        settings = settings.replace(broker_url=broker, broker_key_prefix=prefix)
        dispatcher_for = CeleryDispatcher

    where = "PostgreSQL" + (" and Redis" if dispatcher_for else "") if postgres else "SQLite"
    print(
        f"bench scale on {where}: {', '.join(f'{s:,}' for s in sizes)} jobs; "
        f"{os.cpu_count()} CPUs ({platform.machine()}), {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    )
    results = scale.measure(sizes, url if postgres else None, settings, _serve, dispatcher_for)
    _print(results)
    return 0


@contextmanager
def _serve(sessions: Store, settings: Settings) -> Iterator[TestClient]:
    """The app over ``sessions``, in this process (https: its session cookie is Secure)."""
    app = create_app(settings, dispatcher=StoreOnly(), sessions=sessions)
    with TestClient(app, base_url="https://testserver") as client:
        yield client


def _print(results: list[scale.Figures]) -> None:
    head = "".join(f"{f.jobs:>14,}" for f in results)
    print(f"{'per job or operation':<32}{head}{'ratio':>8}")
    for label, name, form in ROWS:
        values = [getattr(f, name) for f in results]
        if any(value is None for value in values):
            continue
        cells = "".join(f"{form.format(value):>14}" for value in values)
        ratio = values[-1] / values[0] if values[0] else float("nan")
        print(f"{label:<32}{cells}{ratio:>8.2f}")
    found = [f.stranded_found for f in results if f.stranded_found is not None]
    if found:
        print(f"a stranded job sent again by the next tick at every size: {all(found)}")
