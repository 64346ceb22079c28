"""Webhooks (issue 46, point 4): events are written with the change they tell of, and
delivered signed, at least once, through a receiver that is down, fails, is slow, and
finally answers; a sender killed mid-delivery loses nothing; URLs this side of the
network are refused."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select
from standardwebhooks import Webhook

from common.config import GateSettings, WebhookSettings
from common.contracts import Accepted, CancelReason, ScreenResult, Stage
from common.errors import InvalidInput
from common.pipeline import cancel
from common.pipeline.notify import Notifier, UnsafeUrl, check_url, resolved
from common.store import claims, submission, webhooks
from common.store.tables import Job, WebhookAttempt, WebhookDelivery, WebhookEvent
from tests.helpers.receiver import Received, receiver
from tests.helpers.store import items
from tests.helpers.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]
QUICK = WebhookSettings(
    allow_hosts=["127.0.0.1"], first_retry_s=0.05, max_retry_s=0.2, timeout_s=0.5, poll_s=0.05
)


def _events(session, type_: str | None = None) -> list[WebhookEvent]:
    query = select(WebhookEvent).order_by(WebhookEvent.id)
    if type_ is not None:
        query = query.where(WebhookEvent.type == type_)
    return list(session.scalars(query))


def _answer_all(session) -> None:
    """Every queued job claimed and answered by the gate."""
    tickets = claims.claim(session, Stage.FAST, 100)
    done = [Accepted(t.job_id, "red", 0.99, [9.0], ScreenResult(False, "no")) for t in tickets]
    claims.record_fast(session, done, GateSettings())


def _alone(session, name: str, tenant: str | None = "acme", callback: str | None = None) -> str:
    (item,) = items(name)
    made = submission.submit_job(
        session, item, client_key=None, batch_id=None, tenant=tenant, callback_url=callback
    )
    return made.id


def _verified(secret: str, request: Received) -> dict:
    """The request's body, its signature checked as a receiver does (Standard Webhooks)."""
    return Webhook(secret).verify(request.body, request.headers)


# -- the outbox ----------------------------------------------------------------------------
def test_a_job_sent_alone_announces_its_end_once_and_a_batch_job_by_its_batch(sessions):
    with sessions.begin() as session:
        endpoint = webhooks.add_endpoint(
            session, "acme", "https://hooks.example/", ["job.finished"]
        )
        alone = _alone(session, "alone")
        submission.submit_batch(
            session, items("in-batch"), name="b", client_key=None, tenant="acme"
        )
        _answer_all(session)
        webhooks.jobs_ended(session, [alone])  # (told already: told once)
    with sessions() as session:
        (event,) = _events(session)
        body = json.loads(event.body)
        assert (event.type, event.subject, body["type"]) == ("job.finished", alone, "job.finished")
        assert body["data"]["status"] == "done" and body["data"]["answer"] == "red"
        (delivery,) = session.scalars(select(WebhookDelivery)).all()
        assert (delivery.url, delivery.endpoint_id, delivery.state) == (
            "https://hooks.example/",
            endpoint.id,
            "pending",
        )


def test_an_event_is_written_with_its_change_or_not_at_all(sessions):
    with sessions.begin() as session:
        webhooks.add_endpoint(session, "acme", "https://hooks.example/", list(webhooks.EVENT_TYPES))
        alone = _alone(session, "alone")
    session = sessions()
    try:
        _answer_all(session)
        assert len(_events(session)) == 1  # in the transaction ...
    finally:
        session.rollback()  # ... which ends without a commit
        session.close()
    with sessions() as session:
        assert _events(session) == []
        assert session.get(Job, alone).status == "queued"


def test_nobody_listening_costs_no_row(sessions):
    with sessions.begin() as session:
        webhooks.add_endpoint(session, "other", "https://hooks.example/", ["job.finished"])
        _alone(session, "alone")
        submission.submit_batch(session, items("a"), name="b", client_key=None, tenant="acme")
        _answer_all(session)
        assert webhooks.batches_ended(session) == []
    with sessions() as session:
        assert _events(session) == []


