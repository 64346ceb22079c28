"""A batch's counts kept as its jobs change (the embedded store, SQLite): its page and its
progress read a few rows, not one per job (issue 49: a million-job batch's page took
1.9 s to count on SQLite).

``batch_tallies`` holds, per batch and group of the columns a batch's counts group by
(status, who answered, why deferred, error code), the sums ``reads.counts_of`` adds up,
and the earliest start and latest finish and review seen. Triggers keep it: a job joins
a batch (its first row in it), leaves it (its last row), changes a column the counts
read, or a row is pointed at another job. On PostgreSQL the table stays empty and counts
are made by a pass over an index (many writers at once would queue on a batch's few
tally rows).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GROUP = ("status", "answered_by", "defer_reason", "error_code")
SUMS = ("n", "screened", "tool_free", "speculated", "audited", "agreed", "reviewed")
WATCHED = (
    "status",
    "answered_by",
    "defer_reason",
    "error_code",
    "screen_needs_tools",
    "confidence",
    "audit_status",
    "audit_agrees",
    "fast_started_at",
    "finished_at",
    "reviewed_at",
)


def _values(row: str) -> dict[str, str]:
    """A job's contribution to its group, as SQL over the row alias ``row``."""
    return {
        "status": f"{row}.status",
        "answered_by": f"coalesce({row}.answered_by, '')",
        "defer_reason": f"coalesce({row}.defer_reason, '')",
        "error_code": f"coalesce({row}.error_code, '')",
        "n": "1",
        "screened": f"({row}.screen_needs_tools IS NOT NULL)",
        "tool_free": f"coalesce({row}.screen_needs_tools = 0, 0)",
        "speculated": f"({row}.confidence IS NOT NULL)",
        "audited": f"coalesce({row}.audit_status = 'done', 0)",
        "agreed": f"coalesce({row}.audit_status = 'done' AND {row}.audit_agrees = 1, 0)",
        "reviewed": f"({row}.reviewed_at IS NOT NULL)",
        "first_started": f"{row}.fast_started_at",
        "last_finished": f"{row}.finished_at",
        "last_reviewed": f"{row}.reviewed_at",
    }


def _add(batch: str, row: str, source: str, *, distinct: bool = True) -> str:
    """Add the job ``row`` to the tallies of each ``batch`` that ``source`` yields (each
    batch once with ``distinct``: a job may stand in two rows of a batch)."""
    values = _values(row)
    columns = ["batch_id", *values]
    sums = ", ".join(f"{name} = {name} + excluded.{name}" for name in SUMS)
    marks = ", ".join(
        f"{name} = coalesce({pick}({name}, excluded.{name}), {name}, excluded.{name})"
        for name, pick in (
            ("first_started", "min"),
            ("last_finished", "max"),
            ("last_reviewed", "max"),
        )
    )
    select = "SELECT DISTINCT" if distinct else "SELECT"
    return (
        f"INSERT INTO batch_tallies ({', '.join(columns)}) "
        f"{select} {batch}, {', '.join(values.values())} {source} "
        f"ON CONFLICT ({', '.join(('batch_id', *GROUP))}) DO UPDATE SET {sums}, {marks};"
    )


def _take(row: str, where: str, source: str = "") -> str:
    """Take the job ``row`` out of the tallies ``where`` names (``source``: a FROM clause
    the row comes from); the marks stay (they are high-water marks)."""
    values = _values(row)
    sums = ", ".join(f"{name} = {name} - {values[name]}" for name in SUMS)
    group = " AND ".join(f"batch_tallies.{name} = {values[name]}" for name in GROUP)
    return f"UPDATE batch_tallies SET {sums} {source} WHERE {where} AND {group};"


def _alone(row: str, other_position: bool) -> str:
    """Whether the batch_items ``row`` is its job's only row in its batch."""
    other = f" AND b.position != {row}.position" if other_position else ""
    return (
        "NOT EXISTS (SELECT 1 FROM batch_items b "
        f"WHERE b.batch_id = {row}.batch_id AND b.job_id = {row}.job_id{other})"
    )


def _triggers() -> list[str]:
    changed = " OR ".join(f"OLD.{name} IS NOT NEW.{name}" for name in WATCHED)
    of_job = "batch_tallies.batch_id IN (SELECT batch_id FROM batch_items WHERE job_id = OLD.id)"
    return [
        f"CREATE TRIGGER batch_tallies_job_changed AFTER UPDATE OF {', '.join(WATCHED)} "
        f"ON jobs WHEN {changed} BEGIN "
        + _take("OLD", of_job)
        + _add("bi.batch_id", "NEW", "FROM batch_items bi WHERE bi.job_id = NEW.id")
        + " END",
        "CREATE TRIGGER batch_tallies_row_added AFTER INSERT ON batch_items "
        f"WHEN {_alone('NEW', True)} BEGIN "
        + _add("NEW.batch_id", "j", "FROM jobs j WHERE j.id = NEW.job_id")
        + " END",
        "CREATE TRIGGER batch_tallies_row_removed AFTER DELETE ON batch_items "
        f"WHEN {_alone('OLD', False)} BEGIN "
        + _take("j", "j.id = OLD.job_id AND batch_tallies.batch_id = OLD.batch_id", "FROM jobs j")
        + " END",
        # a row pointed at another job (a resumed row whose image changed): the old job
        # leaves the batch unless another row holds it, the new one joins unless one did
        "CREATE TRIGGER batch_tallies_row_moved AFTER UPDATE OF batch_id, job_id ON batch_items "
        "WHEN OLD.batch_id IS NOT NEW.batch_id OR OLD.job_id IS NOT NEW.job_id BEGIN "
        + _take(
            "j",
            "j.id = OLD.job_id AND batch_tallies.batch_id = OLD.batch_id "
            f"AND {_alone('OLD', False)}",
            "FROM jobs j",
        )
        + _add(
            "NEW.batch_id",
            "j",
            f"FROM jobs j WHERE j.id = NEW.job_id AND {_alone('NEW', True)}",
        )
        + " END",
    ]


def upgrade() -> None:
    op.create_table(
        "batch_tallies",
        sa.Column(
            "batch_id",
            sa.String(32),
            sa.ForeignKey("batches.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        *(sa.Column(name, sa.String(64), primary_key=True) for name in GROUP),
        *(sa.Column(name, sa.Integer(), nullable=False, server_default="0") for name in SUMS),
        sa.Column("first_started", sa.DateTime(timezone=True)),
        sa.Column("last_finished", sa.DateTime(timezone=True)),
        sa.Column("last_reviewed", sa.DateTime(timezone=True)),
    )
    if op.get_bind().dialect.name != "sqlite":
        return
    for statement in _triggers():
        op.execute(statement)
    # the batches there are: their jobs, each once a batch
    op.execute(
        _add(
            "bi.batch_id",
            "j",
            "FROM (SELECT DISTINCT batch_id, job_id FROM batch_items) bi "
            "JOIN jobs j ON j.id = bi.job_id WHERE 1",
            distinct=False,
        )
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for name in ("job_changed", "row_added", "row_removed", "row_moved"):
            op.execute(f"DROP TRIGGER IF EXISTS batch_tallies_{name}")
    op.drop_table("batch_tallies")
