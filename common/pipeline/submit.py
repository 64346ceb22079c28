"""Submitting a corpus: its rows -> jobs in a batch, idempotently, then dispatched.

A job's idempotency key is built from the image's bytes (its content hash), the question,
the options and the configuration that decides answers (models and, for local
checkpoints, a fingerprint of their weights; agent, gate, funnel mode). The same request
under the same configuration is the same job: submitting it again, or re-running the same
command, finds the job instead of making a second one.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from common.config import Settings
from common.contracts import JobStatus, Priority, SourceRow
from common.errors import ImageError, InvalidInput, RetryableError
from common.images import content_hash, image_suffix, keep_bytes
from common.limits import check_id, check_query
from common.models.registry import protocol_name, weights_fingerprint
from common.pipeline.dispatch import Dispatcher, StoreOnly, send_waiting
from common.sources.reading import read_located
from common.store.cancels import requeue
from common.store.ids import idempotency_key, new_id
from common.store.liveness import hold_lease, release_lease
from common.store.new_jobs import NewItem, next_position, storable_item
from common.store.reads import batch_jobs
from common.store.submission import (
    Held,
    Statistics,
    get_or_create_batch,
    resolving_races,
    submit_items,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submitted:
    batch_id: str
    batch_created: bool
    jobs_created: int
    items_added: int
    sent_fast: int = 0  # jobs sent to the fast stage (waiting ones, new or left over)
    sent_slow: int = 0  # jobs sent to the agent (deferred, left over)


def run_config(settings: Settings) -> dict[str, Any]:
    """The settings that decide a job's answer (and so belong in its key)."""
    config: dict[str, Any] = {
        "small_model": settings.models.small.name,
        "large_model": settings.models.large.name,
        "weights": [
            weights_fingerprint(settings.models.small.name, "small"),
            weights_fingerprint(settings.models.large.name, "large"),
        ],
        "agent": settings.agent.kind,
        "protocols": [
            protocol_name(
                settings.models.small.name, "small", settings.models.protocol, settings.agent.kind
            ),
            protocol_name(
                settings.models.large.name, "large", settings.models.protocol, settings.agent.kind
            ),
        ],
        "backend": settings.models.backend,
        "gate": {
            "mode": settings.funnel.gate.mode,
            "top_k": settings.funnel.gate.top_k,
            "threshold": settings.funnel.gate.threshold,
        },
        "baseline": settings.funnel.baseline,
        "calibrate": settings.funnel.calibrate,
        "screener": settings.funnel.screener,
        "max_new_tokens": [
            settings.funnel.screen_max_new_tokens,
            settings.funnel.speculate_max_new_tokens,
            settings.agent.max_new_tokens,
        ],
        "agent_max_steps": settings.agent.max_steps,
    }
    if not settings.images.exif_rotate:  # (keys of the default stay what they were)
        config["exif_rotate"] = False
    if settings.funnel.method != "speceyes":
        config["method"] = settings.funnel.method
        config["specreason_threshold"] = settings.funnel.specreason_threshold
    return config


def to_item(row: SourceRow, settings: Settings) -> NewItem:
    """A source row with its image hashed. A row over the limits or with text the store
    cannot keep (``common.limits``), or with an unreadable image, makes a failed item.
    With ``sources.copy_images``, an image the reader did not keep is copied into the
    upload store and the job refers to the copy."""
    limits = settings.requests
    item = storable_item(row, limits)
    if row.error is not None or row.image_path is None:
        return replace(item, error=row.error or ("image_missing", "no image"))
    try:
        check_query(row.question, row.options, limits)
        check_id(row.item_id, "the row's id", limits)
        check_id(row.image_path, "the image path", limits)
        if row.expected is not None:
            check_id(row.expected, "the answer", limits)
    except InvalidInput as exc:
        return replace(item, error=(exc.code, f"{item.item_id}: {exc}"))
    if row.image_hash is not None:  # the reader read the image and hashed it already
        return replace(item, image_hash=row.image_hash)
    try:
        data = read_located(row.image_path, settings.images)
    except ImageError as exc:
        return replace(item, error=(exc.code, f"{row.item_id}: {exc}"))
    if settings.sources.copy_images:
        kept, digest = keep_bytes(data, settings.api.upload_dir, image_suffix(data))
        return replace(item, image_path=kept, image_hash=digest)
    return replace(item, image_hash=content_hash(data))


