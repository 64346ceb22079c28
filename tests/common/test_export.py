"""Exports: one fixed schema, whatever a batch holds."""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq

from cli.main import main
from common.export import SCHEMA, result_row, write_rows
from common.store.tables import BatchItem, Job
from tests.helpers.images import write_images


def test_a_row_has_the_schemas_columns_in_order():
    row = result_row(BatchItem(item_id="a", position=0), Job(id="j", question="Q?", status="done"))
    assert list(row) == SCHEMA.names


def test_batches_of_any_content_export_one_schema_that_reads_as_one_dataset(tmp_path: Path):
    """A batch where nothing was accepted (every image broken: every column but a few is
    empty) and one where all was: the two files have the same schema and read together."""
    write_images(tmp_path / "good", 3)
    (tmp_path / "bad").mkdir()
    for name in ("a.png", "b.jpg"):
        (tmp_path / "bad" / name).write_bytes(b"not an image")
    db = f"sqlite:///{tmp_path / 's.db'}"
    for folder in ("good", "bad"):
        out = tmp_path / f"{folder}.parquet"
        flags = ["--backend", "scripted", "--db", db, "--no-progress", "--out", str(out)]
        main(["annotate", str(tmp_path / folder), "-q", "Q?", *flags])
        assert pq.read_schema(out) == SCHEMA, folder
    both = ds.dataset([str(tmp_path / "good.parquet"), str(tmp_path / "bad.parquet")]).to_table()
    assert both.num_rows == 5
    assert sorted(both.column("status").to_pylist()) == ["done"] * 3 + ["failed"] * 2


def test_an_empty_export_still_has_the_schema(tmp_path: Path):
    assert write_rows([], tmp_path / "none.parquet") == 0
    assert pq.read_schema(tmp_path / "none.parquet") == SCHEMA


def test_confidence_is_the_accepted_answers_and_gate_confidence_the_small_models():
    item = BatchItem(item_id="a", position=0)
    deferred = Job(id="j", question="Q?", status="done", answered_by="large", confidence=0.41)
    accepted = Job(id="k", question="Q?", status="done", answered_by="small", confidence=0.99)
    assert (
        result_row(item, deferred)["confidence"],
        result_row(item, deferred)["gate_confidence"],
    ) == (None, 0.41)
    assert (
        result_row(item, accepted)["confidence"],
        result_row(item, accepted)["gate_confidence"],
    ) == (0.99, 0.99)
