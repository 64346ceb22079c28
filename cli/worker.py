"""``speceyes worker fast|slow``: a Celery worker of the distributed pipeline."""

from __future__ import annotations

import argparse
import logging
import sys

from cli.options import add_pipeline_flags, add_settings, require_shared_store, settings_from_args
from common.sandbox import require_code_sandbox
from common.store.db import open_store
from workers.app import make_app

DESCRIPTION = """\
Start a worker of the distributed pipeline. Jobs arrive on Redis (SPECEYES_BROKER_URL or
--broker); results go to the job store (--db, PostgreSQL for more than one machine).

  fast   phases I-III in micro-batches: a message carries a micro-batch of job ids
         (a submission packs them) and runs as one; single ids are gathered, flushed
         at --batch-size messages or after SPECEYES_FAST_MAX_WAIT_S; accepted
         answers are written at once, the rest are sent to the slow queue. One
         process, one batch at a time; it prefetches two batches' worth of messages
         so the next batch fills while this one runs.
  slow   --concurrency N agent trajectories at once (default 1), one message prefetched
         per trajectory. In-process models batch the N trajectories' steps into one
         generate (lockstep, the same trajectories as one by one); with --backend
         openai they are N requests in flight at the server. A job submitted with
         --method specreason runs SpecReason here (its --score-threshold is this
         worker's); --method itself is the submitter's (annotate, serve), not a worker's.

Scale out by starting more workers, on this machine or others, against the same Redis
and database; with GPUs, one worker per GPU (--device cuda:N). A worker loads its models
after it starts. Run workers under a supervisor that restarts them (compose restart
policy, Kubernetes, systemd): a worker that cannot recover exits non-zero.

Faults:
  - A worker writes a heartbeat to the job store every SPECEYES_HEARTBEAT_S (5 s). One
    whose heartbeat is older than SPECEYES_WORKER_DEAD_AFTER_S (30 s) is dead: the
    reconciler (one worker at a time, by a lease in the store) puts its running jobs
    back and sends them again. Its messages would also come back after
    SPECEYES_VISIBILITY_TIMEOUT_S (3600 s): whichever is first; the second delivery
    changes nothing.
  - Jobs waiting with no message on Redis (a restart without persistence, an enqueue
    that failed) are sent again after SPECEYES_RECONCILE_AFTER_S (30 s).
  - Broker or database outages: the worker reconnects; /readyz answers 503 meanwhile;
    work that fails outside a job is sent again after a backoff that doubles up to
    SPECEYES_RETRY_MAX_DELAY_S, and the error is logged once, then counted. A worker
    that takes nothing for SPECEYES_WORKER_STALL_EXIT_S (120 s) while its queue holds
    messages exits with status 3.
  - SIGTERM (or Ctrl-C): a warm shutdown. The batch or trajectories running now finish
    and are recorded; the messages taken but not started go back to the queue (not
    acknowledged); then the worker removes its heartbeat row and exits 0. A second
    Ctrl-C, or SIGQUIT, stops at once (its jobs are then taken over as after a crash).

--metrics-port PORT serves /metrics (Prometheus), /healthz (liveness: 503 once the
worker is stuck) and /readyz (readiness: 503 while the database or broker does not
answer) for probes.
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("pool", choices=["fast", "slow"], help="which queue to work")
    add_settings(parser, "funnel.fast_batch_size")
    parser.add_argument(
        "--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on PORT"
    )
    add_settings(parser, "agent.workers", flag="--concurrency")  # (slow workers)
    parser.add_argument("--name", help="worker node name (default: fast@HOST / slow@HOST)")
    parser.add_argument("--loglevel", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    add_pipeline_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    logging.getLogger().setLevel(args.loglevel)
    require_shared_store(settings)
    store = open_store(settings.database_url)  # fail now if the store is wrong
    print(f"speceyes: job store {store.described}", file=sys.stderr)
    store.close()
    if args.pool == "slow":
        require_code_sandbox(settings)  # Thyme: fail now if its code cannot be isolated
    app = make_app(settings, metrics_port=args.metrics_port, pool=args.pool)
    # a slow worker also takes audits, from their own queue, only when no deferred job waits
    queue = (
        settings.broker.fast_queue
        if args.pool == "fast"
        else f"{settings.broker.slow_queue},{settings.broker.audit_queue}"
    )
    # celery-batches only fills a batch if prefetch x concurrency >= the batch size.
    prefetch = 2 * settings.funnel.fast_batch_size if args.pool == "fast" else 1
    threads = settings.agent.workers if args.pool == "slow" else 1
    app.worker_main(
        [
            "worker",
            "--pool=solo" if threads == 1 else "--pool=threads",
            f"--concurrency={threads}",
            f"--queues={queue}",
            f"--prefetch-multiplier={prefetch}",
            f"--hostname={args.name or args.pool + '@%h'}",
            f"--loglevel={args.loglevel}",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
    )
    return 0