def submit_corpus(
    sessions: sessionmaker[Session],
    rows: Iterable[SourceRow],
    *,
    source: str,
    name: str,
    settings: Settings,
    dispatcher: Dispatcher | None = None,
    on_item: Callable[[], None] | None = None,
    priority: Priority = Priority.NORMAL,
    marked: dict[str, Any] | None = None,
) -> Submitted:
    """Create (or find) the batch for this source and configuration and add its rows, a
    chunk of ``sources.submit_rows`` at a time: each chunk is read and hashed (by a
    thread that stays a chunk ahead, ``ReadAhead``) and written in one transaction, and
    once it has committed its new jobs are sent to the ``dispatcher`` (with the first
    chunk, every job of a resumed batch that still waits for a stage, its cancelled ones
    included: running the command again resumes a cancelled batch). Without one, jobs
    wait in the store. Memory holds a few chunks, whatever the corpus's size; a run
    stopped halfway keeps the chunks it committed, and the same command resumes.

    One run at a time adds a batch's rows: a second run of the same corpus and settings
    (a retry, a second terminal) waits for the first to end (a lease in the store,
    ``SUBMIT_LEASE_S``, renewed with each chunk), then finds every row it made.
    New jobs wait at ``priority``; a job found again keeps the one it has. ``marked``:
    what makes this batch another one than the corpus's own (an estimate's sample): kept
    in its config and its key, never in its jobs' (which the corpus's run finds again).
    """
    config = run_config(settings)
    config_key = idempotency_key(config)
    batch_config = {**config, **(marked or {})}
    marked_key = idempotency_key(batch_config)  # (the config's own key, unless marked)
    total = Submitted("", False, 0, 0)
    held: Held | None = None  # what the batch held before this run (the first chunk says)
    batch_key = lease = ""
    holder = new_id()
    rank = priority.rank

    def item(row: SourceRow) -> NewItem:
        return replace(to_item(row, settings), priority=rank)

    read = ReadAhead(rows, item, settings.sources.submit_rows)
    statistics = Statistics()  # (a bulk load outruns autovacuum's analyze)
    try:
        with read as chunks:
            for chunk in chunks:
                if not batch_key:  # named by its source, first question and settings
                    batch_key = idempotency_key(source, [chunks.first_question], marked_key)
                    lease = f"submit:{batch_key}"
                    _wait_for_lease(sessions, lease, holder)
                first = held is None

                def create(
                    items: list[NewItem] = chunk,
                    first: bool = first,
                    batch_key: str = batch_key,
                    lease: str = lease,
                ) -> Submitted:
                    nonlocal held
                    created_jobs: list[tuple[str, str]] = []
                    with (dispatcher or StoreOnly()).transaction(sessions) as outbox:
                        if not hold_lease(outbox.session, lease, holder, SUBMIT_LEASE_S):
                            raise RetryableError(
                                "another run took over submitting this corpus (this one "
                                f"stalled over {SUBMIT_LEASE_S:.0f} s): run the command again"
                            )
                        batch, created = get_or_create_batch(
                            outbox.session,
                            key=batch_key,
                            name=name,
                            source=source,
                            config=batch_config,
                        )
                        if first:
                            held = Held(0 if created else next_position(outbox.session, batch.id))
                        jobs_created, items_added = submit_items(
                            outbox.session,
                            batch,
                            items,
                            config_key,
                            settings.funnel.method,
                            held=held,
                            created_jobs=created_jobs,
                        )
                        if first and not created:  # a cancelled batch resumes
                            requeue(outbox.session, batch_jobs(batch.id), [JobStatus.CANCELLED])
                        if first:  # (a resumed batch: what it left waiting, with this chunk's)
                            send_waiting(outbox, batch.id)
                        else:
                            outbox.to_fast(
                                (j for j, status in created_jobs if status == JobStatus.QUEUED),
                                stamped=True,
                            )
                            outbox.to_slow(
                                (j for j, status in created_jobs if status == JobStatus.DEFERRED),
                                stamped=True,
                            )
                    return Submitted(
                        batch.id,
                        created,
                        jobs_created,
                        items_added,
                        len(outbox.fast),
                        len(outbox.slow),
                    )

                # (a unique key another writer took at once: the second try finds it)
                done = resolving_races(create)
                statistics.grown(sessions, total.jobs_created + done.jobs_created)
                total = Submitted(
                    done.batch_id,
                    total.batch_created or (first and done.batch_created),
                    total.jobs_created + done.jobs_created,
                    total.items_added + done.items_added,
                    total.sent_fast + done.sent_fast,
                    total.sent_slow + done.sent_slow,
                )
                if on_item is not None:
                    for _ in chunk:
                        on_item()
    finally:
        if lease:
            with sessions.begin() as session:
                release_lease(session, lease, holder)
    if not total.batch_id:
        raise InvalidInput("the SOURCE has no rows")
    return total