def test_a_batch_end_is_announced_once_and_again_after_a_retry(sessions):
    with sessions.begin() as session:
        made = submission.submit_batch(
            session,
            items("a", "b"),
            name="b",
            client_key=None,
            tenant="acme",
            callback_url="https://hooks.example/b",
        )
        assert webhooks.batches_ended(session) == []  # (not yet ended)
        tickets = claims.claim(session, Stage.FAST, 10)
        claims.record_fast(
            session,
            [Accepted(tickets[0].job_id, "red", 0.99, [9.0], ScreenResult(False, "no"))],
            GateSettings(),
        )
        claims.fail_running(session, tickets[1].job_id, Stage.FAST, "broken", "it broke")
        assert webhooks.batches_ended(session) == [made.id]
        assert webhooks.batches_ended(session) == []  # once
        (event,) = _events(session, "batch.finished")
        assert json.loads(event.body)["data"]["counts"] == {"done": 1, "failed": 1}
        (delivery,) = session.scalars(select(WebhookDelivery)).all()
        assert (delivery.url, delivery.endpoint_id) == ("https://hooks.example/b", None)
    from common.pipeline.dispatch import StoreOnly

    cancel.retry_batch(sessions, StoreOnly(), made.id)
    with sessions.begin() as session:
        assert webhooks.batches_ended(session) == []
        _answer_all(session)
        assert webhooks.batches_ended(session) == [made.id]
        assert len(_events(session, "batch.finished")) == 2


def test_a_cancelled_batch_tells_once_and_an_endpoint_hears_only_later_batches(sessions):
    with sessions.begin() as session:
        early = submission.submit_batch(
            session, items("a"), name="early", client_key=None, tenant="acme"
        )
        webhooks.add_endpoint(session, "acme", "https://hooks.example/", ["batch.cancelled"])
        later = submission.submit_batch(
            session, items("b"), name="later", client_key=None, tenant="acme"
        )
        for batch in (early, later):
            cancel.cancel_batch(session, batch.id)
            cancel.cancel_batch(session, batch.id)  # (a second changes nothing)
        (event,) = _events(session)
        assert (event.type, event.subject) == ("batch.cancelled", later.id)
        assert json.loads(event.body)["data"]["reason"] == CancelReason.CANCELLED


# -- sending ---------------------------------------------------------------------------
def _deliveries(sessions) -> list[WebhookDelivery]:
    with sessions() as session:
        return list(session.scalars(select(WebhookDelivery).order_by(WebhookDelivery.id)))


def _attempts(sessions) -> list[WebhookAttempt]:
    with sessions() as session:
        return list(session.scalars(select(WebhookAttempt).order_by(WebhookAttempt.id)))


def _send_until(notifier: Notifier, sessions, state: str, deadline_s: float = 30) -> None:
    def ended() -> bool:
        notifier.tick()
        return all(d.state == state for d in _deliveries(sessions))

    wait_until(ended, deadline_s=deadline_s, every_s=0.02, what=lambda: _attempts(sessions))


