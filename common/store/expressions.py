"""SQL the job store's indexes and queries share, written once so that a query reads the
very expression its index holds (a planner matches them as written)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Float, text
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement

from common.contracts import MAX_RECORDED, Phase


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


class ModelSeconds(ColumnElement[float]):
    """A job's model seconds, every phase of both stages and its audit
    (``jobs.fast_usage``, ``agent_usage``, ``audit_usage``: ``common.contracts.Usage``),
    summed in SQL: what a compute quota
    adds up (``common.store.usage.seconds_since``). A phase that holds no number counts
    as 0 (a figure past ``MAX_RECORDED`` too, as ``Usage.of`` reads it)."""

    type = Float()
    inherit_cache = True


# the phases a stage's record holds seconds under (an audit's run is kept as agent and
# sandbox in its own column; "audit" is the name a batch's totals give it)
_PHASES = tuple(phase.value for phase in Phase if phase != Phase.AUDIT)


@compiles(ModelSeconds, "sqlite")
def _sqlite_seconds(element: ModelSeconds, compiler: Any, **kw: Any) -> str:
    def term(column: str, phase: str) -> str:
        path = f"'$.seconds.{phase}'"
        value = f"json_extract({column}, {path})"
        return (
            f"(CASE WHEN json_type({column}, {path}) IN ('real', 'integer') "
            f"AND {value} BETWEEN 0 AND {MAX_RECORDED:.0f} THEN {value} ELSE 0 END)"
        )

    return _summed(term)


@compiles(ModelSeconds, "postgresql")
def _postgresql_seconds(element: ModelSeconds, compiler: Any, **kw: Any) -> str:
    def term(column: str, phase: str) -> str:
        value = f"CAST({column} -> 'seconds' ->> '{phase}' AS DOUBLE PRECISION)"
        return (
            f"COALESCE(CASE WHEN json_typeof({column} -> 'seconds' -> '{phase}') = "
            f"'number' THEN (CASE WHEN {value} BETWEEN 0 AND {MAX_RECORDED:.0f} "
            f"THEN {value} END) END, 0)"
        )

    return _summed(term)


def _summed(term: Callable[[str, str], str]) -> str:
    """Every phase of both stages' usage and its audit's, each as ``term`` reads it,
    added up."""
    columns = ("fast_usage", "agent_usage", "audit_usage")
    return "(" + " + ".join(term(c, p) for c in columns for p in _PHASES) + ")"


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
