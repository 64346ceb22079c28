"""Submitting a corpus: its rows -> jobs in a batch, idempotently, then dispatched.

A job's idempotency key is built from the image's bytes (its content hash), the question,
the options and the configuration that decides answers (models and, for local
checkpoints, a fingerprint of their weights; agent, gate, funnel mode). The same request
under the same configuration is the same job: submitting it again, or re-running the same
command, finds the job instead of making a second one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from common.config import Settings
from common.contracts import SourceRow
from common.dispatch import Dispatcher, StoreOnly, send_waiting
from common.errors import ImageError, InvalidInput
from common.images import content_hash, read_image_bytes
from common.limits import check_id, check_query
from common.models.registry import protocol_name, weights_fingerprint
from common.store.submission import (
    NewItem,
    get_or_create_batch,
    idempotency_key,
    resolving_races,
    storable_item,
    submit_items,
)


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
    cannot keep (``common.limits``), or with an unreadable image, makes a failed item."""
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
    if row.image_hash is not None:  # the reader kept the image and hashed it already
        return replace(item, image_hash=row.image_hash)
    try:
        digest = content_hash(read_image_bytes(row.image_path, settings.images))
    except ImageError as exc:
        return replace(item, error=(exc.code, f"{row.item_id}: {exc}"))
    return replace(item, image_hash=digest)


def submit_corpus(
    sessions: sessionmaker[Session],
    rows: Sequence[SourceRow],
    *,
    source: str,
    name: str,
    settings: Settings,
    dispatcher: Dispatcher | None = None,
    on_item: Callable[[], None] | None = None,
) -> Submitted:
    """Create (or find) the batch for this source and configuration and add its rows;
    once that has committed, send every job of the batch that waits for a stage to the
    ``dispatcher`` (a resumed batch's leftovers too). Without one, jobs wait in the store.
    """
    config = run_config(settings)
    config_key = idempotency_key(config)
    question_key = [(row.question, row.options) for row in rows[:1]]
    batch_key = idempotency_key(source, question_key, config_key)
    items = []
    for row in rows:
        items.append(to_item(row, settings))
        if on_item is not None:
            on_item()

    def create() -> Submitted:
        with (dispatcher or StoreOnly()).transaction(sessions) as outbox:
            batch, created = get_or_create_batch(
                outbox.session, key=batch_key, name=name, source=source, config=config
            )
            jobs_created, items_added = submit_items(
                outbox.session, batch, items, config_key, settings.funnel.method
            )
            send_waiting(outbox, batch.id)
        return Submitted(
            batch.id, created, jobs_created, items_added, len(outbox.fast), len(outbox.slow)
        )

    # the same corpus submitted at once elsewhere: the second run finds what it made
    return resolving_races(create)
