"""Cancel, resume and retry: what the API, the command line and the review pages do to a
job or a batch that is (or was) under way. The rows change in ``common.store.cancels``;
here the work that waits again is sent to its stage, after the commit, as every send
is (``Dispatcher.transaction``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from common.contracts import CancelReason, JobStatus
from common.errors import InvalidInput
from common.pipeline.dispatch import Dispatcher, send_waiting
from common.store import cancels, openai_batches, webhooks
from common.store.cancels import CancelResult
from common.store.reads import batch_jobs
from common.store.tables import Batch, Job

Check = Callable[[Session, int], None]  # (a transaction, jobs to add): raises to refuse


class AlreadyFinished(InvalidInput):
    """The job finished before the cancel: its result is kept, nothing is cancelled."""

    code = "already_finished"


class NothingToRetry(InvalidInput):
    """A retry found no failed or cancelled job to run again."""

    code = "nothing_to_retry"


@dataclass(frozen=True)
class Requeued:
    batch_id: str
    job_ids: list[str]  # the jobs that wait for a stage again, and were sent


def cancel_job(session: Session, job: Job) -> CancelResult:
    """Cancel one job. Again on a cancelled job: nothing changes. A job that finished
    otherwise (done, failed) is ``AlreadyFinished``."""
    if job.status in (JobStatus.DONE, JobStatus.FAILED):
        raise AlreadyFinished(f"job {job.id} is {job.status} already: there is nothing to cancel")
    return cancels.cancel(session, [job.id], CancelReason.CANCELLED)


def cancel_batch(
    session: Session, batch_id: str, reason: CancelReason = CancelReason.CANCELLED
) -> CancelResult:
    """Cancel what of the batch has not finished; what has is kept, and so is a job
    another batch shares (``cancels.batch_own_jobs``). Its listeners are told
    (``batch.cancelled``) when this stopped anything."""
    result = cancels.cancel(session, cancels.batch_own_jobs(batch_id), reason)
    openai_batches.cancelled_elsewhere(session, batch_id)
    batch = session.get(Batch, batch_id)
    if result.changed and batch is not None:
        webhooks.batch_cancelled(session, batch, reason)
    return result


def resume_batch(
    sessions: sessionmaker[Session],
    dispatcher: Dispatcher,
    batch_id: str,
    check: Check | None = None,
) -> Requeued:
    """The batch's cancelled jobs wait for their stage again and are sent (with anything
    else of the batch that waits); done work is not redone. Nothing cancelled: nothing
    changes. ``check``: asked first, in the transaction, whether the jobs may run again
    (it raises to refuse: nothing changes; asked before, as a requeued job's day is
    over: it no longer counts as finished)."""
    return _requeue_batch(sessions, dispatcher, batch_id, [JobStatus.CANCELLED], None, check)


def retry_batch(
    sessions: sessionmaker[Session],
    dispatcher: Dispatcher,
    batch_id: str,
    code: str | None = None,
    check: Check | None = None,
) -> Requeued:
    """The batch's failed and cancelled jobs (of error ``code`` only, if given) run again,
    under the same batch. None of them: ``NothingToRetry``. ``check``: as ``resume_batch``."""
    statuses = [JobStatus.FAILED, JobStatus.CANCELLED]
    return _requeue_batch(sessions, dispatcher, batch_id, statuses, code, check, retry=True)


def _requeue_batch(
    sessions: sessionmaker[Session],
    dispatcher: Dispatcher,
    batch_id: str,
    statuses: list[JobStatus],
    code: str | None,
    check: Check | None,
    *,
    retry: bool = False,
) -> Requeued:
    """The batch's jobs in ``statuses`` (of error ``code``) wait again and are sent, with
    its budget and its OpenAI batch live again; ``retry``: none is ``NothingToRetry``."""
    with dispatcher.transaction(sessions) as outbox:
        if check is not None:
            check(outbox.session, 1)
        ids = cancels.requeue(outbox.session, batch_jobs(batch_id), statuses, code)
        if retry and not ids:
            which = f"with error {code!r} " if code else ""
            raise NothingToRetry(f"batch {batch_id} has no failed or cancelled job {which}to retry")
        _budget_live_again(outbox.session, batch_id)
        openai_batches.reopened(outbox.session, batch_id)
        send_waiting(outbox, batch_id)
    return Requeued(batch_id, ids)


def retry_job(
    sessions: sessionmaker[Session],
    dispatcher: Dispatcher,
    job_id: str,
    check: Check | None = None,
) -> bool:
    """One failed or cancelled job runs again (a job sent alone has no batch to resume);
    whether it was requeued. Done, waiting or running: ``NothingToRetry``. ``check``: as
    ``resume_batch``."""
    statuses = [JobStatus.FAILED, JobStatus.CANCELLED]
    with dispatcher.transaction(sessions) as outbox:
        if check is not None:
            check(outbox.session, 1)
        if not cancels.requeue(outbox.session, [job_id], statuses):
            raise NothingToRetry(
                f"job {job_id} is neither failed nor cancelled (or its image "
                "was never kept): there is nothing to run again"
            )
        job = outbox.session.get(Job, job_id)
        assert job is not None
        (outbox.to_fast if job.status == JobStatus.QUEUED else outbox.to_slow)([job_id])
    return True


def _budget_live_again(session: Session, batch_id: str) -> None:
    """A batch taken up again is no longer stopped: its failure budget applies anew, and
    its next end is announced (``batch.finished``) anew."""
    batch = session.get(Batch, batch_id)
    if batch is not None:
        batch.stopped = None
    webhooks.reopened(session, batch_id)