def test_a_delivery_rides_out_a_receiver_down_failing_and_slow_and_is_signed(sessions):
    with receiver(up=False) as hook:
        with sessions.begin() as session:
            endpoint = webhooks.add_endpoint(session, "acme", hook.url, ["job.finished"])
            secret, alone = endpoint.secret, _alone(session, "alone")
            _answer_all(session)
        notifier = Notifier(sessions, QUICK)
        try:
            notifier.tick()  # down: refused
            hook.script += [("status", 500), ("hold", 30)]
            hook.start()
            _send_until(notifier, sessions, "delivered")
        finally:
            notifier.stop()
        tries = _attempts(sessions)
        assert [attempt.status_code for attempt in tries] == [None, 500, None, 204]
        assert "refused" in (tries[0].error or "")
        assert (tries[1].error or "").startswith("answered 500")
        assert "no whole answer within" in (tries[2].error or "") and tries[3].error is None
        # three requests came, one event: the same id on each, each signed anew
        assert len(hook.received) == 3
        assert {request.headers["webhook-id"] for request in hook.received} == {
            _deliveries(sessions)[0].event_id
        }
        for request in hook.received:
            body = _verified(secret, request)
            assert (body["type"], body["data"]["id"]) == ("job.finished", alone)
        with pytest.raises(Exception, match="signature"):
            Webhook(webhooks.new_secret()).verify(hook.received[-1].body, hook.received[-1].headers)


def test_a_delivery_is_given_up_once_its_time_runs_out(sessions):
    with receiver() as hook:
        hook.script += [("status", 503)] * 100
        with sessions.begin() as session:
            webhooks.add_endpoint(session, "acme", hook.url, ["job.finished"])
            _alone(session, "alone")
            _answer_all(session)
        notifier = Notifier(sessions, QUICK.model_copy(update={"retry_for_s": 0.5}))
        try:
            _send_until(notifier, sessions, "failed")
        finally:
            notifier.stop()
        (delivery,) = _deliveries(sessions)
        assert delivery.attempts >= 2 and delivery.finished_at is not None
        assert (delivery.last_error or "").startswith("answered 503")


def test_a_redirect_is_not_followed_and_a_callback_is_signed_with_the_tenants_secret(sessions):
    with receiver() as hook, receiver() as elsewhere:
        hook.script.append(("redirect", elsewhere.url))
        with sessions.begin() as session:
            alone = _alone(session, "alone", callback=hook.url)
            _answer_all(session)
            secret = webhooks.callback_secret(session, "acme")
        notifier = Notifier(sessions, QUICK)
        try:
            _send_until(notifier, sessions, "delivered")
        finally:
            notifier.stop()
        first, second = _attempts(sessions)
        assert first.status_code == 302 and "redirects are not followed" in (first.error or "")
        assert (second.status_code, second.error) == (204, None)  # tried again: the same URL
        assert elsewhere.received == []
        assert _verified(secret, hook.received[-1])["data"]["id"] == alone


@pytest.mark.parametrize(
    ("url", "error"),
    [
        *(
            (url, "invalid_callback_url")
            for url in (
                "ftp://x.example/",
                "https://",
                "http://user:pw@x.example/",
                "http://x .example/",
                "http://x.example:99999/",
                "http://x.example:0/",
                "http://a..b/",  # (no resolver takes an empty label, nor one of 64)
                f"http://{'a' * 64}.example/",
                "https://ex\ud800.com/",  # (a lone surrogate)
            )
        ),
        *(
            (url, "callback_url_refused")
            for url in (
                "http://127.0.0.1:9/",
                "http://10.1.2.3/",
                "http://192.168.0.1/",
                "http://169.254.169.254/latest/meta-data/",  # a cloud's metadata address
                "http://[::1]/",
                "http://[fd00:ec2::254]/",
                "http://[::ffff:127.0.0.1]/",
                "http://0.0.0.0/",
                "http://localhost:8000/",
                "http://metadata.google.internal/",
                "http://2130706433/",  # 127.0.0.1, as the resolver reads a number
                "http://0x7f.1/",
                "http://0177.0.0.1/",
                "http://127.1:8000/",
                "http://ｌｏｃａｌｈｏｓｔ/",  # (full-width: the resolver reads localhost)
                "http://localhost./",
                "http://[::127.0.0.1]/",  # IPv6 forms that carry an IPv4 address inside
                "http://[64:ff9b::7f00:1]/",
                "http://[2002:7f00:1::]/",
                "http://[::ffff:0:7f00:1]/",
            )
        ),
    ],
)
def test_urls_malformed_or_this_side_of_the_network_are_refused(url: str, error: str):
    with pytest.raises(InvalidInput) as refused:
        check_url(url)
    assert refused.value.code == error
    assert isinstance(refused.value, UnsafeUrl) == (error == "callback_url_refused")


