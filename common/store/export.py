"""A batch's results as rows, written as JSONL or Parquet, or as labelled shards.

Every export has the same columns with the same types (``SCHEMA``), whatever the batch
holds: a Parquet file of a batch where nothing was accepted reads beside one where
everything was (``pyarrow.dataset`` over both), and a column that is empty is typed,
not null.

Where results go (``Output``, checked before any work):

- a file, ``.jsonl`` or ``.parquet``;
- a folder or prefix (``out/``, ``s3://bucket/prefix/``): Parquet files of
  ``sources.export_shard_rows`` rows each, ``part-00000.parquet`` and on, and
  ``_speceyes.json`` naming the batch they are: a folder that holds another batch's
  parts (or parts no export of ours named) is refused, never overwritten;
- with ``webdataset``, a folder or prefix of new shards, one per source shard and named
  as it is, each sample kept whole with a ``speceyes.json`` member added (its row), so
  the corpus and its labels travel together.

A URL is written through fsspec; a file appears whole or not at all (a local one is
renamed into place, an object is created when its upload completes).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from pathlib import Path
from typing import IO, Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy.orm import Session

from common.contracts import AnsweredBy, JobStatus, Usage
from common.errors import InvalidInput
from common.images import content_hash
from common.protocols.scoring import is_correct
from common.sources.locations import is_url, join, name_of
from common.sources.webdataset import IMAGE_EXTENSIONS, Sample, write_labelled_shard
from common.store.reads import batch_results
from common.store.tables import BatchItem, Job, iso_utc

_STOPPED = (JobStatus.FAILED, JobStatus.CANCELLED)  # (their error is the row's)

FORMATS = (".jsonl", ".parquet")
LAYOUTS = ("auto", "jsonl", "parquet", "webdataset")
LABEL_MEMBER = "speceyes.json"  # the member a labelled shard adds to each sample

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
        # model seconds (a batched call's shared by its jobs) and tokens (common.store.usage)
        ("fast_s", pa.float64()),
        ("agent_s", pa.float64()),  # the agent's generations and its tools
        ("tokens_in", pa.int64()),
        ("tokens_out", pa.int64()),
        ("error_code", pa.string()),
        ("error", pa.string()),
        ("expected", pa.string()),
        ("split", pa.string()),
        ("category", pa.string()),
        ("correct", pa.bool_()),
        ("audit_answer", pa.string()),  # the online audit (common.pipeline.audit), if audited
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
    fast, agent = Usage.of(job.fast_usage), Usage.of(job.agent_usage)
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
        "fast_s": round(fast.total_s, 6) if job.fast_usage is not None else None,
        "agent_s": round(agent.total_s, 6) if job.agent_usage is not None else None,
        "tokens_in": fast.tokens_in + agent.tokens_in if _used(job) else None,
        "tokens_out": fast.tokens_out + agent.tokens_out if _used(job) else None,
        "error_code": job.error_code,
        "error": job.error_message if job.status in _STOPPED else None,
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


def _used(job: Job) -> bool:
    return job.fast_usage is not None or job.agent_usage is not None


def _utc(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC, its zone written ``Z`` (as the API writes it)."""
    return iso_utc(moment)


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
        raise InvalidInput(
            f"cannot write {path}: it is a folder; name a file in it, or end it with / "
            "for Parquet parts"
        )
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
    with partial.open("wb") as handle:
        return _write_to(rows, suffix, handle)


@dataclass(frozen=True)
class Output:
    """Where results go: ``target`` (a path or URL) and how (``file``: one file in the
    format its suffix names; ``parquet``: Parquet parts in a folder or prefix;
    ``webdataset``: labelled shards in a folder or prefix)."""

    target: str
    layout: str


def check_output(out: str, layout: str = "auto") -> Output:
    """Refuse, before any work, an output that cannot be written as asked."""
    folder_like = out.endswith("/")  # (a folder named without it is refused: check_format)
    if layout == "webdataset":
        if not folder_like:
            raise InvalidInput(f"labelled shards go to a folder or prefix ending in '/': got {out}")
        return Output(out, "webdataset")
    if folder_like:
        if layout == "jsonl":
            raise InvalidInput(f"a folder ({out}) is written as Parquet parts; name a .jsonl file")
        return Output(out, "parquet")
    suffix = "." + out.rsplit(".", 1)[-1].lower() if "." in name_of(out) else ""
    if suffix not in FORMATS:
        raise InvalidInput(
            f"cannot write {out}: name a file ending in {' or '.join(FORMATS)}, or a folder "
            "or prefix ending in '/' (Parquet parts)"
        )
    if layout not in ("auto", suffix[1:]):
        raise InvalidInput(f"{out} ends in {suffix}, not .{layout}")
    if not is_url(out):
        check_format(Path(out))
    return Output(out, "file")


def export(
    rows: Iterable[dict[str, Any]], output: Output, shard_rows: int, batch_id: str
) -> tuple[int, int]:
    """Write the rows of ``batch_id`` as ``output`` says (not ``webdataset``:
    ``write_labelled``). Returns (rows, files) written."""
    if output.layout == "parquet":
        claim_folder(output.target, batch_id)
        return write_parts(rows, output.target, shard_rows)
    if not is_url(output.target):
        return write_rows(rows, Path(output.target)), 1
    suffix = "." + output.target.rsplit(".", 1)[-1].lower()
    with _remote_file(output.target) as handle:
        count = _write_to(rows, suffix, handle)
    return count, 1


MARKER = "_speceyes.json"  # in a folder of parts: the batch they are


