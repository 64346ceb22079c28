"""A corpus row's fields, read the same way by every reader (manifests, shards, tables)."""

from __future__ import annotations

from typing import Any


def is_options(value: Any) -> bool:
    """Whether ``value`` is a row's options: a list of strings."""
    return isinstance(value, list) and all(isinstance(option, str) for option in value)


def given_text(value: Any) -> str | None:
    """A field's value as text (an expected answer, an id); None where it is missing or
    empty."""
    return str(value) if value not in (None, "") else None
