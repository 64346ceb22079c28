"""Webhooks from real Celery workers on Redis and PostgreSQL (issue 46, point 4): a
batch's end reaches a registered endpoint, signed, from a worker's sender; the workers
killed while a delivery hangs leave it to be delivered again, with the same id."""

from __future__ import annotations

from standardwebhooks import Webhook

from common.store import webhooks
from tests.helpers.images import write_images
from tests.helpers.receiver import receiver
from tests.helpers.waiting import wait_until


def test_a_batch_end_reaches_its_endpoint_even_when_the_workers_die_mid_delivery(
    tmp_path, deployment
):
    made = deployment(
        webhook_allow_hosts='["127.0.0.1"]', webhook_poll_s="0.1", webhook_timeout_s="1"
    )
    write_images(tmp_path / "imgs", 3)
    with receiver() as hook:
        hook.script.append(("hold", 120))  # the first try hangs
        with made.sessions.begin() as session:
            endpoint = webhooks.add_endpoint(session, None, hook.url, ["batch.finished"])
            secret = endpoint.secret
        batch_id = made.submit(tmp_path / "imgs")
        first = [made.start("fast"), made.start("slow")]
        made.run(batch_id)
        wait_until(lambda: hook.received, deadline_s=30, what="the first try")
        for worker in first:  # whichever holds the delivery dies with it
            worker.kill()
        made.start("fast")  # (its sender takes the delivery once the dead one's hold ends)
        wait_until(lambda: len(hook.received) >= 2, deadline_s=60, what=made.logs)
        held, again = hook.received[:2]
        assert held.headers["webhook-id"] == again.headers["webhook-id"]
        body = Webhook(secret).verify(again.body, again.headers)
        assert (body["type"], body["data"]["id"]) == ("batch.finished", batch_id)
        assert body["data"]["counts"] == {"done": 3}
