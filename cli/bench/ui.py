"""``speceyes bench ui``: the review UI's pages over a large batch (``lab.bench.seeded_batch``
writes it, ``lab.bench.ui`` times them)."""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from api.app import create_app
from cli.options import settings_from_args
from common.errors import InvalidInput
from common.pipeline.dispatch import StoreOnly
from common.store.db import Store, open_store
from common.store.keys import create_key
from lab.bench import seeded_batch, ui

TARGET_MS = 300.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a batch of --jobs drawn jobs (done, failed, waiting; answers, trajectories, "
        "audits) into a job store, serve the API in this process, sign in to the review UI "
        "with a new admin key and time its pages: the batch's page, its results filtered "
        "and sorted, and the results' second page. Prints each page's server time (its "
        "Server-Timing header, else the wall time) on the first request and over "
        f"--repeats more. Target: a median under {TARGET_MS:.0f} ms."
    )
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in the batch (100000)")
    parser.add_argument("--repeats", type=int, default=5, help="requests per page (5)")
    parser.add_argument(
        "--db",
        metavar="URL",
        help="the job store to write the batch into, which keeps it (default: a scratch "
        "SQLite file, removed afterwards)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.jobs < 1 or args.repeats < 1:
        raise InvalidInput("--jobs and --repeats must be at least 1")
    with tempfile.TemporaryDirectory(prefix="speceyes-bench-ui-") as scratch:
        folder = Path(scratch)
        url = args.db or f"sqlite:///{folder / 'store.db'}"
        settings = settings_from_args(args, database_url=url, upload_dir=folder / "uploads")
        where = make_url(url).render_as_string(hide_password=True) if args.db else "scratch SQLite"
        print(
            f"review UI over a batch of {args.jobs:,} jobs in {where}; {os.cpu_count()} CPUs "
            f"({platform.machine()}, Python {platform.python_version()}), "
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        )
        sessions = open_store(url)
        try:
            app = create_app(settings, dispatcher=StoreOnly(), sessions=sessions)
            # https: a session cookie marked Secure is sent back too
            with TestClient(app, base_url="https://testserver") as client:
                return _bench(args, sessions, client, folder)
        finally:
            sessions.close()


def _bench(args: argparse.Namespace, sessions: Store, client: ui.Browser, folder: Path) -> int:
    with sessions.begin() as session:
        key, secret = create_key(session, "bench-ui", admin=True)
    started, cpu = time.perf_counter(), time.process_time()
    batch_id = seeded_batch.seed_batch(sessions, args.jobs, tenant=key.tenant, image_dir=folder)
    print(
        f"seeded batch {batch_id} in {time.perf_counter() - started:.1f} s "
        f"({time.process_time() - cpu:.1f} s CPU in this process)"
    )
    if not ui.sign_in(client, secret):
        print("no review UI here: /ui/signin answers 404 (nothing to time)")
        return 1
    paths = ui.page_paths(batch_id)
    timings = ui.measure(client, paths, args.repeats)
    second = ui.next_page(client, paths[1])
    if second is None:
        print(f'{paths[1]} links no next page (no rel="next" anchor): its second page untimed')
    else:
        timings += ui.measure(client, [second], args.repeats)
    _print_table(timings, batch_id)
    return 0


def _print_table(timings: list[ui.Timing], batch_id: str) -> None:
    print(f"{'page':<64} {'cold ms':>8} {'median ms':>10} {'max ms':>8}  under {TARGET_MS:.0f} ms")
    for timing in timings:
        page = timing.path.replace(batch_id, "{id}")
        page = page if len(page) <= 64 else page[:61] + "..."
        under = "yes" if timing.median_ms < TARGET_MS else "NO"
        print(
            f"{page:<64} {timing.cold_ms:>8.1f} {timing.median_ms:>10.1f} "
            f"{timing.max_ms:>8.1f}  {under}"
        )
    source = (
        "Server-Timing"
        if all(t.from_header for t in timings)
        else "wall time where no Server-Timing"
    )
    over = sum(timing.median_ms >= TARGET_MS for timing in timings)
    verdict = f"{over} of {len(timings)} pages over the target" if over else "all under the target"
    print(f"(server time: {source}; judged by the median of the warm requests) {verdict}")
