"""What the embedded and pipeline benches print beside jobs/s: the overlap bound."""

from __future__ import annotations

from lab.bench.embedded import EmbeddedFigures
from lab.bench.schedule import Schedule, overhead_free

BOUND_HELP = (
    " Beside jobs/s, each run prints its overlap bound, jobs / max(fast stage busy, agents "
    "busy / agents), from the busy times the store recorded; the efficiency (measured / "
    "bound); the reference's serial loop on the same work; the gap to the bound in parts "
    "(the start, whole trajectories, the rest); and the run's draws replayed through the "
    "same schedule with no overhead at all (lab/bench/schedule.py): the most any "
    "implementation of the schedule reaches on them, so what the run took beyond it is ours."
)


def print_bound(run: EmbeddedFigures, schedule: Schedule | None = None) -> None:
    """The overlap bound of a run, its efficiency, and the reference's serial loop; with
    the simulated costs (``schedule``), what an overhead-free run of the same draws takes
    (``lab.bench.schedule``)."""
    print(
        f"          bound {run.bound_jobs_per_s:6.2f} jobs/s (fast busy {run.fast_busy_s:.1f} s, "
        f"agents busy {run.agent_busy_s:.1f} s / {run.agent_workers}), efficiency "
        f"{run.efficiency:.2f}; the reference's serial loop on the same work "
        f"{run.serial_jobs_per_s:.2f} jobs/s"
    )
    if run.agents_bound and run.efficiency < 1:
        gap = run.seconds - run.agent_busy_s / run.agent_workers
        print(
            f"          gap to the bound {gap:.1f} s: {run.fill_s:.1f} s before the first "
            f"trajectory (a screen must come first), {run.tail_s:.1f} s whole trajectories "
            f"({run.agent_jobs} on {run.agent_workers} agent(s)), "
            f"{gap - run.fill_s - run.tail_s:.1f} s the rest"
        )
    if schedule is not None and run.draws:
        ideal = overhead_free(run.draws, schedule)
        print(
            f"          the same draws with no overhead at all: {ideal.seconds:.1f} s, "
            f"efficiency {ideal.efficiency:.3f} (the start and whole trajectories); this run "
            f"took {run.seconds - ideal.seconds:.1f} s more"
        )