def test_an_allowed_host_and_a_name_pass_the_check():
    assert check_url("http://127.0.0.1:9/", ["127.0.0.1"]) == "http://127.0.0.1:9/"
    assert (
        check_url("https://hooks.example/x") == "https://hooks.example/x"
    )  # (checked at each try)


def test_a_name_that_resolves_this_side_is_refused_at_each_try():
    name = socket.gethostname()  # (it resolves to an address of this machine)
    with pytest.raises(UnsafeUrl, match="resolves to an address that is not a public") as no:
        resolved(f"http://{name}:9/hook", [])
    assert not any(char.isdigit() for char in str(no.value).split("(")[0].replace(name, ""))
    target = resolved("http://127.0.0.1:9/hook?x=1", ["127.0.0.1"])
    assert (target.address, target.port, target.netloc, target.path) == (
        "127.0.0.1",
        9,
        "127.0.0.1:9",
        "/hook?x=1",
    )


SENDER = """
import sys
from common.config import WebhookSettings
from common.pipeline.notify import Notifier
from common.store.db import open_store
settings = WebhookSettings(allow_hosts=["127.0.0.1"], timeout_s=30.0, poll_s=0.05)
notifier = Notifier(open_store(sys.argv[1]), settings)
notifier.tick()
"""


def test_a_sender_killed_mid_delivery_leaves_it_to_be_sent_again(postgres_url):
    from common.store.db import open_store

    sessions = open_store(postgres_url)
    try:
        with receiver() as hook:
            hook.script.append(("hold", 60))  # the first try hangs until its sender dies
            with sessions.begin() as session:
                webhooks.add_endpoint(session, "acme", hook.url, ["job.finished"])
                _alone(session, "alone")
                _answer_all(session)
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            sender = subprocess.Popen([sys.executable, "-c", SENDER, postgres_url], env=env)
            try:
                wait_until(lambda: hook.received, deadline_s=60, what="the first try")
            finally:
                sender.send_signal(signal.SIGKILL)
                sender.wait()
            (held,) = _deliveries(sessions)
            assert (held.state, held.attempts) == ("pending", 1)  # held, by nobody now
            with sessions.begin() as session:  # (its hold ends: as once its time has passed)
                session.get(WebhookDelivery, held.id).next_at = held.created_at
            notifier = Notifier(sessions, QUICK)
            try:
                _send_until(notifier, sessions, "delivered")
            finally:
                notifier.stop()
            first, again = hook.received
            assert first.headers["webhook-id"] == again.headers["webhook-id"]  # one event
            assert first.body == again.body
        with sessions() as session:
            assert session.scalar(select(func.count()).select_from(WebhookEvent)) == 1
    finally:
        sessions.close()


def test_a_trickling_receiver_gets_one_try_of_timeout_s_and_the_rest_go_on(sessions):
    """A receiver that answers a header line at a time, forever, ends its try at the time
    limit; a URL no resolver takes is its own try's error; the others are delivered."""
    with receiver() as slow, receiver() as fine:
        slow.script.append(("trickle", 30))
        with sessions.begin() as session:
            for url in (slow.url, "http://nowhere.invalid/hook", fine.url):
                webhooks.add_endpoint(session, "acme", url, ["job.finished"])
            _alone(session, "alone")
            _answer_all(session)
        notifier = Notifier(sessions, QUICK.model_copy(update={"timeout_s": 1.0}))
        try:
            started = time.monotonic()
            assert notifier.tick() == 3
            assert time.monotonic() - started < 5  # (one try's limit, not the trickle's 30 s)
        finally:
            notifier.stop()
        by_url = {d.url: d for d in _deliveries(sessions)}
        assert by_url[fine.url].state == "delivered"
        assert by_url[slow.url].last_error == "no whole answer within 1 s"
        assert "cannot resolve nowhere.invalid" in (
            by_url["http://nowhere.invalid/hook"].last_error or ""
        )


