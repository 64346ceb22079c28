"""``speceyes bench pipeline``: the distributed pipeline end to end, timed.

Starts its own workers (``speceyes worker fast|slow`` subprocesses, scripted backend) on
a scratch PostgreSQL database and a scratch Redis key prefix, submits jobs in chunks
(each committed, then enqueued; the first is one fast batch, so the fast pool starts
while the rest is written, as a client streaming a corpus in would), and reads the figures
from the job store: jobs/s from the first submit to the last result, and the
submit-to-done latency of every job. ``--rate`` offers the jobs at a steady rate instead.

Where the pipeline's own time goes (``Overhead``): the submitter's seconds writing rows
and sending messages, and following the store (result reads), are timed here; the
workers' claims, records and sends come from their ``/metrics``
(``speceyes_stage_seconds``), read before they stop. The scratch database and keys are
removed afterwards.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from common.backends.scripted import ScriptedSettings
from common.config import Settings
from common.errors import ConfigurationError
from common.images import content_hash
from common.pipeline.dispatch import Dispatcher
from common.pipeline.follow import Watch, follow_store
from common.store import analytics, new_jobs, reads, submission
from common.store.db import open_store
from common.store.tables import BatchItem, Job
from lab.bench.embedded import EmbeddedFigures
from lab.bench.schedule import run_draws
from lab.bench.scratch import scratch_database
from lab.ports import free_port
from workers.queues import CeleryDispatcher

Log = Callable[[str], None]


# The workers' phases that are the pipeline's own (the rest is models and decoding).
OWN_PHASES = ("claim", "record", "send")


@dataclass(frozen=True)
class Overhead:
    """Seconds spent on the pipeline itself, summed over the processes that spent them
    (so they add up past the wall time where processes overlap)."""

    submit_rows_s: float = 0.0  # the submitter: writing jobs (chunks, each one transaction)
    submit_send_s: float = 0.0  # the submitter: sending them, after each commit
    worker_s: dict[str, float] = field(default_factory=dict)  # phase -> seconds, all workers
    worker_cpu_s: float = 0.0  # the workers' processes' CPU from the first submit on
    read_s: float = 0.0  # following the store until the last result (a client's reads)

    def rows(self) -> list[tuple[str, float]]:
        """(what, seconds) in the order they are printed."""
        phases = self.worker_s
        return [
            ("submission: rows", self.submit_rows_s),
            ("submission: messages", self.submit_send_s),
            ("claims", phases.get("claim", 0.0)),
            ("records", phases.get("record", 0.0)),
            ("sends on to the slow queue", phases.get("send", 0.0)),
            ("result reads", self.read_s),
            ("models and decoding", sum(s for p, s in phases.items() if p not in OWN_PHASES)),
        ]


@dataclass(frozen=True)
class PipelineFigures(EmbeddedFigures):
    """``seconds`` run from the first submit to the last result."""

    p50_s: float = 0.0  # submit-to-done latency
    p99_s: float = 0.0
    overhead: Overhead = field(default_factory=Overhead)


@dataclass(frozen=True)
class PipelinePlan:
    jobs: int
    fast_workers: int = 1
    slow_workers: int = 1
    chunk: int = 500  # jobs per submit transaction (then enqueued); the first: one batch
    worker_env: dict[str, str] | None = None  # SPECEYES_* for the workers (costs, shares)
    rate: float | None = None  # jobs/s offered, one job a transaction (None: all at once)


def bench_pipeline(settings: Settings, plan: PipelinePlan, log: Log = print) -> PipelineFigures:
    """Run ``plan.jobs`` scripted jobs through fresh workers; figures from the store."""
    if not settings.broker.url:
        raise ConfigurationError("bench pipeline needs a broker: --broker redis://HOST:6379/0")
    with (
        scratch_database(settings.database_url) as database_url,
        tempfile.TemporaryDirectory(prefix="speceyes-bench-") as scratch,
    ):
        tag = uuid.uuid4().hex[:10]
        env = {
            "SPECEYES_BACKEND": "scripted",
            "SPECEYES_DATABASE_URL": database_url,
            "SPECEYES_BROKER_URL": settings.broker.url,
            "SPECEYES_BROKER_KEY_PREFIX": f"speceyes-bench-{tag}:",
            "SPECEYES_FAST_QUEUE": f"bench-fast-{tag}",
            "SPECEYES_SLOW_QUEUE": f"bench-slow-{tag}",
            "SPECEYES_FAST_BATCH_SIZE": str(settings.funnel.fast_batch_size),
            "SPECEYES_AUDIT_RATE": "0",  # the funnel's own speed
            **(plan.worker_env or {}),
        }
        mine = settings.replace(
            database_url=database_url,
            broker_key_prefix=env["SPECEYES_BROKER_KEY_PREFIX"],
            fast_queue=env["SPECEYES_FAST_QUEUE"],
            slow_queue=env["SPECEYES_SLOW_QUEUE"],
        )
        sessions = open_store(database_url)
        dispatcher = CeleryDispatcher(mine)
        try:
            with workers(plan, env, Path(scratch), log) as ports:
                _, cpu_at_start_s = scrape(ports)  # (their start: imports, models)
                if plan.rate:
                    log(f"submitting {plan.jobs} jobs at {plan.rate:g} jobs/s")
                    spans = [range(i, i + 1) for i in range(plan.jobs)]
                else:
                    log(f"submitting {plan.jobs} jobs in chunks of {plan.chunk}")
                    spans = chunk_spans(plan.jobs, settings.funnel.fast_batch_size, plan.chunk)
                submitted = submit_synthetic(
                    sessions, dispatcher, spans, Path(scratch), rate=plan.rate
                )
                result = follow_store(
                    sessions, submitted.batch_id, Watch(on_stall=_stalled), poll_s=0.25, stall_s=60
                )
                if result.counts.finished < result.counts.jobs:
                    raise KeyboardInterrupt
                phases, cpu_s = scrape(ports)
            overhead = replace(
                submitted.overhead,
                worker_s=phases,
                worker_cpu_s=cpu_s - cpu_at_start_s,
                read_s=result.read_s,
            )
            found = figures(sessions, submitted.batch_id, plan.slow_workers)
            return replace(found, overhead=overhead)
        finally:
            dispatcher.delete_keys()
            dispatcher.close()
            sessions.close()


def scrape(ports: list[int]) -> tuple[dict[str, float], float]:
    """The workers' seconds per phase (``speceyes_stage_seconds``) and their processes'
    CPU seconds, summed over their ``/metrics``."""
    phases: dict[str, float] = {}
    cpu_s = 0.0
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "speceyes_stage_seconds_sum":
                    phase = sample.labels["phase"]
                    phases[phase] = phases.get(phase, 0.0) + sample.value
                elif sample.name == "process_cpu_seconds_total":
                    cpu_s += sample.value
    return phases, cpu_s


def scripted_env(scripted: ScriptedSettings, *, simulate: bool) -> dict[str, str]:
    """The workers' SPECEYES_SCRIPTED__* for ``scripted``: its shares, and its simulated
    costs with ``simulate`` (else the scripted backend costs nothing)."""
    names = ["tool_free", "confident"]
    if simulate:
        names += ["fast_batch_s", "fast_job_s", "agent_step_s"]
    return {f"SPECEYES_SCRIPTED__{name.upper()}": str(getattr(scripted, name)) for name in names}


def funnel_and_baseline(
    settings: Settings,
    jobs: int,
    scripted: ScriptedSettings,
    *,
    fast_workers: int,
    slow_workers: int,
    simulate: bool,
    rate: float | None = None,
) -> dict[str, PipelineFigures]:
    """``jobs`` through fresh workers: the funnel and, with simulated costs, the baseline
    (every job to the agent) after it; with no simulated cost a baseline tells nothing."""
    runs = [("funnel", False), ("baseline", True)] if simulate else [("funnel", False)]
    results = {}
    for label, baseline in runs:
        env = {
            **scripted_env(scripted, simulate=simulate),
            "SPECEYES_BASELINE": str(baseline).lower(),
        }
        plan = PipelinePlan(jobs, fast_workers, slow_workers, worker_env=env, rate=rate)
        results[label] = bench_pipeline(settings, plan, log=lambda line: None)
    return results


def _stalled(seconds: float) -> None:
    print(f"nothing finished for {seconds:.0f} s; see the worker logs", file=sys.stderr)


def chunk_spans(count: int, first: int, size: int) -> list[range]:
    """Positions ``0 .. count`` in chunks: ``first`` jobs, then ``size`` at a time."""
    bounds = [0, *range(min(first, count), count, size), count]
    return [range(start, stop) for start, stop in pairwise(bounds) if stop > start]


@dataclass(frozen=True)
class Submitted:
    batch_id: str
    overhead: Overhead  # the submitter's part


def submit_synthetic(
    sessions: Any,
    dispatcher: Dispatcher,
    spans: list[range],
    folder: Path,
    *,
    rate: float | None = None,
) -> Submitted:
    """Jobs on one small image (distinct questions make distinct jobs), a chunk per span
    of positions: each chunk committed, then sent; with ``rate``, position i is submitted
    i / rate seconds after the first."""
    image = folder / "bench.png"
    Image.new("RGB", (64, 48), (200, 40, 40)).save(image)
    digest = content_hash(image.read_bytes())
    with sessions.begin() as session:
        batch, _ = submission.get_or_create_batch(
            session, key=uuid.uuid4().hex, name="bench-pipeline", source=str(folder), config={}
        )
    batch_id = batch.id
    held = submission.Held(before=0)  # a new batch: no row of an earlier run to match
    statistics = submission.Statistics()  # (as annotate keeps them)
    rows_s = send_s = 0.0
    began = time.perf_counter()
    for span in spans:
        if rate:
            time.sleep(max(0.0, began + span.start / rate - time.perf_counter()))  # the pace
        questions = {i: f"Question {i}: what colour is it?" for i in span}
        items = [
            new_jobs.NewItem(i, f"job-{i}", question, image_path=str(image), image_hash=digest)
            for i, question in questions.items()
        ]
        started = time.perf_counter()
        with dispatcher.transaction(sessions) as outbox:
            submission.submit_items(outbox.session, batch, items, config_key="bench", held=held)
            outbox.to_fast(
                outbox.session.scalars(
                    select(BatchItem.job_id).where(
                        BatchItem.batch_id == batch_id, BatchItem.position >= span.start
                    )
                )
            )
        statistics.grown(sessions, span.stop)
        send_s += outbox.sent_s
        rows_s += time.perf_counter() - started - outbox.sent_s
    return Submitted(batch_id, Overhead(submit_rows_s=rows_s, submit_send_s=send_s))


def figures(sessions: Any, batch_id: str, slow_workers: int = 1) -> PipelineFigures:
    with sessions() as session:
        counts = reads.batch_counts(session, batch_id)
        busy = analytics.stage_busy(session, batch_id)
        draws = tuple(run_draws(session, batch_id))
        rows = session.execute(
            select(Job.created_at, Job.finished_at)
            .join(BatchItem, BatchItem.job_id == Job.id)
            .where(BatchItem.batch_id == batch_id)
        ).all()
    latencies = sorted((done - created).total_seconds() for created, done in rows)
    first = min(created for created, _ in rows)
    last = max(done for _, done in rows)
    quantiles = statistics.quantiles(latencies, n=100, method="inclusive")
    return PipelineFigures(
        jobs=len(rows),
        seconds=(last - first).total_seconds(),
        p50_s=quantiles[49],
        p99_s=quantiles[98],
        beta=counts.beta,
        alpha=counts.alpha,
        small_share=counts.small_share,
        fast_busy_s=busy.fast_s,
        agent_busy_s=busy.agent_s,
        agent_workers=slow_workers,
        agent_jobs=busy.agent_jobs,
        fill_s=busy.fill_s,
        draws=draws,
    )


@contextmanager
def workers(plan: PipelinePlan, env: dict[str, str], folder: Path, log: Log) -> Iterator[list[int]]:
    """Start the plan's workers, wait until each is ready, stop them (SIGTERM) at the end;
    yields their metrics ports."""
    started: list[tuple[subprocess.Popen[bytes], Path]] = []
    ports: list[int] = []
    pools = ["fast"] * plan.fast_workers + ["slow"] * plan.slow_workers
    try:
        for index, pool in enumerate(pools):
            path = folder / f"worker-{index}-{pool}.log"
            command = [
                sys.executable,
                "-m",
                "cli.main",
                "worker",
                pool,
                "--loglevel",
                "INFO",
                "--name",
                f"{pool}{index}@%h",
                "--metrics-port",
                str(free_port()),
            ]
            ports.append(int(command[-1]))
            with path.open("wb") as out:
                process = subprocess.Popen(
                    command, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
                )
            started.append((process, path))
        deadline = time.monotonic() + 120
        for process, path in started:
            while b"ready." not in path.read_bytes():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise ConfigurationError(f"a worker did not start:\n{path.read_text()[-2000:]}")
                time.sleep(0.1)  # polling the worker's log for its ready line
        log(f"{plan.fast_workers} fast and {plan.slow_workers} slow worker(s) ready")
        yield ports
    finally:
        for process, _ in started:
            process.send_signal(signal.SIGTERM)
        for process, _ in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
