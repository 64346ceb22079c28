"""A fault run, benchmark style: ``python -m tests.workers.bench_faults [--jobs 10000]``;
or a soak: ``python -m tests.workers.bench_faults --soak 1800`` (``tests.workers.soak``).

For each fault (none, as the baseline; a Redis restart without persistence, a PostgreSQL
restart, SIGKILL of the fast worker, SIGKILL of a slow worker), on a Redis and a
PostgreSQL of its own: 1 fast + 3 slow supervised workers (scripted backend, beta =
alpha = 0.7, 10 ms agent steps), ``--jobs`` jobs submitted, the fault injected once a
third of them are final. Then it prints per fault: jobs lost (an answer written before
the fault changed or gone), run again (claimed more than once in their last stage: work
repeated, never a second result), stuck (not final by the deadline) and the seconds
from the fault to the last job final (the baseline's: what the remaining work takes
with no fault). Recovery settings are the fault tests' (``faults.RECOVERY``: scaled down
for speed), or with ``--defaults`` every one at its default, as an operator runs them.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import func, select

from common.contracts import JobStatus
from common.pipeline.follow import follow_store
from common.store.tables import Job
from lab.bench.pipeline import chunk_spans, submit_synthetic
from tests.helpers.faults import RECOVERY, OwnPostgres, OwnRedis, Run
from tests.helpers.waiting import wait_until
from tests.workers.soak import soak
from workers.queues import CeleryDispatcher

FAULTS = ("none", "redis-restart", "postgres-restart", "kill-fast", "kill-slow")


def one(fault: str, jobs: int, deadline_s: float, defaults: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="speceyes-faults-") as scratch:
        folder = Path(scratch)
        redis, postgres = OwnRedis(folder), OwnPostgres()
        redis.start()
        postgres.init()
        postgres.start()
        run = Run(
            folder,
            redis.url,
            postgres.url,
            recovery={} if defaults else None,
            tool_free=0.7,
            confident=0.7,
            agent_step_s=0.01,
        )
        try:
            fast, *slow = run.supervised("fast", "slow", "slow", "slow")
            dispatcher = CeleryDispatcher(run.settings)
            batch_id = submit_synthetic(
                run.sessions, dispatcher, chunk_spans(jobs, 1000, 1000), folder
            ).batch_id
            dispatcher.close()
            wait_until(
                lambda: _final(run) >= jobs // 3,
                deadline_s=deadline_s,
                what="a third of the jobs final",
                every_s=0.5,
            )
            before = run.answers()
            injected = time.monotonic()
            if fault == "redis-restart":
                redis.restart()
            elif fault == "postgres-restart":
                postgres.stop()
                time.sleep(3)  # the outage
                postgres.start()
            elif fault == "kill-fast":
                fast.kill()
            elif fault == "kill-slow":
                slow[0].kill()
            result = follow_store(run.sessions, batch_id, poll_s=0.5, deadline_s=deadline_s)
            recovered = time.monotonic() - injected
            after = run.answers()
            with run.sessions() as session:
                again = session.scalar(select(func.count()).where(Job.attempts > 1)) or 0
            return {
                "lost": sum(after.get(job_id) != answer for job_id, answer in before.items()),
                "run again": again,
                "stuck": result.counts.jobs - result.counts.finished,
                "seconds": recovered,
                "worker restarts": run.workers.restarts,
            }
        finally:
            run.close()
            redis.stop()
            postgres.close()


def _final(run: Run) -> int:
    with run.sessions() as session:
        done = (JobStatus.DONE, JobStatus.FAILED)
        return session.scalar(select(func.count()).where(Job.status.in_(done))) or 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"of {', '.join(FAULTS)}")
    parser.add_argument("--deadline-s", type=float, default=600.0)
    parser.add_argument(
        "--defaults", action="store_true", help="every recovery setting at its default"
    )
    parser.add_argument(
        "--soak",
        type=float,
        metavar="SECONDS",
        help="instead: a soak this long (steady load, a random fault every 1-3 minutes, "
        "recovery at the defaults; tests/workers/soak.py)",
    )
    parser.add_argument("--rate", type=float, default=50.0, help="soak: jobs a second")
    parser.add_argument(
        "--fault-every", default="60,180", metavar="MIN,MAX", help="soak: seconds between faults"
    )
    parser.add_argument("--seed", type=int, default=0, help="soak: the faults' draw")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the servers and workers started are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.soak:
        low, high = (float(part) for part in args.fault_every.split(","))
        print(f"soak: {args.rate:g} jobs/s, a fault every {low:g}-{high:g} s, seed {args.seed}")
        figures = soak(args.soak, rate=args.rate, fault_every=(low, high), seed=args.seed)
        print("\n".join(figures.lines()))
        return
    settings = ", ".join(f"{k.removeprefix('SPECEYES_').lower()}={v}" for k, v in RECOVERY.items())
    if args.defaults:
        settings = "recovery settings at their defaults"
    print(f"{args.jobs} jobs per fault, 1 fast + 3 slow workers; {settings}")
    print(f"{'fault':<18} {'lost':>5} {'run again':>10} {'stuck':>6} {'fault -> all final':>19}")
    for fault in args.faults.split(","):
        figures = one(fault, args.jobs, args.deadline_s, args.defaults)
        print(
            f"{fault:<18} {figures['lost']:>5} {figures['run again']:>10} "
            f"{figures['stuck']:>6} {figures['seconds']:>17.1f} s"
            f"   (worker restarts: {figures['worker restarts']})",
            flush=True,
        )


if __name__ == "__main__":
    main()
