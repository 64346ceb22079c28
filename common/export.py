"""A batch's results as rows, written as JSONL or Parquet.

Every export has the same columns with the same types (``SCHEMA``), whatever the batch
holds: a Parquet file of a batch where nothing was accepted reads beside one where
everything was (``pyarrow.dataset`` over both), and a column that is empty is typed,
not null.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy.orm import Session

from common.contracts import AnsweredBy, JobStatus
from common.errors import InvalidInput
from common.scoring import is_correct
from common.store.reads import batch_results
from common.store.tables import BatchItem, Job

FORMATS = (".jsonl", ".parquet")

# The one declaration of an exported row: its columns, in order, and their types.
SCHEMA = pa.schema(
    [
        ("id", pa.string()),  # the row's id: the manifest's, or the image's relative path
        ("position", pa.int64()),
        ("job_id", pa.string()),
        ("image", pa.string()),
        ("question", pa.string()),
        ("options", pa.list_(pa.string())),
        ("status", pa.string()),
        ("answer", pa.string()),
        ("answered_by", pa.string()),  # small | large
        ("confidence", pa.float64()),  # the gate's, on an answer it accepted (else null)
        ("small_answer", pa.string()),
        ("gate_confidence", pa.float64()),  # the gate's, on the small answer, accepted or not
        ("screen_needs_tools", pa.bool_()),
        ("defer_reason", pa.string()),
        ("agent_steps", pa.int64()),
        ("error_code", pa.string()),
        ("error", pa.string()),
        ("expected", pa.string()),
        ("split", pa.string()),
        ("category", pa.string()),
        ("correct", pa.bool_()),
        ("audit_answer", pa.string()),  # the online audit (common.audit), if audited
        ("audit_agrees", pa.bool_()),
        ("reviewed_answer", pa.string()),  # a person's review (common.store.reviews), if any
        ("reviewer", pa.string()),  # the reviewing API key's name
        ("reviewed_at", pa.string()),  # ISO 8601, UTC
        ("final_answer", pa.string()),  # the reviewed answer, else the model's (answer)
    ]
)
PARQUET_ROWS_PER_GROUP = 10_000  # rows held in memory at once while writing Parquet


def result_row(item: BatchItem, job: Job) -> dict[str, Any]:
    """One exported row (``SCHEMA``'s columns): what was asked, what was answered, by
    whom and how sure, and a person's review of it. ``answer`` stays the model's;
    ``final_answer`` is the one to hand on."""
    return {
        "id": item.item_id,
        "position": item.position,
        "job_id": job.id,
        "image": job.image_path,
        "question": job.question,
        "options": job.options,
        "status": job.status,
        "answer": job.final_answer,
        "answered_by": job.answered_by,
        "confidence": job.confidence if job.answered_by == AnsweredBy.SMALL else None,
        "small_answer": job.small_answer,
        "gate_confidence": job.confidence,
        "screen_needs_tools": job.screen_needs_tools,
        "defer_reason": job.defer_reason,
        "agent_steps": len(steps) if (steps := job.trace_steps) is not None else None,
        "error_code": job.error_code,
        "error": job.error_message if job.status == JobStatus.FAILED else None,
        "expected": item.expected,
        "split": item.split,
        "category": item.category,
        "correct": None
        if item.expected is None
        else is_correct(job.final_answer, item.expected, job.options),
        "audit_answer": job.audit_answer,
        "audit_agrees": job.audit_agrees,
        "reviewed_answer": job.reviewed_answer,
        "reviewer": job.reviewer,
        "reviewed_at": _utc(job.reviewed_at),
        "final_answer": job.given_answer,
    }


def _utc(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC (SQLite hands a stored time back without its zone: it was UTC)."""
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()


def batch_rows(
    session: Session, batch_id: str, *, audit_disagreements: bool = False
) -> Iterator[dict[str, Any]]:
    """The batch's rows; with ``audit_disagreements``, only audited rows whose accepted
    answer the agent contradicted (for review)."""
    for item, job in batch_results(session, batch_id):
        if not audit_disagreements or job.audit_agrees is False:
            yield result_row(item, job)


def check_format(path: Path) -> None:
    """Refuse, before any work, an output that cannot be written as asked."""
    if path.is_dir():
        raise InvalidInput(f"cannot write {path}: it is a folder; name a file in it")
    if path.suffix.lower() not in FORMATS:
        raise InvalidInput(f"cannot write {path}: the output must end in {' or '.join(FORMATS)}")


def write_rows(rows: Iterable[dict[str, Any]], path: Path) -> int:
    """Write rows to ``path`` (format by extension); returns how many were written."""
    check_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")  # a reader never sees half a file
    try:
        count = _write(rows, path.suffix.lower(), partial)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)
    return count


def _write(rows: Iterable[dict[str, Any]], suffix: str, partial: Path) -> int:
    if suffix == ".parquet":
        count = 0
        with pq.ParquetWriter(partial, SCHEMA) as writer:
            iterator = iter(rows)
            while group := list(islice(iterator, PARQUET_ROWS_PER_GROUP)):
                writer.write_table(pa.Table.from_pylist(group, schema=SCHEMA))
                count += len(group)
    else:
        count = 0
        with partial.open("w", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
                count += 1
    return count
