"""Following a batch to its end: a progress bar whose words say what the jobs are doing,
a line when nothing finishes for a while, and the summary after. ``annotate``, ``resume``
and ``retry`` follow their batch so."""

from __future__ import annotations

import shlex
import sys
import time
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from common.contracts import AnsweredBy, JobStatus
from common.pipeline.follow import Watch
from common.pipeline.runner import EmbeddedRunner
from common.store.reads import batch_counts

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from common.pipeline.dispatch import Dispatcher
    from common.pipeline.follow import RunResult
    from common.store.reads import BatchCounts

STALL_S = 30.0  # nothing finished this long: the bar says what the jobs are doing


def follow(
    dispatcher: Dispatcher, sessions: sessionmaker[Session], batch_id: str, no_progress: bool
) -> RunResult:
    """Until the batch is finished: worked here (embedded) or followed (workers)."""

    with sessions() as session:
        counts = batch_counts(session, batch_id)
    here = isinstance(dispatcher, EmbeddedRunner)
    with progress_bar(counts.jobs, "annotating", no_progress, initial=counts.finished) as bar:
        last: dict[str, Any] = {
            "finished": counts.finished,
            "at": time.monotonic(),
            "said": False,
            "counts": counts,
        }

        def progress(now: BatchCounts) -> None:
            last["counts"] = now
            bar.set_postfix_str(_postfix(now), refresh=False)  # (shown by the update)
            bar.update(now.finished - bar.n)
            bar.refresh()
            if now.finished != last["finished"]:
                last.update(finished=now.finished, at=time.monotonic(), said=False)
            elif here and not last["said"] and time.monotonic() - last["at"] > STALL_S:
                say_line(
                    f"nothing finished for {STALL_S:g} s: {_waiting(now)}; the models "
                    "are working here (a loaded machine, or long trajectories, take longer)"
                )
                last["said"] = True

        def stalled(seconds: float) -> None:
            bar.write(
                f"nothing finished for {seconds:.0f} s ({_waiting(last['counts'])}): are workers "
                "running? (speceyes worker fast / speceyes worker slow, same --db and --broker)"
            )

        def outage(seconds: float, reason: str | None) -> None:
            if reason is None:
                bar.write(f"the job store answers again after {seconds:.0f} s; following on")
            else:
                bar.write(
                    f"the job store does not answer ({reason}) for {seconds:.0f} s; waiting "
                    "for it (the workers keep their results until it is back)"
                )

        watch = Watch(on_progress=progress, on_stall=stalled, on_outage=outage)
        return dispatcher.wait(sessions, batch_id, watch)


def _waiting(now: BatchCounts) -> str:
    """What the unfinished jobs are doing, for a line about a stall."""
    return (
        f"{now.by_status[JobStatus.RUNNING]} running, {now.by_status[JobStatus.QUEUED]} waiting "
        f"for the fast stage, {now.by_status[JobStatus.DEFERRED]} for the agent"
    )


def say_line(line: str) -> None:
    """A line on stderr that does not break a progress bar."""
    tqdm.write(line, file=sys.stderr)


def _postfix(now: BatchCounts) -> str:
    """The bar's words, from the same counts as its number (and as the summary)."""
    return (
        f"small {now.by_answerer[AnsweredBy.SMALL]} | agent {now.by_answerer[AnsweredBy.LARGE]} "
        f"| failed {now.by_status[JobStatus.FAILED]} | running {now.by_status[JobStatus.RUNNING]} "
        f"| waiting {now.by_status[JobStatus.QUEUED] + now.by_status[JobStatus.DEFERRED]}"
    )


def progress_bar(
    total: int | None, label: str, disabled: bool, initial: int = 0, unit: str = "job"
) -> Any:
    return tqdm(
        total=total,
        initial=initial,
        desc=label,
        unit=unit,
        disable=disabled,
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=0.5,
    )


def print_summary(result: RunResult, name: str) -> None:
    counts = result.counts
    done, failed = counts.by_status[JobStatus.DONE], counts.by_status[JobStatus.FAILED]
    small, large = counts.by_answerer[AnsweredBy.SMALL], counts.by_answerer[AnsweredBy.LARGE]
    share = f"{small / counts.jobs:.1%}" if counts.jobs else "-"
    print(f"jobs         {counts.jobs} ({counts.items} rows)")
    print(f"done         {done}: small model {small} ({share} of jobs), agent {large}")
    unfinished = counts.jobs - counts.finished
    if unfinished:
        print(f"unfinished   {unfinished}")
    failures = ", ".join(f"{code} {n}" for code, n in counts.failures.most_common())
    print(f"failed       {failed}" + (f": {failures}" if failures else ""))
    cancelled = counts.by_status[JobStatus.CANCELLED]
    if cancelled:
        reasons = ", ".join(f"{code} {n}" for code, n in counts.cancellations.most_common())
        resume = f"speceyes resume {shlex.quote(name)}"
        print(f"cancelled    {cancelled}: {reasons} ({resume} takes them up)")
    if failed:
        listing = f"speceyes jobs list {shlex.quote(name)} --status failed"
        print(f"             ({listing}: each one's file and reason)")
    beta = f"{counts.beta:.2f}" if counts.beta is not None else "-"
    alpha = f"{counts.alpha:.2f}" if counts.alpha is not None else "-"
    print(f"beta         {beta} (share screened tool-free)")
    print(f"alpha        {alpha} (share of speculated answers accepted)")
    rate = f"{result.finished_now / result.seconds:.2f} jobs/s" if result.seconds else "-"
    print(f"this run     {result.finished_now} jobs in {result.seconds:.1f} s, {rate}")
