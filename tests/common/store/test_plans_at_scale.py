"""Every query behind a page, a claim, a record, a sweep, an export and a prune is served
by an index at a million jobs (issue 49), on PostgreSQL, where such a store lives.

The store holds one batch of a million jobs (half answered, half queued: written by
``lab.bench.scale.grow``, statistics refreshed as a live database's upkeep does, so a
fresh table's are not trusted) and one small batch of 200. Each operation runs for real
while every statement it sends is recorded; each recorded statement is then planned
(``EXPLAIN``) with its own parameters, and no plan may read ``jobs`` or ``batch_items``
whole (a ``Seq Scan``). The small batch's pages show a batch read through its index, not
by a scan of the million; the big batch's cursor is read half-way down.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, text

from api.app import create_app
from common.config import GateSettings, Settings
from common.contracts import Accepted, Queue, Stage
from common.pipeline.dispatch import Backlog, StoreOnly
from common.pipeline.reconcile import Reconciler
from common.store import claims, export, liveness, webhooks
from common.store.db import Store, open_store
from common.store.keys import create_key
from common.store.retention import prune
from lab.bench.scale import grow, new_batch
from lab.bench.ui import sign_in
from tests.helpers.services import POSTGRES_ADMIN_URL

JOBS = int(os.environ.get("SPECEYES_PLAN_JOBS", "1000000"))
SMALL = 200
WHOLE = ("jobs", "batch_items")
BACKGROUND = {"speceyes-notifier"}  # the webhook sender's thread (its own test below)


class Quiet(StoreOnly):
    """A broker whose queues hold messages sent a minute ago: the reconciler asks the
    store for what went out before them."""

    def backlog(self) -> Backlog:
        minute_ago = time.time() - 60
        queues = (Queue.FAST, Queue.SLOW)
        oldest = {(queue, rank): minute_ago for queue in queues for rank in (0, 1, 2)}
        return Backlog({**oldest, (Queue.AUDIT, None): None}, set())


class Recorded:
    """The statements a store's engine sends while ``recording``."""

    def __init__(self, store: Store) -> None:
        self.statements: list[tuple[str, Any]] = []
        self.on = False
        event.listen(store.engine, "before_cursor_execute", self._seen)

    def _seen(self, connection, cursor, statement, parameters, context, executemany) -> None:
        verb = statement.lstrip().split(None, 1)[0].upper()
        if threading.current_thread().name in BACKGROUND:
            return  # (the app's own poller, whenever it wakes: not the step's)
        if self.on and not executemany and verb in ("SELECT", "UPDATE", "DELETE", "WITH"):
            self.statements.append((statement, parameters))

    def during(self, step: Callable[[], Any]) -> list[tuple[str, Any]]:
        self.statements, self.on = [], True
        try:
            step()
        finally:
            self.on = False
        return self.statements


@pytest.fixture(scope="module")
def big(postgres_admin) -> Iterator[dict[str, Any]]:
    from sqlalchemy.engine import make_url

    name = f"speceyes_plans_{uuid.uuid4().hex[:10]}"
    with postgres_admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    store = open_store(url)
    try:
        with store.begin() as session:
            key, secret = create_key(session, "plans", admin=True)
        large = new_batch(store, key.tenant)
        grow(store, StoreOnly(), large, key.tenant, 0, JOBS)
        small = new_batch(store, key.tenant)
        grow(store, StoreOnly(), small, key.tenant, JOBS, JOBS + SMALL)
        settings = Settings(database_url=url)
        app = create_app(settings, dispatcher=StoreOnly(), sessions=store)
        with TestClient(app, base_url="https://testserver") as client:
            assert sign_in(client, secret)  # (the review UI's pages)
            client.headers["Authorization"] = f"Bearer {secret}"  # (the API's)
            yield {
                "store": store,
                "large": large,
                "small": small,
                "client": client,
                "recorded": Recorded(store),
                "settings": settings,
            }
    finally:
        store.close()
        with postgres_admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def scans_whole(store: Store, statements: list[tuple[str, Any]]) -> list[str]:
    """The statements whose plan reads ``jobs`` or ``batch_items`` whole."""
    found = []
    with store.engine.connect() as connection:
        cursor = connection.connection.cursor()
        for statement, parameters in statements:
            cursor.execute("EXPLAIN (FORMAT JSON) " + statement, parameters)
            plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            if any(node.get("Node Type") == "Seq Scan" and node.get("Relation Name") in WHOLE
                   for node in _nodes(plan[0]["Plan"])):  # fmt: skip
                found.append(statement)
    return found


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def served(big: dict[str, Any], step: Callable[[], Any]) -> list[tuple[str, Any]]:
    statements = big["recorded"].during(step)
    assert statements, "the step sent no statement to plan"
    assert scans_whole(big["store"], statements) == []
    return statements


