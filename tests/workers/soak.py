"""A soak: steady load through supervised workers, with a random fault every so often.

``python -m tests.workers.bench_faults --soak 1800`` runs it for 30 minutes (``--rate``
jobs a second, a fault every ``--fault-every`` seconds, drawn uniformly); the fault tests
run a 5-minute version. On a Redis and a PostgreSQL of its own, every recovery setting at
its default, 1 fast and 2 slow workers (scripted backend) kept running by a supervisor
as compose's restart policy does. The faults, drawn at random: SIGKILL of the fast or a
slow worker, SIGTERM of any worker, a Redis restart without persistence, a PostgreSQL
restart (3 s down), a 20 s pause of Redis (SIGSTOP, then SIGCONT).

What it measures (``SoakFigures``):

- jobs lost: submitted and not final once the load stops and the pipeline drains;
- results changed: a job's answer (text, who answered, when) recorded before a fault and
  different at the end;
- jobs run twice: claimed more than once in their last stage (work repeated, never a
  second result);
- per fault, the seconds from it to every job in flight when it struck or submitted
  while it lasted (and a second after) being final;
- each worker slot's RSS after warm-up and at the end (same process: its growth);
- worker log lines per minute, all and WARNING or worse (a storm would show here);
- submit-to-done p50 / p99 of the jobs that lived outside every fault window.
"""

from __future__ import annotations

import os
import random
import re
import signal
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image
from sqlalchemy import func, select

from common.contracts import JobStatus
from common.images import content_hash
from common.store import new_jobs, submission
from common.store.tables import Batch, BatchItem, Job
from tests.helpers.faults import OwnPostgres, OwnRedis, Run
from workers.queues import CeleryDispatcher

FAULTS = ("kill-fast", "kill-slow", "term-worker", "redis-restart", "postgres-restart", "pause")
WARM_UP_S = 30.0  # a worker's RSS is read this long after it started
FINAL = (JobStatus.DONE, JobStatus.FAILED)


@dataclass
class Fault:
    kind: str
    at: float  # seconds into the soak
    before: int  # jobs submitted up to a second after it ended (positions below): the
    # jobs in flight when it struck or sent while it lasted
    recovered_s: float | None = None  # from it to every one of those final
    outage_s: float = 0.0  # how long the service it hit was away (a pause, a restart)

    @property
    def healed_s(self) -> float | None:
        """From the service's return to every job submitted before the fault final."""
        return None if self.recovered_s is None else self.recovered_s - self.outage_s


@dataclass
class SoakFigures:
    seconds: float
    submitted: int = 0
    lost: int = 0
    changed: int = 0
    run_twice: int = 0
    faults: list[Fault] = field(default_factory=list)
    rss_mb: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # slot ->
    # (RSS after warm-up, RSS at the end, the process's age in s)
    log_lines_per_min: tuple[float, int] = (0.0, 0)  # median, worst minute
    warnings_per_min: tuple[float, int] = (0.0, 0)
    latency_s: tuple[float, float] = (0.0, 0.0)  # p50, p99 outside the fault windows
    worker_restarts: int = 0
    submit_errors: int = 0

    @property
    def worst_recovery_s(self) -> float:
        return max((f.recovered_s or float("inf") for f in self.faults), default=0.0)

    def lines(self) -> list[str]:
        out = [
            f"{self.seconds:.0f} s, {self.submitted} jobs submitted "
            f"({self.submit_errors} submissions retried), {self.worker_restarts} worker "
            "restarts by the supervisor",
            f"jobs lost {self.lost}, results changed {self.changed}, jobs run twice "
            f"{self.run_twice}",
            f"faults {len(self.faults)}; worst fault -> all final {self.worst_recovery_s:.1f} s",
        ]
        for fault in self.faults:
            took = "never" if fault.recovered_s is None else f"{fault.recovered_s:.1f} s"
            back = f" ({fault.healed_s:.1f} s after it was back)" if fault.outage_s > 1 else ""
            out.append(f"  {fault.at:7.0f} s  {fault.kind:<17} -> all final in {took}{back}")
        for slot, (warm, end, age) in sorted(self.rss_mb.items()):
            out.append(
                f"RSS {slot:<7} {warm:6.1f} MB after warm-up, {end:6.1f} MB at the end "
                f"({age:.0f} s old)"
            )
        median, worst = self.log_lines_per_min
        w_median, w_worst = self.warnings_per_min
        out.append(
            f"log lines a minute: median {median:.0f}, worst {worst}; WARNING or worse: "
            f"median {w_median:.0f}, worst {w_worst}"
        )
        p50, p99 = self.latency_s
        out.append(f"submit -> done outside the fault windows: p50 {p50:.2f} s, p99 {p99:.2f} s")
        return out


