"""Retention: finished jobs removed after a date, with what only they held.

``prune`` removes, in slices of ``SLICE`` jobs (one transaction each), the jobs that
finished (done, failed or cancelled) before a date:

- never a job that is not finished, nor one that shares a batch with a job that is not
  (an open batch keeps every row it counts and exports);
- with ``keep_reviewed``, never a job a person reviewed (a label is worth keeping);
- with each job its rows in every batch that holds it, and then the batches left with
  no rows (their OpenAI batch record goes with them);
- after each slice commits, the uploaded images (files under ``upload_dir``) that no
  job left in the store names: a crash between the two leaves a file behind, never a job
  without its image.

Each slice locks the rows it chose (passing over those another transaction holds): a
job retried or reviewed meanwhile is left alone. Which batches are open is read when the
prune starts and every ``OPEN_BATCHES_READ_S`` after: a batch reopened meanwhile (a
resume) may lose rows finished before the date until the next read.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sqlalchemy import ColumnElement, delete, exists, func, select
from sqlalchemy.orm import Session, sessionmaker

from common.contracts import FINISHED, UNFINISHED
from common.images import ORIGINAL
from common.store.tables import Batch, BatchItem, Job

SLICE = 1000
# how often a prune reads again which batches are open (a batch reopened meanwhile, by a
# resume, is spared from then on): once a slice would cost a read of every unfinished
# job per thousand jobs pruned (minutes a slice at half a million waiting)
OPEN_BATCHES_READ_S = 10.0


@dataclass
class Pruned:
    """What a prune removed (or, dry, would remove)."""

    jobs: int = 0
    batch_rows: int = 0
    batches: int = 0
    images: int = 0
    touched: set[str] = field(default_factory=set)  # batches that lost rows


def prunable(
    before: datetime, *, keep_reviewed: bool, open_batches: Collection[str]
) -> ColumnElement[bool]:
    """The jobs a prune may remove, as a condition on ``Job`` (``open_batches``: the
    batches that hold a job not finished, ``open_batch_ids``)."""
    in_open_batch = exists().where(
        BatchItem.job_id == Job.id, BatchItem.batch_id.in_(sorted(open_batches))
    )
    condition = Job.status.in_(FINISHED) & (Job.finished_at < before) & ~in_open_batch
    if keep_reviewed:
        condition &= Job.reviewed_at.is_(None)
    return condition


def open_batch_ids(session: Session) -> set[str]:
    """The batches that hold a job not finished: one read through the unfinished jobs
    (an index leads with status), however large the finished part of the store."""
    query = (
        select(BatchItem.batch_id)
        .join(Job, Job.id == BatchItem.job_id)
        .where(Job.status.in_(UNFINISHED))
        .distinct()
    )
    return set(session.scalars(query))


def prune(
    sessions: sessionmaker[Session],
    *,
    before: datetime,
    keep_reviewed: bool = False,
    upload_dir: Path | None = None,
    dry_run: bool = False,
    on_slice: Callable[[Pruned], None] | None = None,
) -> Pruned:
    """Remove what the module's docstring says; ``dry_run``: count it, remove nothing."""
    done = Pruned()
    open_read_at = -math.inf
    while True:
        if time.monotonic() - open_read_at > OPEN_BATCHES_READ_S:
            with sessions() as session:
                open_batches = open_batch_ids(session)
            open_read_at = time.monotonic()
        condition = prunable(before, keep_reviewed=keep_reviewed, open_batches=open_batches)
        if dry_run:
            with sessions() as session:
                query = select(func.count()).select_from(Job).where(condition)
                done.jobs = session.scalar(query) or 0
            return done
        with sessions.begin() as session:
            # (locked as chosen: a row another transaction holds, a retry or a review,
            # is passed over, and one it changed is asked the condition again)
            chosen_rows = select(Job.id, Job.image_path).where(condition).limit(SLICE)
            rows = session.execute(chosen_rows.with_for_update(of=Job, skip_locked=True))
            chosen = {job_id: path for job_id, path in rows}
            gone = list(chosen)
            if not gone:
                break
            done.touched |= set(
                session.scalars(select(BatchItem.batch_id).where(BatchItem.job_id.in_(gone)))
            )
            removed = session.execute(delete(BatchItem).where(BatchItem.job_id.in_(gone)))
            done.batch_rows += removed.rowcount  # type: ignore[attr-defined]
            session.execute(delete(Job).where(Job.id.in_(gone)))
            done.jobs += len(gone)
        if upload_dir is not None:
            done.images += _remove_orphan_images(sessions, [chosen[j] for j in gone], upload_dir)
        if on_slice is not None:
            on_slice(done)
    done.batches = _remove_empty_batches(sessions, done.touched)
    return done


def _remove_orphan_images(
    sessions: sessionmaker[Session], paths: list[str | None], upload_dir: Path
) -> int:
    """Remove the files among ``paths`` that lie under ``upload_dir`` and that no job
    left in the store names (and the file each was made from, kept beside it:
    ``images.keep_original``); how many."""
    root = upload_dir.resolve()
    ours = {
        path
        for path in paths
        if path and Path(path).resolve().is_relative_to(root) and Path(path).is_file()
    }
    if not ours:
        return 0
    with sessions() as session:
        named = set(session.scalars(select(Job.image_path).where(Job.image_path.in_(ours))))
    removed = 0
    for path in ours - named:
        Path(path).unlink(missing_ok=True)
        Path(path).with_suffix(ORIGINAL).unlink(missing_ok=True)
        removed += 1
    return removed


def _remove_empty_batches(sessions: sessionmaker[Session], batch_ids: set[str]) -> int:
    """Remove the batches among ``batch_ids`` that hold no row now; how many."""
    removed = 0
    ids = sorted(batch_ids)
    for start in range(0, len(ids), SLICE):
        part = ids[start : start + SLICE]
        with sessions.begin() as session:
            holding = exists().where(BatchItem.batch_id == Batch.id)
            result = session.execute(delete(Batch).where(Batch.id.in_(part), ~holding))
            removed += result.rowcount  # type: ignore[attr-defined]
    return removed
