"""What the reconciler reads in a message on Redis: the job ids it carries, or none."""

from __future__ import annotations

import base64
import json

import pytest

from workers.queues import _job_ids


def raw(body: object) -> bytes:
    encoded = base64.b64encode(json.dumps(body).encode()).decode()
    return json.dumps({"body": encoded, "properties": {"body_encoding": "base64"}}).encode()


@pytest.mark.parametrize(
    "body, ids",
    [
        ([["a"], {}, {}], ["a"]),  # a slow or audit message: one id
        ([[["a", "b"]], {"takeover": True}, {}], ["a", "b"]),  # a fast micro-batch
        ([[["a", 3]], {}, {}], ["a"]),
        ([[], {}, {}], []),
        ([5, {}, {}], []),  # not ours: a foreign or malformed message names no job
        ([{"x": 1}, {}, {}], []),
        ([[{"x": 1}], {}, {}], []),
    ],
)
def test_a_message_names_the_jobs_it_carries_and_a_stranger_none(body, ids):
    assert _job_ids(raw(body)) == ids
    assert _job_ids(b"not json") == []
