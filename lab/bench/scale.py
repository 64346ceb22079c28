"""``speceyes bench scale``: what each operation costs as the store grows (issue 49).

One store is grown through the sizes asked (10,000 jobs, then 100,000, then 1,000,000),
at zero model cost: the jobs are written straight into the tables by SQL (one batch, a
row each; half of them answered, half queued, the queued ones with their messages on
the broker, 32 ids a message as the fast stage packs them), and the planner's
statistics refreshed, as a live database's upkeep does. At each size, per job or per
operation:

- **submit**: a corpus of ``SUBMIT_ROWS`` new rows (tiny PNGs in a Parquet table) through
  ``submit_corpus``, as ``annotate`` sends it;
- **claim**: a fast worker's claim of the 32 most urgent waiting jobs;
- **record**: those 32 answers recorded (accepted by the gate);
- **tick**: one reconciler sweep over the whole backlog, and whether a job stranded in
  it (its message lost) is sent again by that one sweep;
- **review page** and **deep rows page**: the review UI's results and the API's
  ``rows`` page half-way down the batch's cursor, through the app in this process; and
  the batch's own page, whose counts read the whole batch (shown, not held flat);
- **export**: the whole batch as JSON lines, in a process of its own (its peak memory);
- **bytes**: Redis per queued job, and the database per job.
"""

from __future__ import annotations

import multiprocessing
import resource
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import DateTime, bindparam, select, text
from sqlalchemy.orm import Session

from common.config import GateSettings, Settings
from common.contracts import Accepted, Queue, Stage
from common.pipeline.dispatch import Dispatcher, StoreOnly
from common.pipeline.reconcile import Reconciler
from common.pipeline.submit import submit_corpus
from common.sources.corpus import open_source
from common.store import claims, export
from common.store.db import Store, is_postgres, open_store
from common.store.keys import create_key
from common.store.tables import Job
from lab.bench import ui
from lab.bench.scratch import scratch_store
from lab.bench.submission import write_table

SUBMIT_ROWS = 1_000
CLAIM = 32  # a fast micro-batch
GROW_CHUNK = 100_000  # rows per INSERT ... SELECT
REPEATS = 5
OVERVIEW_DEADLINE_S = 600.0


@dataclass
class Figures:
    """One size's figures; milliseconds unless named otherwise."""

    jobs: int
    submit_ms_per_job: float = 0.0
    claim_ms: float = 0.0
    record_ms_per_job: float = 0.0
    tick_ms: float | None = None  # (no broker: no reconciler)
    stranded_found: bool | None = None
    review_ms: float = 0.0
    rows_ms: float = 0.0
    # the batch's own page, its first request, and the seconds until it shows the
    # overview (a pass over the batch's rows, made by a thread of the server for a large
    # batch, then kept until a job of it changes)
    batch_page_ms: float = 0.0
    batch_page_cold_ms: float = 0.0
    overview_s: float = 0.0
    export_ms_per_job: float = 0.0
    export_peak_mb: float = 0.0  # the exporting process's peak resident memory
    redis_bytes_per_job: float | None = None
    db_bytes_per_job: float = 0.0

    @property
    def overview_us_per_job(self) -> float:
        """The overview's making per job of the batch: a pass over its rows, made once
        per change of the batch (not per request), flat per job as a pass is."""
        return self.overview_s * 1e6 / self.jobs if self.jobs else 0.0


# One job per number g: even ones queued (their message sent), odd ones answered.
_SERIES = {
    "postgresql": (
        "",
        "generate_series(CAST(:lo AS integer), CAST(:hi AS integer)) AS s(g)",
        "lpad(g::text, 32, '0')",
    ),
    "sqlite": (
        "WITH RECURSIVE s(g) AS (SELECT :lo UNION ALL SELECT g + 1 FROM s WHERE g < :hi) ",
        "s",
        "printf('%032d', g)",
    ),
}
_JOBS = """{with}INSERT INTO jobs (id, idempotency_key, image_path, question, status, stage,
    priority, attempts, answered_by, final_answer, confidence, announces, tenant,
    created_at, fast_started_at, gated_at, finished_at, sent_at)
SELECT {id}, 'k' || g, '/bench/' || g || '.png', 'What is in the image?',
    CASE WHEN g % 2 = 0 THEN 'queued' ELSE 'done' END, 'fast', 1, 0,
    CASE WHEN g % 2 = 0 THEN NULL ELSE 'small' END,
    CASE WHEN g % 2 = 0 THEN NULL ELSE 'A' END,
    CASE WHEN g % 2 = 0 THEN NULL ELSE (g % 1000) / 1000.0 END, :no, :tenant,
    :now, :now, :now, CASE WHEN g % 2 = 0 THEN NULL ELSE :now END, :now
FROM {series}"""
_ITEMS = """{with}INSERT INTO batch_items (batch_id, position, item_id, expected, split, job_id)
SELECT :batch, g, 'r' || g, 'A', 'synth', {id} FROM {series}"""


# the app over a store, served in this process: a client of it (``lab.bench.ui.Browser``)
Serve = Callable[[Store, Settings], AbstractContextManager[Any]]


