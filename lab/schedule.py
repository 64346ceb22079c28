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

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import select

from common.contracts import DeferReason
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

    def call(jobs: int) -> None:
        nonlocal clock
        if jobs:  # an empty group makes no call
            clock += (schedule.fast_batch_s + schedule.fast_job_s * jobs) / 2

    size = schedule.batch_size
    for start in range(0, len(draws), size):
        batch = list(draws[start : start + size])
        head = max(1, len(batch) // 2) if start == 0 else len(batch)
        for group in (batch[:head], batch[head:]):
            released += [clock] * group.count(Draw.DIRECT)
            call(len(group) - group.count(Draw.DIRECT))
            released += [clock] * group.count(Draw.SCREENED)
            call(len(group) - group.count(Draw.SCREENED))
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
    if answered_by == "small":
        return Draw.ACCEPTED
    if reason == DeferReason.LOW_CONFIDENCE:
        return Draw.GATED
    if reason == DeferReason.BASELINE:
        return Draw.DIRECT
    return Draw.SCREENED