class Soak:
    def __init__(
        self,
        folder: Path,
        *,
        seconds: float,
        rate: float,
        fault_every: tuple[float, float],
        seed: int = 0,
        drain_s: float = 180.0,
        kinds: list[str] | None = None,
    ) -> None:
        self.folder, self.seconds, self.rate = folder, seconds, rate
        self.fault_every, self.drain_s = fault_every, drain_s
        self.random = random.Random(seed)
        # the faults in turn (each kind once, in a shuffled order), else drawn each time
        self.kinds = list(kinds) if kinds else None
        self.redis, self.postgres = OwnRedis(folder), OwnPostgres()
        self.figures = SoakFigures(seconds)
        self._submitted = 0
        self._stop = threading.Event()
        self._rss: dict[str, dict[int, list[tuple[float, float]]]] = {}  # slot -> pid -> (t, MB)
        self._born: dict[int, float] = {}  # pid -> first seen

    def run(self) -> SoakFigures:
        self.redis.start()
        self.postgres.init()
        self.postgres.start()
        self.run_ = Run(
            self.folder,
            self.redis.url,
            self.postgres.url,
            recovery={},  # every recovery setting at its default
            tool_free=0.6,
            confident=0.7,
            agent_step_s=0.01,
        )
        try:
            return self._soak()
        finally:
            self._stop.set()
            self.run_.close()
            self.redis.stop()
            self.postgres.close()

    # -- the run ----------------------------------------------------------------------
    def _soak(self) -> SoakFigures:
        run = self.run_
        run.supervised("fast", "slow", "slow")
        self.slots = ["fast", "slow-1", "slow-2"]
        self.batch_id = self._new_batch()
        submitter = threading.Thread(target=self._submit_loop, daemon=True)
        started = self.started = time.monotonic()
        submitter.start()
        answers: dict[str, tuple[Any, ...]] = {}
        next_fault = started + self.random.uniform(*self.fault_every)
        while time.monotonic() - started < self.seconds:
            time.sleep(1.0)
            self._sample_rss()
            self._settle_faults()
            if time.monotonic() >= next_fault:
                answers.update(self._answers())
                # (a random moment of the second, so faults do not strike in step with
                # the submissions, always between two of them)
                time.sleep(self.random.random())
                kind = self.kinds.pop(0) if self.kinds else self.random.choice(FAULTS)
                self._inject(kind)
                if self.kinds == []:
                    next_fault = float("inf")
                next_fault = time.monotonic() + self.random.uniform(*self.fault_every)
        self._stop.set()
        submitter.join(timeout=60)
        deadline = time.monotonic() + self.drain_s
        while time.monotonic() < deadline and self._unfinished(self._submitted):
            self._settle_faults()
            time.sleep(1.0)
        self._settle_faults()
        self._sample_rss()
        return self._figures(answers)

    def _new_batch(self) -> str:
        image = self.folder / "soak.png"
        Image.new("RGB", (64, 48), (30, 120, 200)).save(image)
        self.image, self.digest = str(image), content_hash(image.read_bytes())
        with self.run_.sessions.begin() as session:
            batch, _ = submission.get_or_create_batch(
                session, key=uuid.uuid4().hex, name="soak", source=str(self.folder), config={}
            )
            return batch.id

    def _submit_loop(self) -> None:
        """``rate`` jobs a second, a second's worth at a time; a submission that fails
        (the store or the broker down) is tried again, whole, a second later."""
        dispatcher = CeleryDispatcher(self.run_.settings)
        try:
            tick = time.monotonic()
            while not self._stop.is_set():
                due = int((time.monotonic() - self.started) * self.rate)
                if due > self._submitted:
                    try:
                        self._submit(dispatcher, range(self._submitted, due))
                        self._submitted = due
                    except Exception:
                        self.figures.submit_errors += 1
                tick += 1.0
                self._stop.wait(max(0.0, tick - time.monotonic()))
        finally:
            dispatcher.close()

    def _submit(self, dispatcher: CeleryDispatcher, span: range) -> None:
        items = [
            new_jobs.NewItem(
                i, f"soak-{i}", f"Question {i}?", image_path=self.image, image_hash=self.digest
            )
            for i in span
        ]
        with dispatcher.transaction(self.run_.sessions) as outbox:
            batch = outbox.session.get(Batch, self.batch_id)
            assert batch is not None
            submission.submit_items(outbox.session, batch, items, config_key="soak")
            outbox.to_fast(
                outbox.session.scalars(
                    select(BatchItem.job_id).where(
                        BatchItem.batch_id == self.batch_id, BatchItem.position >= span.start
                    )
                )
            )

    # -- faults -----------------------------------------------------------------------
    def _inject(self, kind: str) -> None:
        fault = Fault(kind, time.monotonic() - self.started, self._submitted)
        self.figures.faults.append(fault)
        workers = self.run_.workers.workers
        if kind == "kill-fast":
            workers[0].process.send_signal(signal.SIGKILL)
        elif kind == "kill-slow":
            self.random.choice(workers[1:]).process.send_signal(signal.SIGKILL)
        elif kind == "term-worker":
            self.random.choice(workers).process.send_signal(signal.SIGTERM)
        elif kind == "redis-restart":
            self.redis.restart()
        elif kind == "postgres-restart":
            self.postgres.stop()
            time.sleep(3.0)
            self.postgres.start()
        elif kind == "pause":
            assert self.redis.process is not None
            self.redis.process.send_signal(signal.SIGSTOP)
            time.sleep(20.0)
            self.redis.process.send_signal(signal.SIGCONT)
        fault.outage_s = time.monotonic() - self.started - fault.at
        time.sleep(1.0)
        fault.before = self._submitted

    def _settle_faults(self) -> None:
        """A fault is settled once every job submitted before it is final."""
        for fault in self.figures.faults:
            if fault.recovered_s is None and not self._unfinished(fault.before):
                fault.recovered_s = time.monotonic() - self.started - fault.at

    def _unfinished(self, below: int) -> int:
        try:
            with self.run_.sessions() as session:
                query = (
                    select(func.count())
                    .select_from(BatchItem)
                    .join(Job, Job.id == BatchItem.job_id)
                    .where(
                        BatchItem.batch_id == self.batch_id,
                        BatchItem.position < below,
                        Job.status.not_in(FINAL),
                    )
                )
                return session.scalar(query) or 0
        except Exception:  # the store is down right now: not settled
            return 1

    # -- figures ----------------------------------------------------------------------
    def _answers(self) -> dict[str, tuple[Any, ...]]:
        try:
            with self.run_.sessions() as session:
                rows = session.execute(
                    select(Job.id, Job.final_answer, Job.answered_by, Job.finished_at).where(
                        Job.status == JobStatus.DONE
                    )
                ).all()
        except Exception:
            return {}
        return {row.id: tuple(row[1:]) for row in rows}

    def _sample_rss(self) -> None:
        now = time.monotonic()
        for slot, worker in zip(self.slots, self.run_.workers.workers, strict=True):
            pid = worker.process.pid
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            match = re.search(r"VmRSS:\s+(\d+) kB", status)
            if match:
                self._born.setdefault(pid, now)
                self._rss.setdefault(slot, {}).setdefault(pid, []).append(
                    (now, int(match.group(1)) / 1024)
                )

    def _figures(self, answers: dict[str, tuple[Any, ...]]) -> SoakFigures:
        figures = self.figures
        figures.submitted = self._submitted
        figures.lost = self._unfinished(self._submitted)
        after = self._answers()
        figures.changed = sum(after.get(job_id) != answer for job_id, answer in answers.items())
        with self.run_.sessions() as session:
            figures.run_twice = session.scalar(select(func.count()).where(Job.attempts > 1)) or 0
            lived = session.execute(select(Job.created_at, Job.finished_at)).all()
        figures.worker_restarts = self.run_.workers.restarts
        figures.rss_mb = self._rss_figures()
        figures.log_lines_per_min, figures.warnings_per_min = self._log_rates()
        figures.latency_s = self._latency(lived)
        return figures

    def _rss_figures(self) -> dict[str, tuple[float, float, float]]:
        """Per slot, its current process: RSS once warm, at the end, and its age."""
        found = {}
        now = time.monotonic()
        for slot, processes in self._rss.items():
            pid = list(processes)[-1]
            samples, born = processes[pid], self._born[pid]
            warm = next((mb for t, mb in samples if t - born >= WARM_UP_S), samples[-1][1])
            found[slot] = (warm, samples[-1][1], now - born)
        return found

    def _log_rates(self) -> tuple[tuple[float, int], tuple[float, int]]:
        stamp = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d):\d\d,\d+ (\w+)")
        lines: Counter[bytes] = Counter()
        warnings: Counter[bytes] = Counter()
        for path in self.folder.glob("worker-*.log"):
            for line in path.read_bytes().splitlines():
                match = stamp.match(line)
                if match is None:
                    continue
                lines[match.group(1)] += 1
                if match.group(2) in (b"WARNING", b"ERROR", b"CRITICAL"):
                    warnings[match.group(1)] += 1
        minutes = sorted(lines)[1:-1] or sorted(lines)  # whole minutes only
        counts = [lines[m] for m in minutes]
        warned = [warnings.get(m, 0) for m in minutes]
        return (
            (statistics.median(counts) if counts else 0.0, max(counts, default=0)),
            (statistics.median(warned) if warned else 0.0, max(warned, default=0)),
        )

    def _latency(self, lived: Sequence[Any]) -> tuple[float, float]:
        """Submit-to-done of the jobs whose life overlapped no fault window (a fault to
        its recovery, or to the end)."""
        start = time.time() - (time.monotonic() - self.started)  # the soak's start, wall
        windows = [
            (start + f.at, start + f.at + (f.recovered_s or self.seconds))
            for f in self.figures.faults
        ]
        took = []
        for created, finished in lived:
            if created is None or finished is None:
                continue
            begin, end = created.timestamp(), finished.timestamp()
            if any(begin <= w_end and end >= w_start for w_start, w_end in windows):
                continue
            took.append(end - begin)
        if not took:
            return 0.0, 0.0
        took.sort()
        return took[len(took) // 2], took[min(len(took) - 1, int(len(took) * 0.99))]


def soak(
    seconds: float,
    *,
    rate: float,
    fault_every: tuple[float, float],
    seed: int,
    kinds: list[str] | None = None,
) -> SoakFigures:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="speceyes-soak-") as scratch:
        return Soak(
            Path(scratch),
            seconds=seconds,
            rate=rate,
            fault_every=fault_every,
            seed=seed,
            kinds=kinds,
        ).run()


if __name__ == "__main__":  # (python -m tests.workers.bench_faults --soak N is the door)
    print("\n".join(soak(60, rate=10, fault_every=(20, 30), seed=os.getpid()).lines()))