SUBMIT_LEASE_S = 120.0  # a submitting run that stopped (killed) holds its corpus this long
_LEASE_POLL_S = 0.5


def _wait_for_lease(sessions: sessionmaker[Session], lease: str, holder: str) -> None:
    """Hold ``lease``, waiting while another run holds it."""
    said = False
    while True:
        with sessions.begin() as session:
            if hold_lease(session, lease, holder, SUBMIT_LEASE_S):
                return
        if not said:
            log.warning(
                "another run is submitting this corpus now (or stopped less than %.0f s "
                "ago): waiting for it, then resuming",
                SUBMIT_LEASE_S,
            )
            said = True
        time.sleep(_LEASE_POLL_S)  # (a lease in the store: nothing to wait on but time)


_DONE = object()  # what the reading thread puts last
_STOP_WAIT_S = 2.0  # how long leaving waits for the reading thread


class ReadAhead:
    """The rows of a corpus turned into items (``convert``: read, hashed) in chunks of
    ``size`` by a thread of its own, at most ``depth`` chunks ahead of the one being
    written: reading and hashing (much of it outside the GIL: file and network reads,
    sha256) overlap the database's work. ``first_question`` is the first row's question
    and options, once the first chunk is out. What the thread raises is raised by the
    iteration; leaving the block stops the thread."""

    def __init__(
        self,
        rows: Iterable[SourceRow],
        convert: Callable[[SourceRow], NewItem],
        size: int,
        depth: int = 2,
    ) -> None:
        self.rows, self.convert, self.size = rows, convert, size
        self.first_question: tuple[str, list[str] | None] | None = None
        self._chunks: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="read-ahead", daemon=True)

    def __enter__(self) -> ReadAhead:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        deadline = time.monotonic() + _STOP_WAIT_S
        while self._thread.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):  # (unblock a thread waiting to put)
                self._chunks.get(timeout=0.1)
        # a thread still inside a read (a stalled store) is left behind: it is a daemon

    def __iter__(self) -> Iterator[list[NewItem]]:
        while True:
            got = self._chunks.get()
            if got is _DONE:
                return
            if isinstance(got, BaseException):
                raise got
            yield got

    def _read(self) -> None:
        try:
            items: list[NewItem] = []
            for row in self.rows:
                if self._stop.is_set():  # (checked each row: Ctrl-C is not kept waiting)
                    return
                if self.first_question is None:
                    self.first_question = (row.question, row.options)
                items.append(self.convert(row))
                if len(items) == self.size:
                    self._put(items)
                    items = []
            if items:
                self._put(items)
            self._put(_DONE)
        except BaseException as exc:  # handed to the writing thread, which raises it
            self._put(exc)

    def _put(self, value: Any) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Full):
                self._chunks.put(value, timeout=0.1)
                return
