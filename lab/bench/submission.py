"""Submitting a large corpus into the job store: rows/s and the submitter's peak memory.

A synthetic corpus of ``rows`` rows is written first (a Parquet table with an image
column, or WebDataset shards): each image is a 1x1 PNG with a distinct trailer, so every
row is its own job and hashing costs what it costs for small files. Then one process
(spawned, so its peak memory is its own) opens the source and submits it to a scratch
PostgreSQL database beside ``database_url`` the way ``annotate`` does
(``common.sources.corpus.open_source`` + ``common.pipeline.submit.submit_corpus``, no
broker): rows are read a record batch at a time, hashed, and written a chunk per transaction.
"""

from __future__ import annotations

import io
import multiprocessing
import resource
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from common.config import Settings
from common.pipeline.submit import submit_corpus
from common.sources.corpus import open_source
from common.store.db import open_store
from lab.bench.scratch import scratch_database

ROWS_PER_GROUP = 10_000  # the generated table's row groups
ROWS_PER_SHARD = 10_000  # the generated shards' samples


@dataclass(frozen=True)
class SubmitFigures:
    rows: int
    seconds: float
    peak_mb: float  # the submitting process's peak resident memory
    jobs_created: int

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def _tiny_png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (1, 1), (10, 20, 30)).save(buffer, "PNG")
    return buffer.getvalue()


def write_table(
    path: Path, rows: int, on_rows: Callable[[int], None] | None = None, *, start: int = 0
) -> Path:
    """A Parquet table of ``rows`` rows: id, image (bytes), question; the rows numbered
    from ``start`` (another start, other images: other jobs)."""
    base = _tiny_png()
    schema = pa.schema([("id", pa.string()), ("image", pa.binary()), ("question", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        for first in range(start, start + rows, ROWS_PER_GROUP):
            numbers = range(first, min(start + rows, first + ROWS_PER_GROUP))
            group = {
                "id": [f"r{n}" for n in numbers],
                "image": [base + n.to_bytes(8, "big") for n in numbers],  # (after IEND)
                "question": ["What is in the image?"] * len(numbers),
            }
            writer.write_table(pa.table(group, schema=schema))
            if on_rows is not None:
                on_rows(len(numbers))
    return path


def write_shards(folder: Path, rows: int, on_rows: Callable[[int], None] | None = None) -> str:
    """WebDataset shards of ``rows`` samples (a PNG and a JSON each); their pattern."""
    base = _tiny_png()
    folder.mkdir(parents=True, exist_ok=True)
    shards = (rows + ROWS_PER_SHARD - 1) // ROWS_PER_SHARD
    question = b'{"question": "What is in the image?"}'
    for shard in range(shards):
        numbers = range(shard * ROWS_PER_SHARD, min(rows, (shard + 1) * ROWS_PER_SHARD))
        with tarfile.open(folder / f"{shard:05d}.tar", "w") as tar:
            for n in numbers:
                for name, data in ((f"{n:09d}.png", base + n.to_bytes(8, "big")),
                                   (f"{n:09d}.json", question)):  # fmt: skip
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        if on_rows is not None:
            on_rows(len(numbers))
    return str(folder / f"{{00000..{shards - 1:05d}}}.tar")


def measure(source: str, database_url: str, settings: Settings) -> SubmitFigures:
    """Submit ``source`` into a scratch database beside ``database_url``, in a process of
    its own; its figures."""
    with scratch_database(database_url) as scratch:
        child = settings.model_copy(update={"database_url": scratch})
        context = multiprocessing.get_context("spawn")
        with context.Pool(1) as pool:
            return pool.apply(_submit, (source, child))


def _submit(source: str, settings: Settings) -> SubmitFigures:
    sessions = open_store(settings.database_url)  # (migrated before the clock starts)
    started = time.perf_counter()
    corpus = open_source(source, settings=settings)
    submitted = submit_corpus(
        sessions, corpus.rows, source=corpus.location, name="bench", settings=settings
    )
    seconds = time.perf_counter() - started
    sessions.close()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # (KiB on Linux)
    return SubmitFigures(submitted.items_added, seconds, peak_kb / 1024, submitted.jobs_created)


def scratch_folder() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="speceyes-bench-submit-")
