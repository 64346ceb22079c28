"""``speceyes bench agent``: trajectories/s against concurrency (``lab.bench.agent``)."""

from __future__ import annotations

import argparse

from cli.options import (
    add_model_flags,
    flag_defaults,
    settings_from_args,
)
from common.config import AgentSettings
from lab.bench import agent


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the same --trajectories DeepEyes trajectories (random images and "
        "questions; greedy) through the large model with N at once, for each N of "
        "--concurrency: N threads whose steps share one batched generate (lockstep). "
        "Prints trajectories/s, the speedup over N = 1 and the mean batch. Defaults to the "
        "tiny checkpoint on this machine; --large names any Qwen2.5-VL checkpoint."
    )
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated N (1,2,4,8)")
    parser.add_argument("--trajectories", type=int, default=16, help="trajectories per N (16)")
    parser.add_argument("--steps", type=int, default=3, help="generations per trajectory (3)")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per step (32)")
    add_model_flags(parser)
    parser.set_defaults(run=run, **flag_defaults(small_model="tiny", large_model="tiny"))


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    model = agent.load_large(settings)
    queries = agent.agent_queries(args.trajectories)
    limits = AgentSettings(max_steps=args.steps, max_new_tokens=args.tokens)
    concurrency = [int(part) for part in args.concurrency.split(",")]
    print(
        f"agent: {args.trajectories} trajectories x {args.steps} steps x {args.tokens} "
        f"tokens, {settings.models.large.name} on {model.device}"
    )
    base = None
    for row in agent.bench_agent(model, queries, concurrency, limits):
        base = base or row.trajectories_per_s
        print(
            f"  N = {row.concurrency:<3} {row.trajectories_per_s:7.2f} trajectories/s   "
            f"x{row.trajectories_per_s / base:5.2f}   mean batch {row.mean_batch:4.1f}"
        )
    return 0