def claim_folder(prefix: str, batch_id: str) -> None:
    """Make ``prefix`` (a folder or URL) this batch's: refuse it where it holds another
    batch's parts, or parts no export named; write the marker before any part."""
    filesystem, root = fsspec.core.url_to_fs(prefix)
    root = root.rstrip("/")
    parts = filesystem.glob(f"{root}/part-*.parquet")
    marker = f"{root}/{MARKER}"
    owner = None
    if filesystem.exists(marker):
        try:
            owner = json.loads(filesystem.cat_file(marker)).get("batch_id")
        except (ValueError, AttributeError):
            owner = None
    if parts and owner != batch_id:
        whose = f"batch {owner}'s" if owner else "parts no export of ours named"
        raise InvalidInput(
            f"{prefix} holds {whose} ({parts_of(len(parts))}): export each batch to a "
            "folder of its own (or remove those files first); the same batch again replaces "
            "its own parts"
        )
    filesystem.makedirs(root, exist_ok=True)
    filesystem.pipe_file(marker, json.dumps({"batch_id": batch_id}).encode())


def write_parts(rows: Iterable[dict[str, Any]], prefix: str, shard_rows: int) -> tuple[int, int]:
    """Parquet parts of ``shard_rows`` rows under ``prefix``; returns (rows, files).
    Parts an earlier export left beyond these are removed: the folder reads as this
    export alone."""
    count = parts = 0
    iterator = iter(rows)
    while part := list(islice(iterator, shard_rows)):
        name = f"part-{parts:05d}.parquet"
        if is_url(prefix):
            with _remote_file(join(prefix, name)) as handle:
                _write_to(part, ".parquet", handle)
        else:
            write_rows(part, Path(prefix) / name)
        count, parts = count + len(part), parts + 1
    _remove_parts_from(prefix, parts)
    return count, parts


def _remove_parts_from(prefix: str, first: int) -> None:
    """Remove the parts numbered ``first`` and on under ``prefix`` (a folder or URL)."""
    filesystem, root = fsspec.core.url_to_fs(prefix)
    for path in filesystem.glob(f"{root.rstrip('/')}/part-*.parquet"):
        number = path.rsplit("/", 1)[-1].removeprefix("part-").removesuffix(".parquet")
        if number.isdigit() and int(number) >= first:
            filesystem.rm(path)


def check_labelled(shards: list[str], prefix: str) -> None:
    """Refuse, before any work, labelled shards that would overwrite each other or a
    source shard (the jobs refer to its bytes)."""
    names = [name_of(shard) for shard in shards]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InvalidInput(
            f"two source shards are named {repeated[0]}: labelled shards are named as their "
            "source, so they would overwrite each other; label each folder apart"
        )
    for shard in shards:
        if _target(prefix, shard) == (shard if is_url(shard) else str(Path(shard).resolve())):
            raise InvalidInput(
                f"--out {prefix} would overwrite the source shard {shard}: name another folder"
            )


def _target(prefix: str, shard: str) -> str:
    if is_url(prefix):
        return prefix.rstrip("/") + "/" + name_of(shard)
    return str((Path(prefix) / name_of(shard)).resolve())


def write_labelled(
    session: Session, batch_id: str, shards: list[str], prefix: str
) -> tuple[int, int, int]:
    """A new shard under ``prefix`` for each source shard: its samples, each with a
    ``speceyes.json`` member (the sample's exported row). Returns (shards, samples,
    labelled). Labels are read for a few hundred samples at a time; a key that stands
    in several shards is told apart by the digest of the sample's image."""
    check_labelled(shards, prefix)

    def labels(samples: list[Sample]) -> dict[str, dict[str, Any]]:
        keys = sorted({sample.key for sample in samples})
        digests = {sample.key: _image_digest(sample) for sample in samples}
        found: dict[str, dict[str, Any]] = {}
        for item, job in batch_results(session, batch_id, item_ids=keys):
            if item.item_id not in found or job.image_hash == digests.get(item.item_id):
                found[item.item_id] = result_row(item, job)
        return found

    written = samples = labelled = 0
    for shard in shards:
        target = _target(prefix, shard)
        if is_url(target):
            with _remote_file(target) as handle:
                counts = write_labelled_shard(shard, handle, labels, LABEL_MEMBER)
        else:
            Path(prefix).mkdir(parents=True, exist_ok=True)
            partial = Path(prefix) / f".{name_of(shard)}.partial"
            try:
                with partial.open("wb") as handle:
                    counts = write_labelled_shard(shard, handle, labels, LABEL_MEMBER)
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
            os.replace(partial, target)
        written, samples, labelled = written + 1, samples + counts[0], labelled + counts[1]
    return written, samples, labelled


def _image_digest(sample: Sample) -> str | None:
    image = next((sample.members[e] for e in IMAGE_EXTENSIONS if e in sample.members), None)
    return content_hash(image.data) if image is not None and image.data is not None else None


@contextmanager
def _remote_file(url: str) -> Iterator[IO[bytes]]:
    """An object to write; it is created when the upload completes, not before."""

    try:
        with fsspec.open(url, "wb") as handle:
            yield handle
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"cannot write {url}: {str(exc) or type(exc).__name__}") from None


def _write_to(rows: Iterable[dict[str, Any]], suffix: str, handle: IO[bytes]) -> int:
    count = 0
    if suffix == ".parquet":
        with pq.ParquetWriter(handle, SCHEMA) as writer:
            iterator = iter(rows)
            while group := list(islice(iterator, PARQUET_ROWS_PER_GROUP)):
                writer.write_table(pa.Table.from_pylist(group, schema=SCHEMA))
                count += len(group)
        return count
    for row in rows:
        handle.write((json.dumps(row, ensure_ascii=False) + "\n").encode())
        count += 1
    return count


def parts_of(files: int) -> str:
    """ "1 Parquet file", "3 Parquet files": how the commands name what an export wrote."""
    return f"{files} Parquet file{'' if files == 1 else 's'}"
