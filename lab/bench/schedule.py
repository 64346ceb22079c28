"""The funnel's schedule with no overhead at all: what the start and whole trajectories
leave of the overlap bound.

The overlap bound (``EmbeddedFigures.bound_jobs_per_s``) supposes that both stages are
busy from the first second to the last and that the agents' time divides evenly among
them. Neither can hold: no trajectory begins before a screen is done, the agents wait
whenever the screens have sent on fewer jobs than they can take, and a trajectory is
whole (with ``n`` on ``w`` agents one of them runs ceil(n / w)).

``overhead_free`` replays a run's draws (per job, in submission order: accepted, sent on
by the screen, or sent on by the gate) through the schedule our fast stage follows, at
the nominal simulated costs and with nothing else: micro-batches in order, the first in
two halves (``FastWork``'s ``split_first``), each group screened (its rejects released at
once) and then speculated (the gate's rejects released), a call's cost split evenly
between screening and speculation as in the scripted backend; each agent takes the
oldest released job when it is free. Its efficiency is the most any implementation of
this schedule reaches on those draws; the measured one falls short of it by our own
overhead (claims, commits, messages).
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import select

from common.backends.scripted import SimulatedCost
from common.contracts import AnsweredBy, DeferReason
from common.pipeline.work.unit import halves
from common.store.tables import BatchItem, Job


class Draw(StrEnum):
    """Where a job went in the fast stage."""

    ACCEPTED = "accepted"  # the gate accepted the small model's answer
    SCREENED = "screened"  # the screen sent it on
    GATED = "gated"  # speculated, then sent on by the gate
    DIRECT = "direct"  # straight to the agents, no model call (a baseline run)


@dataclass(frozen=True)
class Schedule:
    batch_size: int
    fast_batch_s: float  # per fast-stage batch (half screening, half speculation)
    fast_job_s: float  # ... + per job
    agent_s: float  # per trajectory
    agents: int


@dataclass(frozen=True)
class Replay:
    seconds: float  # first screen to last trajectory's end
    bound_s: float  # max(fast stage busy, agents busy / agents), as the measured bound

    @property
    def efficiency(self) -> float:
        return self.bound_s / self.seconds if self.seconds else 1.0


def overhead_free(draws: Sequence[Draw], schedule: Schedule) -> Replay:
    """The draws through the schedule at nominal costs, with no overhead."""
    clock = 0.0  # the fast stage's: it is busy from the start to its last call
    released: list[float] = []  # when each job for the agents became available
    # each phase costs half of a batch's cost, as in the scripted backend
    phase = SimulatedCost(schedule.fast_batch_s / 2, schedule.fast_job_s / 2)

    def call(jobs: int) -> None:
        nonlocal clock
        if jobs:  # an empty group makes no call
            clock += phase.seconds(jobs)

    size = schedule.batch_size
    for start in range(0, len(draws), size):
        batch = list(draws[start : start + size])
        for group in halves(batch) if start == 0 else [batch]:
            released += [clock] * group.count(Draw.DIRECT)
            call(len(group) - group.count(Draw.DIRECT))  # screening
            released += [clock] * group.count(Draw.SCREENED)
            call(group.count(Draw.ACCEPTED) + group.count(Draw.GATED))  # speculation
            released += [clock] * group.count(Draw.GATED)
    free = [0.0] * schedule.agents  # when each agent is next free (a heap)
    for ready in sorted(released):
        heapq.heappush(free, max(heapq.heappop(free), ready) + schedule.agent_s)
    busy_agents = len(released) * schedule.agent_s / schedule.agents
    return Replay(max([clock, *free]), max(clock, busy_agents))


def run_draws(session: Any, batch_id: str) -> list[Draw]:
    """A finished batch's draws, in submission order (``Draw``)."""
    rows = session.execute(
        select(Job.answered_by, Job.defer_reason)
        .join(BatchItem, BatchItem.job_id == Job.id)
        .where(BatchItem.batch_id == batch_id)
        .order_by(BatchItem.position)
    ).all()
    return [_draw(answered_by, reason) for answered_by, reason in rows]


def _draw(answered_by: str | None, reason: str | None) -> Draw:
    if answered_by == AnsweredBy.SMALL:
        return Draw.ACCEPTED
    if reason == DeferReason.LOW_CONFIDENCE:
        return Draw.GATED
    if reason == DeferReason.BASELINE:
        return Draw.DIRECT
    return Draw.SCREENED


def random_draws(count: int, tool_free: float, confident: float, rng: random.Random) -> list[Draw]:
    """Draws as the scripted backend makes them: tool-free with ``tool_free``, then
    accepted with ``confident``."""
    return [
        (Draw.ACCEPTED if rng.random() < confident else Draw.GATED)
        if rng.random() < tool_free
        else Draw.SCREENED
        for _ in range(count)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.bench.schedule",
        description="The efficiency an overhead-free run of the funnel's schedule reaches "
        "against the overlap bound, over many random draws: what the start and whole "
        "trajectories leave at a given size, before any implementation's own overhead.",
    )
    parser.add_argument("--jobs", type=int, default=200, help="jobs per run (200)")
    parser.add_argument("--agents", type=int, default=4, help="agent workers (4)")
    parser.add_argument("--fast-batch-s", type=float, default=1.0, help="s per batch (1.0)")
    parser.add_argument("--fast-job-s", type=float, default=0.03, help="+ s per job (0.03)")
    parser.add_argument("--agent-s", type=float, default=1.0, help="s per trajectory (1.0)")
    parser.add_argument("--batch-size", type=int, default=32, help="fast micro-batch (32)")
    parser.add_argument("--tool-free", type=float, default=0.7, help="beta (0.7)")
    parser.add_argument("--confident", type=float, default=0.7, help="alpha (0.7)")
    parser.add_argument("--runs", type=int, default=400, help="random draws (400)")
    args = parser.parse_args(argv)
    schedule = Schedule(
        args.batch_size, args.fast_batch_s, args.fast_job_s, args.agent_s, args.agents
    )
    rng = random.Random(0)
    found = sorted(
        overhead_free(
            random_draws(args.jobs, args.tool_free, args.confident, rng), schedule
        ).efficiency
        for _ in range(args.runs)
    )
    share = sum(value >= 0.95 for value in found) / len(found)
    print(
        f"{args.jobs} jobs, {args.agents} agent(s), {args.runs} draws: efficiency mean "
        f"{statistics.mean(found):.3f}, lowest {found[0]:.3f}, tenth percentile "
        f"{found[len(found) // 10]:.3f}; {share:.1%} of draws reach 0.95"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
