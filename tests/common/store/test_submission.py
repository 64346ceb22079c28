"""Submission to the job store on SQLite and PostgreSQL, schema built by the migrations."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import inspect, select

from common.errors import IdempotencyConflict, NotFound
from common.store import new_jobs, submission
from common.store.db import downgrade, make_engine, migrate
from common.store.tables import Batch, BatchItem, Job
from tests.helpers.store import items, new_batch


def test_the_migrations_build_and_remove_the_schema(database_url):
    engine = make_engine(database_url)
    migrate(engine)
    assert {"jobs", "batches", "batch_items", "alembic_version"} <= set(
        inspect(engine).get_table_names()
    )
    downgrade(engine)
    assert "jobs" not in inspect(engine).get_table_names()
    migrate(engine)  # and back up again
    assert "jobs" in inspect(engine).get_table_names()
    engine.dispose()


def test_submitting_twice_makes_each_job_once(sessions):
    with sessions.begin() as session:
        batch = new_batch(session)
        assert submission.submit_items(session, batch, items("x", "y", "z"), "cfg") == (3, 3)
    with sessions.begin() as session:
        batch = new_batch(session)  # found, not created
        assert submission.submit_items(session, batch, items("x", "y", "z"), "cfg") == (0, 0)
    with sessions() as session:
        assert session.query(Job).count() == 3 and session.query(BatchItem).count() == 3
        assert session.query(Batch).count() == 1


def test_the_same_request_in_two_batches_is_one_job(sessions):
    with sessions.begin() as session:
        first, second = new_batch(session, "one"), new_batch(session, "two")
        submission.submit_items(session, first, items("x"), "cfg")
        assert submission.submit_items(session, second, items("x"), "cfg") == (0, 1)
        other_config = new_batch(session, "three")
        assert submission.submit_items(session, other_config, items("x"), "other-cfg") == (1, 1)


def test_a_broken_item_is_a_failed_job_with_its_reason(sessions):
    broken = new_jobs.NewItem(
        0, "row-3", "", error=("invalid_input", "m.jsonl line 3: missing question")
    )
    with sessions.begin() as session:
        submission.submit_items(session, new_batch(session), [broken], "cfg")
    with sessions() as session:
        job = session.scalars(select(Job)).one()
        assert (job.status, job.error_code) == ("failed", "invalid_input")
        assert job.error_message == "m.jsonl line 3: missing question"


def test_a_client_key_names_one_job_and_refuses_other_content(sessions):
    (item,) = items("x")
    with sessions.begin() as session:
        first = submission.submit_job(session, item, client_key="k1", batch_id=None)
    with sessions.begin() as session:
        again = submission.submit_job(session, item, client_key="k1", batch_id=None)
        assert (again.id, again.created, first.created) == (first.id, False, True)
        other = new_jobs.NewItem(0, "x", "Another question?", image_hash=item.image_hash)
        with pytest.raises(IdempotencyConflict):
            submission.submit_job(session, other, client_key="k1", batch_id=None)
        with pytest.raises(NotFound):
            submission.submit_job(session, item, client_key=None, batch_id="0" * 32)


def test_a_job_joins_the_end_of_a_batch_and_a_client_batch_is_made_once(sessions):
    with sessions.begin() as session:
        made = submission.submit_batch(session, items("a", "b"), name="n", client_key="b1")
    with sessions.begin() as session:
        again = submission.submit_batch(session, items("a", "b"), name="n", client_key="b1")
        assert (again.id, again.job_ids, again.queued) == (made.id, made.job_ids, [])
        assert made.created and not again.created and made.queued == made.job_ids
        (extra,) = items("c")
        job = submission.submit_job(session, extra, client_key=None, batch_id=made.id)
    with sessions() as session:
        rows = session.scalars(select(BatchItem).where(BatchItem.batch_id == made.id))
        assert [(row.position, row.job_id) for row in rows] == [
            (0, made.job_ids[0]),
            (1, made.job_ids[1]),
            (2, job.id),
        ]


def test_keys_from_before_tenants_become_tenants_of_their_own_name(database_url):
    from sqlalchemy import text

    engine = make_engine(database_url)
    migrate(engine, "0006")
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO api_keys (id, name, key_hash, created_at) "
                "VALUES ('k1', 'old-service', 'h1', CURRENT_TIMESTAMP)"
            )
        )
    migrate(engine)
    with engine.connect() as connection:
        row = connection.execute(text("SELECT tenant, admin FROM api_keys")).one()
    assert (row.tenant, bool(row.admin)) == ("old-service", False)
    engine.dispose()


def test_a_bulk_submission_analyzes_the_job_tables_as_they_grow(database_url):
    """ANALYZE after the first 1,000 jobs of a run and each time they double (PostgreSQL;
    SQLite plans without it), so claims and records are planned for the table there is."""
    from sqlalchemy import text

    from common.store.db import open_store

    sessions = open_store(database_url)
    try:
        statistics = submission.Statistics(first=1000)
        assert not statistics.grown(sessions, 999)
        on_postgres = database_url.startswith("postgresql")
        assert statistics.grown(sessions, 1000) == on_postgres
        assert not statistics.grown(sessions, 1999)  # (not doubled yet)
        assert statistics.grown(sessions, 2000) == on_postgres
        if on_postgres:
            with sessions() as session:
                analyzed = session.scalar(
                    text("SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'jobs'")
                )
            assert analyzed is not None
    finally:
        sessions.close()


def test_a_submission_small_beside_what_the_statistics_count_analyzes_nothing(postgres_url):
    """A thousand jobs added to a table whose statistics count 12,000 change no plan:
    no ANALYZE (it would cost a small submission more than its rows at a million jobs);
    2,000 (over a tenth of them) do get one."""
    from common.pipeline.dispatch import StoreOnly
    from common.store.db import open_store
    from lab.bench.scale import grow, new_batch

    sessions = open_store(postgres_url)
    try:
        grow(sessions, StoreOnly(), new_batch(sessions, None), None, 0, 12_000)  # (analyzed)
        statistics = submission.Statistics(first=1000)
        assert not statistics.grown(sessions, 1000)
        assert statistics.grown(sessions, 2000)
    finally:
        sessions.close()


def test_held_marks_each_position_it_took_and_no_other():
    held = submission.Held(before=None)
    taken = {0, 7, 8, 9, 15, 16, 63, 64, 200}
    for position in sorted(taken):
        held.take(position)
    assert [p for p in range(260) if held.taken(p)] == sorted(taken)


def test_the_default_statistics_analyze_after_the_first_thousand_jobs(postgres_url):
    from common.store.db import open_store

    sessions = open_store(postgres_url)
    try:
        statistics = submission.Statistics()
        assert not statistics.grown(sessions, 999) and statistics.grown(sessions, 1000)
    finally:
        sessions.close()


def test_job_tables_locked_by_maintenance_are_not_waited_for(postgres_url):
    """A table another transaction holds (a VACUUM FULL, an index being built) is skipped
    after the lock timeout: the submission goes on, analyzed at the next doubling."""
    from sqlalchemy import text

    from common.store.db import open_store

    sessions = open_store(postgres_url)
    try:
        with sessions.begin() as holder:
            holder.execute(text("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"))
            assert submission.Statistics(first=10).grown(sessions, 10) is False
    finally:
        sessions.close()


def test_a_one_row_batch_submitted_again_adds_nothing(sessions):
    with sessions.begin() as session:
        submission.submit_items(session, new_batch(session), items("x"), "cfg")
    with sessions.begin() as session:
        again = submission.submit_items(
            session, new_batch(session), items("x"), "cfg", held=submission.Held(before=1)
        )
        assert again == (0, 0)


def test_rows_with_one_id_each_keep_their_own_job_when_submitted_again(sessions):
    """Two items of a corpus with the same id (and other questions) take the held rows in
    order: the first item the first row, the second the second; nothing is re-pointed."""
    first, second = items("x", question="First?")[0], items("x", question="Second?")[0]
    twins = [first, replace(second, position=1)]
    with sessions.begin() as session:
        submission.submit_items(session, new_batch(session), twins, "cfg")
    with sessions() as session:
        before = [(row.position, row.job_id) for row in session.scalars(select(BatchItem))]
    with sessions.begin() as session:
        assert submission.submit_items(session, new_batch(session), twins, "cfg") == (0, 0)
    with sessions() as session:
        rows = session.scalars(select(BatchItem).order_by(BatchItem.position))
        assert [(row.position, row.job_id) for row in rows] == sorted(before)


def test_a_held_row_whose_item_changed_points_at_its_new_job_and_a_broken_one_keeps_its_own(
    sessions,
):
    with sessions.begin() as session:
        submission.submit_items(session, new_batch(session), items("x", "y"), "cfg")
    with sessions() as session:
        old = dict(session.execute(select(BatchItem.item_id, BatchItem.job_id)).all())
    mended = items("x", question="Another question?")[0]
    broken = new_jobs.NewItem(1, "y", "", error=("image_error", "y.png: unreadable"))
    with sessions.begin() as session:
        assert submission.submit_items(session, new_batch(session), [mended, broken], "cfg") == (
            1,
            0,
        )
    with sessions() as session:
        now = dict(session.execute(select(BatchItem.item_id, BatchItem.job_id)).all())
        assert now["y"] == old["y"]  # (broken for now: the answer it has is kept)
        assert now["x"] != old["x"]
        assert session.get(Job, now["x"]).question == "Another question?"
        # the old job, held by no row, waits no more: no worker spends model time on it
        ended = session.get(Job, old["x"])
        assert (ended.status, ended.error_code) == ("cancelled", "superseded")
        assert session.get(Job, old["y"]).status == "queued"


def test_a_superseded_job_another_batch_holds_goes_on_for_it(sessions):
    with sessions.begin() as session:
        for key in ("first", "second"):  # (the same rows and settings: one job each)
            submission.submit_items(session, new_batch(session, key), items("x"), "cfg")
    with sessions() as session:
        (shared,) = set(session.scalars(select(BatchItem.job_id)))
    mended = items("x", question="Another question?")
    with sessions.begin() as session:
        submission.submit_items(session, new_batch(session, "first"), mended, "cfg")
    with sessions() as session:
        assert session.get(Job, shared).status == "queued"  # (the second batch's row)


def test_a_corpus_of_more_ids_than_one_lookup_holds_is_matched_whole(sessions):
    """The held rows are read 500 ids a query: 1,001 ids take three, and none is missed."""
    names = [f"i{n:04d}" for n in range(1001)]
    with sessions.begin() as session:
        submission.submit_items(session, new_batch(session), items(*names), "cfg")
    with sessions.begin() as session:
        assert submission.submit_items(session, new_batch(session), items(*names), "cfg") == (
            0,
            0,
        )


def test_a_tenant_appends_a_job_to_its_own_batch(sessions):
    (item,) = items("x")
    with sessions.begin() as session:
        batch = submission.submit_batch(session, items("a"), name="n", client_key=None, tenant="t")
        job = submission.submit_job(session, item, client_key=None, batch_id=batch.id, tenant="t")
        assert session.get(BatchItem, (batch.id, 1)).job_id == job.id
        with pytest.raises(NotFound):
            submission.submit_job(session, item, client_key=None, batch_id=batch.id, tenant="u")


def test_an_api_batchs_job_keys_are_the_funnels_as_they_always_were(sessions):
    """An upgrade must not change a key: the same request then finds its job again. The
    funnel's job key names no method; another method's does."""
    from common.store.ids import idempotency_key

    (item,) = items("x")
    with sessions.begin() as session:
        funnel = submission.submit_batch(session, [item], name="n", client_key=None, tenant="t")
        other = submission.submit_batch(
            session, [item], name="n", client_key=None, tenant="t", method="specreason"
        )
        keys = [session.get(Job, made.job_ids[0]).idempotency_key for made in (funnel, other)]
        # (and the batch's config names the method where it is not the funnel: the report)
        configs = [session.get(Batch, made.id).config for made in (funnel, other)]
    assert configs == [{}, {"method": "specreason"}]
    facts = (item.image_hash, item.question, item.options)
    assert keys == [
        idempotency_key(*facts, idempotency_key("api", "tenant:t")),
        idempotency_key(*facts, idempotency_key("api", "tenant:t", "specreason")),
    ]


def test_a_job_appended_without_an_item_id_is_its_rows_id(sessions):
    with sessions.begin() as session:
        batch = submission.submit_batch(session, items("a"), name="n", client_key=None)
        loose = new_jobs.NewItem(0, "", "Q?", ["a", "b"], "/img/l.png", image_hash="hash-l")
        job = submission.submit_job(session, loose, client_key=None, batch_id=batch.id)
        assert session.get(BatchItem, (batch.id, 1)).item_id == job.id


def test_a_batch_whose_rows_all_fail_at_intake_is_stopped_by_its_budget_at_once(sessions):
    broken = [
        new_jobs.NewItem(n, f"r{n}", "", error=("invalid_input", "no question")) for n in range(3)
    ]
    with sessions.begin() as session:
        made = submission.submit_batch(session, broken, name="n", client_key=None, budget=(0.5, 2))
    with sessions() as session:
        assert session.get(Batch, made.id).stopped.startswith("failure_budget: 3 of 3")


def test_a_run_in_chunks_matches_only_the_rows_held_before_it(sessions):
    """A grown corpus sent in chunks: an id seen twice in this run (twins) is two new rows,
    not one, though the first twin's row exists by the time the second chunk comes."""
    with sessions.begin() as session:
        submission.submit_items(session, new_batch(session), items("x"), "cfg")
    held = submission.Held(before=1)
    first, twin = items("x", "y")[1], replace(items("y", question="Other?")[0], position=2)
    with sessions.begin() as session:
        batch = new_batch(session)
        assert submission.submit_items(session, batch, [first], "cfg", held=held) == (1, 1)
    with sessions.begin() as session:
        batch = new_batch(session)
        assert submission.submit_items(session, batch, [twin], "cfg", held=held) == (1, 1)


def test_a_job_sent_alone_announces_its_end_and_one_in_a_batch_leaves_it_to_the_batch(
    sessions,
):
    (item,) = items("x")
    with sessions.begin() as session:
        batch = submission.submit_batch(session, items("a"), name="n", client_key=None)
        alone = submission.submit_job(session, item, client_key=None, batch_id=None)
        joined = submission.submit_job(session, item, client_key=None, batch_id=batch.id)
        assert [session.get(Job, made.id).announces for made in (alone, joined)] == [True, False]


def test_a_batch_with_jobs_of_its_own_shares_none_with_an_earlier_one(sessions):
    with sessions.begin() as session:
        first = submission.submit_batch(session, items("a", "b"), name="n", client_key=None)
        again = submission.submit_batch(
            session, items("a", "b"), name="n", client_key=None, own_jobs=True
        )
        shared = submission.submit_batch(session, items("a", "b"), name="n", client_key=None)
    assert not set(first.job_ids) & set(again.job_ids) and len(again.queued) == 2
    assert shared.job_ids == first.job_ids
