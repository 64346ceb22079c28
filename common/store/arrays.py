"""Many rows in one PostgreSQL statement: each column sent as one array, the rows
unnested on the server.

One small statement to parse and plan, one round trip, whatever the number of rows
(an executemany sends a statement per row, even pipelined). The job store inserts a
submission's chunk of jobs this way (``common.store.submission``) and records a fast
micro-batch's outcomes (``common.store.claims``). A JSON column travels as one JSON
array (its rows' values, null for NULL), split into rows on the server: as an array of
texts, each of 32 values would be escaped quote by quote on the client (psycopg's
array dumper), about 20 microseconds a row for a small record.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import JSON, String, Table
from sqlalchemy.dialects import postgresql

_DIALECT = postgresql.dialect()


def unnest_from(table: Table, names: Sequence[str], alias: str = "rows") -> str:
    """``unnest(CAST(:a AS T[]), ...) AS alias(c_a, ...)``: the rows of ``names``'s arrays,
    each cast to its column's type in ``table`` (JSON as text: ``value``)."""
    arrays = ", ".join(_array(table, name) for name in names)
    return f"unnest({arrays}) AS {alias}({', '.join(f'c_{name}' for name in names)})"


def insert_from(table: Table, names: Sequence[str]) -> str:
    """``INSERT INTO table (names) SELECT ... FROM unnest(...)``: rows of ``names``'s
    arrays into ``table`` (parameters from ``as_arrays``)."""
    values = ", ".join(value(table, name) for name in names)
    return (
        f"INSERT INTO {table.name} ({', '.join(names)}) "
        f"SELECT {values} FROM {unnest_from(table, names)}"
    )


def value(table: Table, name: str) -> str:
    """The unnested column ``name`` as its column's type (JSON parsed from its text)."""
    return f"CAST(c_{name} AS JSON)" if _is_json(table, name) else f"c_{name}"


def as_arrays(table: Table, rows: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """The parameters for ``unnest_from``: one list per column; a JSON column's values as
    one JSON array (a None stays NULL)."""
    arrays: dict[str, Any] = {}
    for name in names:
        column = [row[name] for row in rows]
        arrays[name] = json.dumps(column) if _is_json(table, name) else column
    return arrays


def _array(table: Table, name: str) -> str:
    """The parameter ``name`` as an array of its column's type; a JSON column's, from its
    one JSON document: each element's text in order (JSON null: NULL)."""
    if not _is_json(table, name):
        return f"CAST(:{name} AS {_array_type(table, name)}[])"
    return (
        f"ARRAY(SELECT NULLIF(item.value::text, 'null') FROM json_array_elements("
        f"CAST(:{name} AS JSON)) WITH ORDINALITY AS item(value, n) ORDER BY item.n)"
    )


def _is_json(table: Table, name: str) -> bool:
    return isinstance(table.c[name].type, JSON)


def _array_type(table: Table, name: str) -> str:
    """Text for strings (an explicit cast to VARCHAR(n) would cut a long value short
    where storing it into the column refuses it); else the column's type."""
    if isinstance(table.c[name].type, String):
        return "TEXT"
    return str(table.c[name].type.compile(dialect=_DIALECT))