def measure(
    sizes: list[int],
    database_url: str | None,
    settings: Settings,
    serve: Serve,
    dispatcher_for: Callable[[Settings], Dispatcher] | None,
    on_line: Callable[[str], None] = print,
) -> list[Figures]:
    """Grow one scratch store through ``sizes`` and measure at each, the pages through
    ``serve``; with ``dispatcher_for`` (PostgreSQL and Redis), the broker's figures too."""
    with scratch_store(database_url) as url, tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        local = settings.replace(database_url=url, upload_dir=folder)
        sessions = open_store(url)
        dispatcher = dispatcher_for(local) if dispatcher_for else StoreOnly()
        try:
            return _grow_and_measure(sessions, dispatcher, local, sizes, folder, serve, on_line)
        finally:
            if hasattr(dispatcher, "delete_keys"):
                dispatcher.delete_keys()
            dispatcher.close()
            sessions.close()


def _grow_and_measure(
    sessions: Store,
    dispatcher: Dispatcher,
    settings: Settings,
    sizes: list[int],
    folder: Path,
    serve: Serve,
    on_line: Callable[[str], None],
) -> list[Figures]:
    with sessions.begin() as session:
        key, secret = create_key(session, "bench-scale", admin=True)
    batch_id = new_batch(sessions, key.tenant)
    results, have = [], 0
    with serve(sessions, settings) as client:
        ui.sign_in(client, secret)
        headers = {"Authorization": f"Bearer {secret}"}
        for size in sizes:
            started = time.perf_counter()
            grow(sessions, dispatcher, batch_id, key.tenant, have, size)
            have = size
            on_line(f"grown to {size:,} jobs in {time.perf_counter() - started:.0f} s")
            figures = Figures(size)
            _submit(figures, sessions, dispatcher, settings, folder, size)
            _claim_and_record(figures, sessions)
            _tick(figures, sessions, dispatcher, settings)
            review = f"/ui/batches/{batch_id}/results"
            figures.review_ms = ui.measure(client, [review], REPEATS)[0].median_ms
            _batch_page(figures, client, f"/ui/batches/{batch_id}")
            deep = f"/v1/batches/{batch_id}/rows?after=p{size // 2}"
            figures.rows_ms = _median_ms(partial(_get, client, deep, headers))
            _export(figures, settings.database_url, batch_id, folder)
            _bytes(figures, sessions, dispatcher, size)
            results.append(figures)
            on_line(f"measured at {size:,} jobs")
    return results


def new_batch(sessions: Store, tenant: str | None) -> str:
    """An empty batch of ``tenant``'s for ``grow``; its id."""
    batch_id = uuid.uuid4().hex
    with sessions.begin() as session:
        session.execute(
            text(
                "INSERT INTO batches (id, key, name, source, config, created_at, tenant) "
                "VALUES (:id, :id, 'bench-scale', 'bench', '{}', :now, :tenant)"
            ).bindparams(bindparam("now", type_=DateTime(timezone=True))),
            {"id": batch_id, "now": datetime.now(UTC), "tenant": tenant},
        )
    return batch_id


def grow(
    sessions: Store,
    dispatcher: Dispatcher,
    batch_id: str,
    tenant: str | None,
    have: int,
    want: int,
) -> None:
    """Add jobs ``have``..``want`` - 1 to the batch (even numbers queued, odd answered),
    send the queued ones' messages, and refresh the planner's statistics."""
    with sessions() as session:
        dialect = "postgresql" if is_postgres(session) else "sqlite"
    prefix, series, ident = _SERIES[dialect]
    now = bindparam("now", type_=DateTime(timezone=True))
    jobs = text(_JOBS.format(**{"with": prefix, "series": series, "id": ident}))
    items = text(_ITEMS.format(**{"with": prefix, "series": series, "id": ident}))
    for lo in range(have, want, GROW_CHUNK):
        hi = min(want, lo + GROW_CHUNK) - 1
        values = {"lo": lo, "hi": hi, "no": False, "tenant": tenant, "now": datetime.now(UTC)}
        with sessions.begin() as session:
            session.execute(jobs.bindparams(now), values)
            session.execute(items, {"lo": lo, "hi": hi, "batch": batch_id})
        queued = [f"{g:032d}" for g in range(lo + lo % 2, hi + 1, 2)]
        dispatcher.send_fast(queued)
    with sessions.begin() as session:
        session.execute(text("ANALYZE"))


def _batch_page(figures: Figures, client: Any, path: str) -> None:
    started = time.perf_counter()
    figures.batch_page_cold_ms = ui.measure(client, [path], 1)[0].cold_ms
    deadline = started + OVERVIEW_DEADLINE_S
    while "overview-pending" in client.get(path).text:  # (made meanwhile: polled)
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{path} showed no overview in {OVERVIEW_DEADLINE_S:.0f} s")
        time.sleep(0.5)
    figures.overview_s = time.perf_counter() - started
    figures.batch_page_ms = ui.measure(client, [path], REPEATS)[0].median_ms