def test_a_retry_after_of_zero_waits_the_first_retry_still(sessions):
    with receiver() as hook:
        hook.script.append(("retry_after", "0"))
        with sessions.begin() as session:
            webhooks.add_endpoint(session, "acme", hook.url, ["job.finished"])
            _alone(session, "alone")
            _answer_all(session)
        settings = QUICK.model_copy(update={"first_retry_s": 30.0, "max_retry_s": 60.0})
        notifier = Notifier(sessions, settings)
        try:
            notifier.tick()
        finally:
            notifier.stop()
        (delivery,) = _deliveries(sessions)
        assert delivery.state == "pending" and (delivery.last_error or "").startswith(
            "answered 503"
        )
        wait = (delivery.next_at - delivery.created_at).total_seconds()
        assert wait >= 29, wait  # not at once, as the receiver asked


def test_a_delivery_whose_time_ran_out_is_failed_not_sent(sessions):
    with receiver() as hook:
        with sessions.begin() as session:
            webhooks.add_endpoint(session, "acme", hook.url, ["job.finished"])
            _alone(session, "alone")
            _answer_all(session)
            for event in session.scalars(select(WebhookEvent)):
                event.created_at = event.created_at.replace(year=2020)
        notifier = Notifier(sessions, QUICK)
        try:
            assert notifier.tick() == 0
        finally:
            notifier.stop()
        (delivery,) = _deliveries(sessions)
        assert delivery.state == "failed" and hook.received == []


def test_a_tenant_has_each_url_once_and_at_most_its_endpoints(sessions):
    with sessions.begin() as session:
        webhooks.add_endpoint(session, "acme", "https://a.example/", ["job.finished"], most=2)
        with pytest.raises(InvalidInput) as again:
            webhooks.add_endpoint(session, "acme", "https://a.example/", ["job.finished"], most=2)
        assert again.value.code == "endpoint_exists"
        webhooks.add_endpoint(session, "acme", "https://b.example/", ["job.finished"], most=2)
        with pytest.raises(InvalidInput) as third:
            webhooks.add_endpoint(session, "acme", "https://c.example/", ["job.finished"], most=2)
        assert third.value.code == "max_endpoints"
        webhooks.add_endpoint(session, "other", "https://a.example/", ["job.finished"], most=2)


def test_a_job_added_to_a_batch_is_told_of_by_its_batch(sessions):
    with sessions.begin() as session:
        webhooks.add_endpoint(session, "acme", "https://hooks.example/", list(webhooks.EVENT_TYPES))
        batch = submission.submit_batch(
            session, items("a"), name="b", client_key=None, tenant="acme"
        )
        (item,) = items("added")
        submission.submit_job(session, item, client_key=None, batch_id=batch.id, tenant="acme")
        _answer_all(session)
        assert webhooks.batches_ended(session) == [batch.id]
        assert [event.type for event in _events(session)] == ["batch.finished"]


def test_a_removed_endpoint_is_sent_nothing_more(sessions):
    with sessions.begin() as session:
        endpoint = webhooks.add_endpoint(session, "acme", "https://a.example/", ["job.finished"])
        _alone(session, "alone")
        _answer_all(session)
        assert webhooks.remove_endpoint(session, "acme", endpoint.id)
        assert not webhooks.remove_endpoint(session, "acme", endpoint.id)  # (once)
        _alone(session, "later")
        _answer_all(session)
    (delivery,) = _deliveries(sessions)  # the later job's end went nowhere
    assert (delivery.state, delivery.last_error) == ("failed", "endpoint removed")
