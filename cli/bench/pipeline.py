"""``speceyes bench pipeline``: the distributed pipeline end to end (``lab.bench.pipeline``)."""

from __future__ import annotations

import argparse

from cli.bench.figures import BOUND_HELP, print_bound
from cli.options import (
    add_broker_flags,
    add_store_flags,
    settings_from_args,
)
from common.backends.scripted import ScriptedSettings
from lab.bench import pipeline
from lab.bench.schedule import Schedule


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Start fast and slow workers (scripted backend) on a scratch database "
        "beside --db (PostgreSQL) and a scratch key prefix on --broker, submit --jobs jobs "
        "in committed chunks, and print jobs/s from the first submit to the last result and "
        "the p50/p99 submit-to-done latency. By default the backend costs nothing, so the "
        "figure is the pipeline's own overhead (queues, batching, database). With "
        "--simulate, the embedded benchmark's costs apply and the funnel is compared with "
        "the baseline (every job through the slow pool) on the same workers." + BOUND_HELP
    )
    parser.add_argument(
        "--jobs", type=int, help="jobs (10000; 200 with --simulate, 2000 with --rate)"
    )
    parser.add_argument("--fast-workers", type=int, default=1, help="fast workers (1)")
    parser.add_argument("--slow-workers", type=int, default=1, help="slow workers (1)")
    parser.add_argument("--batch-size", type=int, default=32, help="fast micro-batch (32)")
    parser.add_argument(
        "--rate",
        type=float,
        metavar="JOBS_PER_S",
        help="offer the jobs at this steady rate, one job a transaction and a message (as "
        "services enqueueing through the API do), instead of all at once in chunks; the "
        "latency figures are then the ones to read",
    )
    parser.add_argument(
        "--tool-free",
        type=float,
        help="beta: share screened tool-free (1.0: every job stays in the fast pool, the "
        "pipeline's own ceiling; 0.7 with --simulate)",
    )
    parser.add_argument(
        "--confident", type=float, help="alpha: share accepted (1.0; 0.7 with --simulate)"
    )
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="simulated costs (below); funnel vs baseline",
    )
    parser.add_argument(
        "--fast-batch-s", type=float, default=0.2, help="--simulate: fast s per batch (0.2)"
    )
    parser.add_argument("--fast-job-s", type=float, default=0.01, help="... + s per job (0.01)")
    parser.add_argument("--agent-s", type=float, default=1.0, help="agent s per trajectory (1.0)")
    add_store_flags(parser)
    add_broker_flags(parser)
    parser.set_defaults(run=run)


def print_overhead(figures: pipeline.PipelineFigures) -> None:
    """Where the pipeline's own time went, per job and as a share of the wall time."""
    jobs, wall = figures.jobs, figures.seconds
    print(
        "          overhead, per job and as a share of the wall time (seconds summed over "
        "the processes that spent them):"
    )
    for what, seconds in figures.overhead.rows():
        print(f"            {what:<28} {1000 * seconds / jobs:7.3f} ms  {seconds / wall:6.1%}")
    cpu_s = figures.overhead.worker_cpu_s
    what = "workers CPU, from 1st submit"
    print(f"            {what:<28} {1000 * cpu_s / jobs:7.3f} ms  {cpu_s / wall:6.1%}")


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args, fast_batch_size=args.batch_size)
    jobs = args.jobs or (200 if args.simulate else 2_000 if args.rate else 10_000)
    share = 0.7 if args.simulate else 1.0
    scripted = ScriptedSettings(
        tool_free=share if args.tool_free is None else args.tool_free,
        confident=share if args.confident is None else args.confident,
        fast_batch_s=args.fast_batch_s,
        fast_job_s=args.fast_job_s,
        agent_step_s=args.agent_s,
    )
    costs = (args.batch_size, args.fast_batch_s, args.fast_job_s, args.agent_s)
    schedule = Schedule(*costs, args.slow_workers) if args.simulate else None
    cost = "simulated costs" if args.simulate else "zero-cost scripted backend"
    print(
        f"distributed pipeline, {cost}, {jobs} jobs, beta {scripted.tool_free} x alpha "
        f"{scripted.confident}, {args.fast_workers} fast / {args.slow_workers} slow worker(s), "
        f"batch {args.batch_size}"
    )
    results = pipeline.funnel_and_baseline(
        settings,
        jobs,
        scripted,
        fast_workers=args.fast_workers,
        slow_workers=args.slow_workers,
        simulate=args.simulate,
        rate=args.rate,
    )
    for label, figures in results.items():
        print(
            f"{label:<9} {figures.jobs} jobs in {figures.seconds:.1f} s = "
            f"{figures.jobs_per_s:.1f} jobs/s; submit-to-done p50 {figures.p50_s:.2f} s, "
            f"p99 {figures.p99_s:.2f} s; small model answered {figures.small_share:.1%}"
        )
        print_bound(figures, schedule)
        print_overhead(figures)
    if args.simulate:
        funnel, base = results["funnel"], results["baseline"]
        beta, alpha = funnel.beta or 0.0, funnel.alpha or 0.0
        print(
            f"speedup   {funnel.jobs_per_s / base.jobs_per_s:.2f}x "
            f"(ideal 1/(1 - beta*alpha) = {1 / (1 - beta * alpha):.2f}x "
            f"at the drawn beta {beta:.3f}, alpha {alpha:.3f})"
        )
    return 0