def _median_ms(step: Callable[[], Any], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _get(client: Any, path: str, headers: dict[str, str]) -> None:
    response = client.get(path, headers=headers)
    if response.status_code != 200:
        raise RuntimeError(f"GET {path} answered {response.status_code}: {response.text[:300]}")


def _submit(
    figures: Figures,
    sessions: Store,
    dispatcher: Dispatcher,
    settings: Settings,
    folder: Path,
    size: int,
) -> None:
    table = write_table(folder / f"submit-{size}.parquet", SUBMIT_ROWS, start=size)
    corpus = open_source(str(table), settings=settings)
    started = time.perf_counter()
    submit_corpus(
        sessions,
        corpus.rows,
        source=corpus.location,
        name=f"submit-{size}",
        settings=settings,
        dispatcher=dispatcher,
    )
    figures.submit_ms_per_job = (time.perf_counter() - started) * 1000 / SUBMIT_ROWS


def _claim_and_record(figures: Figures, sessions: Store) -> None:
    claim_ms, record_ms = [], []
    for _ in range(REPEATS):
        started = time.perf_counter()
        with sessions.begin() as session:
            tickets = claims.claim(session, Stage.FAST, CLAIM)
        claim_ms.append((time.perf_counter() - started) * 1000)
        outcomes = [Accepted(t.job_id, "A", 0.95, [0.95], None) for t in tickets]
        started = time.perf_counter()
        with sessions.begin() as session:
            claims.record_fast(session, outcomes, GateSettings())
        record_ms.append((time.perf_counter() - started) * 1000 / max(1, len(outcomes)))
    figures.claim_ms = statistics.median(claim_ms)
    figures.record_ms_per_job = statistics.median(record_ms)


def _tick(figures: Figures, sessions: Store, dispatcher: Dispatcher, settings: Settings) -> None:
    """A reconciler sweep's time over the backlog, and one job stranded in it (queued
    two minutes before the queue's oldest message, its message lost) sent again by the
    first sweep after."""
    if dispatcher.backlog() is None:
        return
    reconciler = Reconciler(sessions, dispatcher, settings, "bench-scale")  # (one holder)
    figures.tick_ms = _median_ms(reconciler.sweep)
    # lost two minutes before the oldest message of its queue went out (the grown ones: a
    # big store grows for minutes) or before now, where none waits
    backlog = dispatcher.backlog()
    assert backlog is not None
    oldest = backlog.oldest.get((Queue.FAST, 1)) or time.time()
    stranded = uuid.uuid4().hex
    lost_at = datetime.fromtimestamp(oldest, UTC) - timedelta(minutes=2)
    gone = bindparam("gone", type_=DateTime(timezone=True))
    with sessions.begin() as session:
        session.execute(
            text(
                "INSERT INTO jobs (id, idempotency_key, question, status, stage, priority, "
                "attempts, announces, created_at, sent_at) VALUES (:id, :id, 'lost', "
                "'queued', 'fast', 1, 0, :no, :gone, :gone)"
            ).bindparams(gone),
            {"id": stranded, "no": False, "gone": lost_at},
        )
    reconciler.sweep()
    with sessions() as session:  # (this job, sent again: stamped anew)
        stamp = session.scalar(select(Job.sent_at).where(Job.id == stranded))
    figures.stranded_found = stamp is not None and stamp > lost_at


def _export(figures: Figures, url: str, batch_id: str, folder: Path) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        rows, seconds, peak_mb = pool.apply(_export_alone, (url, batch_id, str(folder)))
    figures.export_ms_per_job = seconds * 1000 / max(1, rows)
    figures.export_peak_mb = peak_mb


def _export_alone(url: str, batch_id: str, folder: str) -> tuple[int, float, float]:
    sessions = open_store(url)
    target = Path(folder) / f"export-{batch_id}.jsonl"
    started = time.perf_counter()
    with sessions() as session:
        rows = export.write_rows(export.batch_rows(session, batch_id), target)
    seconds = time.perf_counter() - started
    target.unlink()
    sessions.close()
    return rows, seconds, _peak_mb()


def _peak_mb() -> float:
    """This process's peak resident memory, imports included: VmHWM, which starts anew
    at exec (``ru_maxrss`` keeps the parent's peak across a spawn's fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (no /proc)


def _bytes(figures: Figures, sessions: Store, dispatcher: Dispatcher, size: int) -> None:
    with sessions() as session:
        figures.db_bytes_per_job = _database_bytes(session) / size
    list_bytes = getattr(dispatcher, "list_bytes", None)  # (a broker's: Redis)
    if list_bytes is not None:
        with sessions() as session:
            queued = session.scalar(text("SELECT count(*) FROM jobs WHERE status = 'queued'"))
        used = list_bytes(dispatcher.settings.broker.fast_queue)  # type: ignore[attr-defined]
        figures.redis_bytes_per_job = used / max(1, queued or 0)


def _database_bytes(session: Session) -> float:
    if is_postgres(session):
        sizes = "pg_total_relation_size('jobs') + pg_total_relation_size('batch_items')"
        return float(session.scalar(text(f"SELECT {sizes}")) or 0)
    pages = session.scalar(text("PRAGMA page_count")) or 0
    return float(pages * (session.scalar(text("PRAGMA page_size")) or 0))