def ok(response: Any) -> Any:
    assert response.status_code == 200, response.text[:300]
    return response


def test_a_claim_and_its_record_are_served_by_indexes(big):
    store = big["store"]
    tickets = []

    def claim() -> None:
        with store.begin() as session:
            tickets.extend(claims.claim(session, Stage.FAST, 32))

    served(big, claim)
    assert len(tickets) == 32

    def record() -> None:
        with store.begin() as session:
            outcomes = [Accepted(t.job_id, "A", 0.95, [0.95], None) for t in tickets]
            claims.record_fast(session, outcomes, GateSettings())

    served(big, record)


def test_a_reconciler_sweep_is_served_by_indexes(big):
    reconciler = Reconciler(big["store"], Quiet(), big["settings"], "plans")
    with big["store"].begin() as session:
        liveness.beat(session, "plans-worker", "fast")
    served(big, reconciler.sweep)


@pytest.mark.parametrize(
    "page",
    [
        "/ui/batches/{small}/results",
        "/ui/batches/{small}/results?status=failed",
        "/ui/batches/{small}/results?who=small&conf_min=0.5&conf_max=0.9",
        "/ui/batches/{small}/results?sort=confidence",
        "/v1/batches/{small}",
        "/v1/batches/{large}",
        "/v1/batches/{small}/review-queue",
        "/v1/batches/{large}/review-queue",
        "/v1/batches/{small}/rows",
        "/v1/batches/{large}/rows?after=p{half}",
        "/v1/batches/{large}/rows?after=p{half}&status=done",
        "/v1/jobs/{job}",
    ],
)
def test_a_page_is_served_by_indexes(big, page):
    path = page.format(small=big["small"], large=big["large"], half=JOBS // 2, job=f"{7:032d}")
    served(big, lambda: ok(big["client"].get(path)))


def test_an_export_streams_through_indexes(big):
    def read() -> None:
        with big["store"]() as session:
            assert sum(1 for _ in export.batch_rows(session, big["small"])) == SMALL

    served(big, read)


def test_the_batch_end_announcer_is_served_by_indexes(big):
    """The webhook sender's poll of ended batches (``webhooks.batches_ended``, each
    second in every API process) asks, for each listened-to batch not yet announced,
    whether a job of it has not finished: from the batch's kept counts (it was a hash of
    every batch row and unfinished job before they were kept)."""

    def poll() -> None:
        with big["store"].begin() as session:
            webhooks.batches_ended(session)

    served(big, poll)


def test_a_prune_of_nothing_old_is_served_by_indexes(big):
    """Each slice's choice is served by indexes. Which batches are open is read by one
    statement over the unfinished jobs (once every ``OPEN_BATCHES_READ_S``): half of this
    store, so the planner rightly reads the tables whole for it, and it is left out."""
    long_ago = datetime.now(UTC) - timedelta(days=3650)
    statements = big["recorded"].during(lambda: prune(big["store"], before=long_ago))
    open_read = [s for s in statements if s[0].startswith("SELECT DISTINCT batch_items.batch_id")]
    assert len(open_read) == 1
    slices = [s for s in statements if s not in open_read]
    assert slices and scans_whole(big["store"], slices) == []
