"""SQL the job store's indexes and queries share, written once so that a query reads the
very expression its index holds (a planner matches them as written)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Float, text
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement


class GateMargin(ColumnElement[float]):
    """How far a job's confidence lies above the tau its gate used (``jobs.gate``'s
    threshold); NULL where either is missing or the threshold is not a number. The review
    queue's near-threshold tier reads the accepted answers in this order
    (``ix_jobs_margin``)."""

    type = Float()
    inherit_cache = True


@compiles(GateMargin, "sqlite")
def _sqlite_margin(element: GateMargin, compiler: Any, **kw: Any) -> str:
    # (json_extract of a number is a number; of anything else, text or NULL: the
    # difference is then NULL or a text's numeric value, as SQLite's arithmetic goes)
    return "(confidence - json_extract(gate, '$.threshold'))"


@compiles(GateMargin, "postgresql")
def _postgresql_margin(element: GateMargin, compiler: Any, **kw: Any) -> str:
    # (cast only a JSON number: a write whose gate holds another kind must not fail)
    return (
        "(confidence - CASE WHEN json_typeof(gate -> 'threshold') = 'number' "
        "THEN CAST(gate ->> 'threshold' AS DOUBLE PRECISION) END)"
    )


def partial(where: str) -> dict[str, Any]:
    """An ``Index``'s options for a partial index over the rows ``where`` names (SQL both
    stores read alike)."""
    return {"postgresql_where": text(where), "sqlite_where": text(where)}


def gate_threshold(gate: Any) -> float | None:
    """The tau in a job's gate record (``Job.gate``), if it is a number in [0, 1]."""
    value = gate.get("threshold") if isinstance(gate, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
        return float(value)
    return None
