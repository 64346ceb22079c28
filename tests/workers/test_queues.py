"""What the reconciler reads in a message on Redis: the job ids it carries, or none."""

from __future__ import annotations

import base64
import json

import pytest

from workers.queues import SENT_HEADER, _job_ids, _sent_at


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


@pytest.mark.parametrize(
    "header, sent",
    [
        (1764000000.5, 1764000000.5),
        (float("nan"), 0.0),  # (json.dumps writes NaN, json.loads reads it back)
        (float("inf"), 0.0),
        (-1e300, 0.0),
        (1e300, 0.0),
        (True, 0.0),
        ("1764000000", 0.0),
        (None, 0.0),
    ],
)
def test_a_send_time_is_a_moment_a_sweep_can_compare_or_none(header, sent):
    """A message's send time (its header) as the reconciler reads it: a stranger's or
    a broken one reads as 0.0 (wait for it to drain), never one that stops a sweep
    (``datetime.fromtimestamp`` raises on NaN and overflows past year 9999)."""
    from datetime import UTC, datetime

    read = _sent_at(json.dumps({"headers": {SENT_HEADER: header}}).encode())
    assert read == sent
    datetime.fromtimestamp(read - 30, UTC)  # (what the sweep does with it)
