"""A batch's counts kept on PostgreSQL too, and its rows and judge verdicts counted with
them (issue 49: a million-job batch's page counted the batch by a pass, 974 ms).

On PostgreSQL no writer touches ``batch_tallies``: many workers recording a batch's jobs
at once would queue on its few rows. Statement-level triggers instead append what each
statement changed, summed per batch and group, to ``batch_tally_changes`` (insert-only:
writers never wait on each other there). A read adds a batch's changes to its tallies;
``common.store.tallies.fold`` moves changes into the tallies (the reconciler's leader
each sweep, a reader that finds many). SQLite keeps writing the tallies directly
(migration 0022), and its new triggers count rows and verdicts.

The rows and verdicts of a batch are counted in its group of empty names ('', '', '',
''), which holds no job.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GROUP = ("status", "answered_by", "defer_reason", "error_code")
SUMS = ("n", "screened", "tool_free", "speculated", "audited", "agreed", "reviewed")
MARKS = {"first_started": "fast_started_at", "last_finished": "finished_at",
         "last_reviewed": "reviewed_at"}  # fmt: skip
# the columns a job's contribution reads
WATCHED = (*GROUP, "screen_needs_tools", "confidence", "audit_status", "audit_agrees")
WATCHED += tuple(MARKS.values())
COLUMNS = ("batch_id", *GROUP, *SUMS, "items", "verdicts", *MARKS)


def _job_values(job: str, sign: str) -> str:
    """A job's contribution (PostgreSQL), times ``sign`` (an SQL expression: 1 or -1),
    as the select list ``COLUMNS`` names after ``batch_id``; marks only where it joins."""
    sums = {
        "n": "1",
        "screened": f"({job}.screen_needs_tools IS NOT NULL)::int",
        "tool_free": f"({job}.screen_needs_tools IS FALSE)::int",
        "speculated": f"({job}.confidence IS NOT NULL)::int",
        "audited": f"({job}.audit_status IS NOT DISTINCT FROM 'done')::int",
        "agreed": f"({job}.audit_status IS NOT DISTINCT FROM 'done' "
        f"AND {job}.audit_agrees IS TRUE)::int",
        "reviewed": f"({job}.reviewed_at IS NOT NULL)::int",
    }
    group = [f"{job}.status"] + [f"coalesce({job}.{name}, '')" for name in GROUP[1:]]
    marks = [f"CASE WHEN {sign} > 0 THEN {job}.{column} END" for column in MARKS.values()]
    return ", ".join(
        [
            *(f"{value} AS {name}" for name, value in zip(GROUP, group, strict=True)),
            *(f"{sign} * {value} AS {name}" for name, value in sums.items()),
            "0 AS items",
            "0 AS verdicts",
            *(f"{mark} AS {name}" for mark, name in zip(marks, MARKS, strict=True)),
        ]
    )


def _summed(source: str) -> str:
    """Append the rows of ``source`` (with ``batch_id`` and ``COLUMNS``), summed per batch
    and group, to the changes; batches deleted meanwhile are left out."""
    sums = ", ".join(f"sum({name})" for name in (*SUMS, "items", "verdicts"))
    marks = "min(first_started), max(last_finished), max(last_reviewed)"
    something = " OR ".join(
        [*(f"sum({name}) <> 0" for name in (*SUMS, "items", "verdicts")),
         *(f"count({name}) > 0" for name in MARKS)]
    )  # fmt: skip
    return (
        f"INSERT INTO batch_tally_changes ({', '.join(COLUMNS)}) "
        f"SELECT batch_id, {', '.join(GROUP)}, {sums}, {marks} FROM ({source}) AS part "
        "WHERE EXISTS (SELECT 1 FROM batches WHERE batches.id = part.batch_id) "
        f"GROUP BY batch_id, {', '.join(GROUP)} HAVING {something}"
    )


def _jobs_changed() -> str:
    """A statement changed jobs: each batch of a job whose counted columns moved loses the
    old job and gains the new."""
    moved = " OR ".join(f"o.{name} IS DISTINCT FROM w.{name}" for name in WATCHED)
    sides = " UNION ALL ".join(
        f"SELECT b.batch_id, {_job_values(job, sign)} FROM old_rows o "
        f"JOIN new_rows w ON w.id = o.id "
        f"CROSS JOIN LATERAL (SELECT DISTINCT batch_id FROM batch_items "
        f"WHERE batch_items.job_id = o.id) b WHERE {moved}"
        for job, sign in (("o", "-1"), ("w", "1"))
    )
    return _summed(sides)


def _rows_changed(old: bool, new: bool) -> str:
    """A statement added, removed or changed batch rows: each batch counts its rows and
    verdicts, and a job joins a batch (its first row there) or leaves it (its last)."""
    sides = [
        f"SELECT batch_id, job_id, judge_verdict AS v, {k} AS k FROM {table}"
        for table, k, present in (("old_rows", -1, old), ("new_rows", 1, new))
        if present
    ]
    rows = " UNION ALL ".join(sides)
    nothing = ", ".join(f"'' AS {name}" for name in GROUP)
    counted = (
        f"SELECT batch_id, {nothing}, "
        f"{', '.join(f'0 AS {name}' for name in SUMS)}, sum(k) AS items, "
        "sum(k * (v IS NOT NULL)::int) AS verdicts, "
        f"{', '.join(f'NULL::timestamptz AS {name}' for name in MARKS)} "
        f"FROM ({rows}) AS r GROUP BY batch_id"
    )
    # a pair whose rows changed in number: after it, ``after`` rows; before, after - delta
    pairs = (
        "SELECT p.batch_id, p.job_id, CASE WHEN a.after = 0 THEN -1 "
        "WHEN a.after = p.delta THEN 1 ELSE 0 END AS sign FROM "
        f"(SELECT batch_id, job_id, sum(k) AS delta FROM ({rows}) AS r "
        "GROUP BY batch_id, job_id HAVING sum(k) <> 0) AS p "
        "CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE b.batch_id = p.batch_id) AS after "
        "FROM batch_items b WHERE b.job_id = p.job_id) AS a"
    )  # (by the job: the index on a batch's rows would read all of a large batch's)
    joined = (
        f"SELECT f.batch_id, {_job_values('j', 'f.sign')} FROM ({pairs}) AS f "
        "JOIN jobs j ON j.id = f.job_id WHERE f.sign <> 0"
    )
    return _summed(f"{counted} UNION ALL {joined}")


def _function(name: str, body: str) -> str:
    return (
        f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN {body}; RETURN NULL; END $$"
    )


TRIGGERS = {  # name: (table, event, old table, new table)
    "batch_tallies_jobs_changed": ("jobs", "UPDATE", True, True),
    "batch_tallies_rows_added": ("batch_items", "INSERT", False, True),
    "batch_tallies_rows_removed": ("batch_items", "DELETE", True, False),
    "batch_tallies_rows_changed": ("batch_items", "UPDATE", True, True),
}


def _postgresql() -> None:
    for name, (table, event, old, new) in TRIGGERS.items():
        body = _jobs_changed() if table == "jobs" else _rows_changed(old, new)
        op.execute(_function(name, body))
        tables = (("OLD TABLE AS old_rows", old), ("NEW TABLE AS new_rows", new))
        kept = " ".join(clause for clause, present in tables if present)
        op.execute(
            f"CREATE TRIGGER {name} AFTER {event} ON {table} REFERENCING {kept} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {name}()"
        )
    # the batches there are: their jobs, each once a batch, and their rows
    jobs = (
        f"SELECT m.batch_id, {_job_values('j', '1')} FROM "
        "(SELECT DISTINCT batch_id, job_id FROM batch_items) AS m JOIN jobs j ON j.id = m.job_id"
    )
    op.execute(_summed(jobs).replace("batch_tally_changes", "batch_tallies", 1))
    _count_rows()


def _count_rows() -> None:
    """The rows and verdicts of the batches there are, in their group of empty names."""
    op.execute(
        "INSERT INTO batch_tallies (batch_id, status, answered_by, defer_reason, error_code, "
        "items, verdicts) SELECT batch_id, '', '', '', '', count(*), count(judge_verdict) "
        "FROM batch_items GROUP BY batch_id "
        "ON CONFLICT (batch_id, status, answered_by, defer_reason, error_code) "
        "DO UPDATE SET items = excluded.items, verdicts = excluded.verdicts"
    )


def _sqlite() -> None:
    def put(row: str, sign: str) -> str:
        return (
            "INSERT INTO batch_tallies (batch_id, status, answered_by, defer_reason, "
            f"error_code, items, verdicts) VALUES ({row}.batch_id, '', '', '', '', {sign}1, "
            f"{sign}({row}.judge_verdict IS NOT NULL)) "
            "ON CONFLICT (batch_id, status, answered_by, defer_reason, error_code) "
            "DO UPDATE SET items = items + excluded.items, verdicts = verdicts + excluded.verdicts;"
        )

    op.execute(
        f"CREATE TRIGGER batch_tallies_row_counted AFTER INSERT ON batch_items BEGIN "
        f"{put('NEW', '')} END"
    )
    op.execute(
        "CREATE TRIGGER batch_tallies_row_uncounted AFTER DELETE ON batch_items "
        "WHEN EXISTS (SELECT 1 FROM batches WHERE id = OLD.batch_id) BEGIN "
        f"{put('OLD', '-')} END"
    )
    op.execute(
        "CREATE TRIGGER batch_tallies_row_recounted AFTER UPDATE OF batch_id, judge_verdict "
        "ON batch_items WHEN OLD.batch_id IS NOT NEW.batch_id "
        "OR (OLD.judge_verdict IS NULL) != (NEW.judge_verdict IS NULL) BEGIN "
        f"{put('OLD', '-')} {put('NEW', '')} END"
    )
    _count_rows()


def upgrade() -> None:
    for name in ("items", "verdicts"):
        op.add_column(
            "batch_tallies", sa.Column(name, sa.Integer(), nullable=False, server_default="0")
        )
    op.create_table(
        "batch_tally_changes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("batch_id", sa.String(32), nullable=False),
        *(sa.Column(name, sa.String(64), nullable=False) for name in GROUP),
        *(
            sa.Column(name, sa.Integer(), nullable=False, server_default="0")
            for name in (*SUMS, "items", "verdicts")
        ),
        sa.Column("first_started", sa.DateTime(timezone=True)),
        sa.Column("last_finished", sa.DateTime(timezone=True)),
        sa.Column("last_reviewed", sa.DateTime(timezone=True)),
    )
    op.create_index("ix_batch_tally_changes_batch", "batch_tally_changes", ["batch_id", "id"])
    if op.get_bind().dialect.name == "sqlite":
        _sqlite()
    else:
        _postgresql()


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for name in ("row_counted", "row_uncounted", "row_recounted"):
            op.execute(f"DROP TRIGGER IF EXISTS batch_tallies_{name}")
    else:
        for name, (table, *_) in TRIGGERS.items():
            op.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
            op.execute(f"DROP FUNCTION IF EXISTS {name}()")
        op.execute("DELETE FROM batch_tallies")  # (0022 keeps none on PostgreSQL)
    op.drop_table("batch_tally_changes")
    for name in ("items", "verdicts"):  # (in place: a copied table breaks 0022's triggers)
        op.execute(f"ALTER TABLE batch_tallies DROP COLUMN {name}")
