"""Printing what others wrote (a model, a user, model-written code, an API client's batch
name) on the operator's terminal."""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def say(text: str) -> None:
    """Print ``text`` with its control characters (terminal escapes among them) shown as
    escapes, never sent to the terminal."""
    print(_CONTROL.sub(lambda match: ascii(match.group())[1:-1], text))
