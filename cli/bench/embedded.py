"""``speceyes bench embedded``: the embedded runner, funnel against baseline
(``lab.bench.embedded``)."""

from __future__ import annotations

import argparse

from cli.bench.figures import BOUND_HELP, print_bound
from common.backends.scripted import ScriptedSettings
from lab.bench import embedded
from lab.bench.schedule import Schedule


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Annotate the same synthetic corpus twice with the embedded runner and "
        "the scripted backend at simulated costs: once through the funnel, once with "
        "--baseline (every job through the agent). Prints jobs/s of both, the measured "
        "speedup and the ideal 1/(1 - beta*alpha). The fast-stage cost is split evenly "
        "between screening and speculation." + BOUND_HELP
    )
    parser.add_argument("--jobs", type=int, default=200, help="corpus size (200)")
    parser.add_argument("--tool-free", type=float, default=0.7, help="beta (0.7)")
    parser.add_argument("--confident", type=float, default=0.7, help="alpha (0.7)")
    parser.add_argument(
        "--fast-batch-s", type=float, default=0.2, help="fast stage s per batch (0.2)"
    )
    parser.add_argument("--fast-job-s", type=float, default=0.01, help="... + s per job (0.01)")
    parser.add_argument("--agent-s", type=float, default=1.0, help="agent s per trajectory (1.0)")
    parser.add_argument("--batch-size", type=int, default=32, help="fast micro-batch (32)")
    parser.add_argument("--agent-workers", type=int, default=1, help="agent threads (1)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    scripted = ScriptedSettings(
        tool_free=args.tool_free,
        confident=args.confident,
        fast_batch_s=args.fast_batch_s,
        fast_job_s=args.fast_job_s,
        agent_step_s=args.agent_s,
    )
    print(
        f"embedded runner, scripted backend, {args.jobs} jobs: fast stage {args.fast_batch_s} s "
        f"per batch + {args.fast_job_s} s per job (batch {args.batch_size}), agent "
        f"{args.agent_s} s per trajectory, {args.agent_workers} agent worker(s)"
    )
    schedule = Schedule(
        args.batch_size, args.fast_batch_s, args.fast_job_s, args.agent_s, args.agent_workers
    )
    figures = embedded.funnel_and_baseline(
        args.jobs, scripted, batch_size=args.batch_size, agent_workers=args.agent_workers
    )
    for label, run in figures.items():
        print(
            f"{label:<9} {run.jobs} jobs in {run.seconds:7.1f} s = {run.jobs_per_s:6.2f} "
            f"jobs/s   answered by the small model: {run.small_share:.1%}"
        )
        print_bound(run, schedule)
    funnel, baseline = figures["funnel"], figures["baseline"]
    beta, alpha = funnel.beta or 0.0, funnel.alpha or 0.0
    print(f"measured  beta {beta:.3f}, alpha {alpha:.3f}")
    print(
        f"speedup   {funnel.jobs_per_s / baseline.jobs_per_s:.2f}x measured, "
        f"{1 / (1 - beta * alpha):.2f}x ideal 1/(1 - beta*alpha)"
    )
    return 0
