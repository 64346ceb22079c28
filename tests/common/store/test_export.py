"""Exports: one fixed schema, whatever a batch holds."""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq

from cli.main import main
from common.store.export import SCHEMA, parts_of, result_row, write_rows
from common.store.tables import BatchItem, Job
from tests.helpers.images import write_images

# The export's columns and types as users' readers were written against them, spelled out
# here rather than read from SCHEMA: a change to SCHEMA must show up as a change here
# (and in docs/annotating.md), never pass silently.
PUBLISHED = [
    ("id", "string"),
    ("position", "int64"),
    ("job_id", "string"),
    ("image", "string"),
    ("question", "string"),
    ("options", "list<item: string>"),
    ("status", "string"),
    ("answer", "string"),
    ("answered_by", "string"),
    ("confidence", "double"),
    ("small_answer", "string"),
    ("gate_confidence", "double"),
    ("screen_needs_tools", "bool"),
    ("defer_reason", "string"),
    ("agent_steps", "int64"),
    ("fast_s", "double"),
    ("agent_s", "double"),
    ("tokens_in", "int64"),
    ("tokens_out", "int64"),
    ("error_code", "string"),
    ("error", "string"),
    ("expected", "string"),
    ("split", "string"),
    ("category", "string"),
    ("correct", "bool"),
    ("audit_answer", "string"),
    ("audit_agrees", "bool"),
    ("reviewed_answer", "string"),
    ("reviewer", "string"),
    ("reviewed_at", "string"),
    ("final_answer", "string"),
]


def test_the_schema_is_the_published_one():
    assert [(field.name, str(field.type)) for field in SCHEMA] == PUBLISHED


def test_an_exported_file_reads_with_the_published_types(tmp_path: Path):
    item = BatchItem(item_id="a", position=0)
    job = Job(
        id="j", question="Q?", status="done", answered_by="small", confidence=0.123456789012345
    )
    write_rows([result_row(item, job)], tmp_path / "one.parquet")
    table = pq.read_table(tmp_path / "one.parquet")
    read = [(f.name, str(f.type).replace("<element:", "<item:")) for f in table.schema]
    assert read == PUBLISHED  # (Parquet names a list's values "element")
    assert table.column("confidence").to_pylist() == [0.123456789012345]  # (not float32's)


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


def test_a_folder_keeps_one_batchs_parts_and_refuses_another_batchs(tmp_path: Path, capsys):
    """`export A --out exp/` then `export B --out exp/` would leave only B: refused, A's
    parts kept; A again replaces its own; parts no export named are refused too."""
    db = f"sqlite:///{tmp_path / 's.db'}"
    for name in ("first", "second"):
        write_images(tmp_path / name, 2)
        main(
            [
                "annotate",
                str(tmp_path / name),
                "-q",
                "Q?",
                "--backend",
                "scripted",
                "--db",
                db,
                "--no-progress",
            ]
        )
    out = tmp_path / "exp"
    assert main(["export", "first", "--out", f"{out}/", "--db", db]) == 0
    before = pq.read_table(out / "part-00000.parquet").column("job_id").to_pylist()
    capsys.readouterr()
    assert main(["export", "second", "--out", f"{out}/", "--db", db]) == 2
    assert "holds batch " in capsys.readouterr().err
    assert pq.read_table(out / "part-00000.parquet").column("job_id").to_pylist() == before
    assert main(["export", "first", "--out", f"{out}/", "--db", db]) == 0  # its own again
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "part-00000.parquet").write_bytes(b"someone else's")
    assert main(["export", "first", "--out", f"{foreign}/", "--db", db]) == 2
    assert "parts no export of ours named" in capsys.readouterr().err


def test_the_parts_are_counted_in_words():
    assert [parts_of(n) for n in (1, 2)] == ["1 Parquet file", "2 Parquet files"]


def _rows(count: int) -> list[dict]:
    return [{"id": f"r{n}", "position": n} for n in range(count)]


def test_an_export_counts_the_rows_and_the_file_it_wrote_here_or_remote(tmp_path: Path):
    from common.store.export import Output, export
    from tests.helpers.corpora import object_store

    assert export(_rows(3), Output(str(tmp_path / "o.jsonl"), "file"), 10, "b") == (3, 1)
    (tmp_path / "empty").mkdir()
    with object_store() as store:
        bucket = store.upload(tmp_path / "empty", "exports")
        assert export(_rows(4), Output(f"{bucket}/o.jsonl", "file"), 10, "b") == (4, 1)


def test_a_smaller_export_to_a_folder_removes_the_parts_it_no_longer_has(tmp_path: Path):
    from common.store.export import write_parts

    folder = tmp_path / "parts"
    assert write_parts(_rows(5), f"{folder}/", 2) == (5, 3)
    assert write_parts(_rows(2), f"{folder}/", 2) == (2, 1)
    assert sorted(path.name for path in folder.glob("part-*")) == ["part-00000.parquet"]


def test_labelled_shards_go_anywhere_but_over_their_sources(tmp_path: Path):
    import pytest

    from common.errors import InvalidInput
    from common.store.export import check_labelled

    source = str(tmp_path / "data" / "00000.tar")
    check_labelled([source], f"{tmp_path}/labelled/")  # (a folder of their own: fine)
    with pytest.raises(InvalidInput, match="would overwrite the source shard"):
        check_labelled([source], f"{tmp_path}/data/")


def test_a_key_in_two_shards_is_labelled_with_the_answer_to_its_own_image(tmp_path: Path):
    """Shards made apart may reuse keys: each sample's label is the row of its own image
    (by its digest), never the other shard's."""
    import json
    import tarfile

    from tests.helpers.corpora import Sample, image_bytes, write_shard

    for shard, offset in (("00000", 0), ("00001", 50)):
        members = {"png": image_bytes(offset), "json": json.dumps({"question": "Q?"}).encode()}
        write_shard(tmp_path / "shards" / f"{shard}.tar", [Sample("000000", members)])
    db = f"sqlite:///{tmp_path / 's.db'}"
    pattern = str(tmp_path / "shards" / "{00000..00001}.tar")
    flags = ["--backend", "scripted", "--db", db, "--no-progress"]
    assert main(["annotate", pattern, *flags, "--out", str(tmp_path / "rows.jsonl")]) == 0
    jobs = [
        json.loads(line)["job_id"] for line in (tmp_path / "rows.jsonl").read_text().splitlines()
    ]
    out = f"{tmp_path}/labelled/"
    assert main(["annotate", pattern, *flags, "--out", out, "--out-format", "webdataset"]) == 0
    labels = []
    for shard in ("00000", "00001"):
        with tarfile.open(tmp_path / "labelled" / f"{shard}.tar") as tar:
            labels.append(json.loads(tar.extractfile("000000.speceyes.json").read())["job_id"])  # type: ignore[union-attr]
    assert labels == jobs and len(set(jobs)) == 2


def test_an_output_is_named_by_its_last_suffix_whatever_its_case(tmp_path: Path):
    import pytest

    from common.errors import InvalidInput
    from common.store.export import Output, check_output

    assert check_output(str(tmp_path / "run.v2.JSONL")) == Output(
        str(tmp_path / "run.v2.JSONL"), "file"
    )
    assert check_output(str(tmp_path / "o.jsonl"), "jsonl").layout == "file"
    with pytest.raises(InvalidInput, match=r"ends in \.jsonl, not \.parquet"):
        check_output(str(tmp_path / "o.jsonl"), "parquet")
    (tmp_path / "a.b").mkdir()
    with pytest.raises(InvalidInput, match="name a file ending in"):
        check_output(str(tmp_path / "a.b" / "out"))  # (a dot in the folder is no suffix)


def test_a_folder_whose_marker_is_not_ours_is_refused(tmp_path: Path):
    import pytest

    from common.errors import InvalidInput
    from common.store.export import MARKER, claim_folder

    for marker in (b"{not json", b"[1, 2]"):  # unreadable, or not an object
        folder = tmp_path / marker.hex()
        folder.mkdir()
        (folder / MARKER).write_bytes(marker)
        (folder / "part-00000.parquet").write_bytes(b"x")
        with pytest.raises(InvalidInput, match="parts no export of ours named"):
            claim_folder(f"{folder}/", "b")


def test_exports_to_an_object_store_read_back_as_written(tmp_path: Path):
    import fsspec

    from common.store.export import Output, export, write_parts
    from tests.helpers.corpora import object_store

    (tmp_path / "empty").mkdir()
    with object_store() as store:
        bucket = store.upload(tmp_path / "empty", "results")
        assert export(_rows(3), Output(f"{bucket}/o.parquet", "file"), 10, "b") == (3, 1)
        with fsspec.open(f"{bucket}/o.parquet", "rb") as handle:
            assert pq.read_table(handle).column("id").to_pylist() == ["r0", "r1", "r2"]
        assert export(_rows(2), Output(f"{bucket}/o.jsonl", "file"), 10, "b") == (2, 1)
        with fsspec.open(f"{bucket}/o.jsonl", "rt") as handle:
            assert [line.split('"')[3] for line in handle.read().splitlines()] == ["r0", "r1"]
        assert write_parts(_rows(5), f"{bucket}/parts/", 2) == (5, 3)
        assert write_parts(_rows(1), f"{bucket}/parts/", 2) == (1, 1)
        filesystem, root = fsspec.core.url_to_fs(f"{bucket}/parts")
        assert [path.rsplit("/", 1)[1] for path in sorted(filesystem.glob(f"{root}/part-*"))] == [
            "part-00000.parquet"
        ]


def test_an_error_is_exported_only_for_a_job_that_stopped():
    """A job deferred by the gate keeps the gate's detail as its message while the agent
    answers: that is no error of the answer's, and not exported as one."""
    item = BatchItem(item_id="a", position=0)
    answered = Job(id="j", question="Q?", status="done", error_message="below tau")
    failed = Job(id="k", question="Q?", status="failed", error_message="no answer")
    assert (result_row(item, answered)["error"], result_row(item, failed)["error"]) == (
        None,
        "no answer",
    )


def test_only_the_disagreements_are_exported_for_review(sessions):
    from common.store import submission
    from common.store.export import batch_rows
    from tests.helpers.store import items, new_batch

    with sessions.begin() as session:
        batch = new_batch(session)
        submission.submit_items(session, batch, items("agrees", "disagrees", "unaudited"), "c")
        for job in session.query(Job):
            job.audit_agrees = {"/img/agrees.png": True, "/img/disagrees.png": False}.get(
                job.image_path
            )
        batch_id = batch.id
    with sessions() as session:
        every = [row["id"] for row in batch_rows(session, batch_id)]
        review = [row["id"] for row in batch_rows(session, batch_id, audit_disagreements=True)]
    assert every == ["agrees", "disagrees", "unaudited"] and review == ["disagrees"]


def test_jsonl_is_written_as_utf8_text_not_escapes(tmp_path: Path):
    from common.store.export import Output, export

    assert write_rows([{"id": "é", "position": 0}], tmp_path / "o.jsonl") == 1
    assert export([{"id": "é"}], Output(str(tmp_path / "e.jsonl"), "file"), 10, "b") == (1, 1)
    for name in ("o.jsonl", "e.jsonl"):
        assert '"é"' in (tmp_path / name).read_text(encoding="utf-8")


def test_a_failed_write_leaves_neither_the_file_nor_a_partial(tmp_path: Path):
    import pytest

    def rows():
        yield {"id": "a", "position": 0}
        raise RuntimeError("the database went away")

    for name in ("o.jsonl", "o.parquet"):
        with pytest.raises(RuntimeError):
            write_rows(rows(), tmp_path / name)
    assert list(tmp_path.iterdir()) == []


def test_two_source_shards_of_one_name_are_refused_by_the_first_name(tmp_path: Path):
    import pytest

    from common.errors import InvalidInput
    from common.store.export import check_labelled

    shards = [str(tmp_path / folder / name) for folder in "ab" for name in ("1.tar", "0.tar")]
    with pytest.raises(InvalidInput, match=r"two source shards are named 0\.tar"):
        check_labelled(shards, f"{tmp_path}/out/")
    # a source named another way (through ..) is still the source
    roundabout = str(tmp_path / "data" / ".." / "data" / "00000.tar")
    with pytest.raises(InvalidInput, match="would overwrite the source shard"):
        check_labelled([roundabout], f"{tmp_path}/data/")


def _labelled_corpus(tmp_path: Path) -> tuple[str, str]:
    """Two shards of 2 and 1 samples annotated into a database: (db, batch name)."""
    import json

    from tests.helpers.corpora import Sample, image_bytes, write_shard

    for shard, count in (("00000", 2), ("00001", 1)):
        samples = [
            Sample(
                f"{shard}-{n}",
                {"png": image_bytes(n), "json": json.dumps({"question": "Q?"}).encode()},
            )
            for n in range(count)
        ]
        write_shard(tmp_path / "shards" / f"{shard}.tar", samples)
    db = f"sqlite:///{tmp_path / 's.db'}"
    pattern = str(tmp_path / "shards" / "{00000..00001}.tar")
    flags = ["--backend", "scripted", "--db", db, "--no-progress", "--name", "labelled"]
    assert main(["annotate", pattern, *flags]) == 0
    return db, "labelled"


def test_labelled_shards_are_counted_and_go_to_an_object_store_too(tmp_path: Path):
    import tarfile

    import fsspec
    import pytest

    from common.errors import InvalidInput
    from common.store.db import open_store
    from common.store.export import Output, export, write_labelled
    from common.store.tables import Batch
    from tests.helpers.corpora import Sample, image_bytes, object_store, write_shard

    db, name = _labelled_corpus(tmp_path)
    shards = [str(tmp_path / "shards" / f"0000{n}.tar") for n in (0, 1)]
    # since the run: 00001-0's image changed (it keeps its key's label), 00001-7 was
    # added (not labelled), and 00001-9 has no image (not labelled; no digest to read)
    added = [Sample(f"00001-{n}", {"png": image_bytes(n + 5)}) for n in (0, 7)]
    added.append(Sample("00001-9", {"json": b"{}"}))
    write_shard(tmp_path / "shards" / "00001.tar", added)
    sessions = open_store(db)
    try:
        with sessions() as session:
            batch_id = session.query(Batch).filter_by(name=name).one().id
            assert write_labelled(session, batch_id, shards, f"{tmp_path}/here/") == (2, 5, 3)
            # into a folder not made yet, and again into the same one
            for _ in range(2):
                deeper = f"{tmp_path}/new/deeper/"
                assert write_labelled(session, batch_id, shards, deeper) == (2, 5, 3)
            (tmp_path / "empty").mkdir()
            with object_store() as store:
                bucket = store.upload(tmp_path / "empty", "labelled")
                assert write_labelled(session, batch_id, shards, f"{bucket}/out/") == (2, 5, 3)
                remote = fsspec.open(f"{bucket}/out/00001.tar", "rb")
                with remote as handle, tarfile.open(fileobj=handle) as tar:
                    assert "00001-0.speceyes.json" in tar.getnames()
                # buckets S3 cannot create: one clear error
                for bad in ("s3://Bad_Bucket!/", "s3://b/"):  # (refused here; by S3)
                    with pytest.raises(InvalidInput, match=f"cannot write {bad}"):
                        write_labelled(session, batch_id, shards, f"{bad}out/")
                with pytest.raises(InvalidInput, match=r"cannot write s3:///o\.jsonl: ValueError"):
                    export(_rows(1), Output("s3:///o.jsonl", "file"), 10, "b")  # (no bucket)
            broken = tmp_path / "broken" / "00000.tar"
            broken.parent.mkdir()
            broken.write_bytes(b"not a tar at all" * 100)
            with pytest.raises(Exception):  # noqa: B017 (whatever the reader raises)
                write_labelled(session, batch_id, [str(broken)], f"{tmp_path}/out/")
            assert list((tmp_path / "out").iterdir()) == []  # no partial shard left
    finally:
        sessions.close()


def test_an_output_is_written_into_folders_made_for_it_and_never_over_a_folder(tmp_path: Path):
    import pytest

    from common.errors import InvalidInput
    from common.store.export import check_output

    for _ in range(2):  # (made, then there already)
        assert write_rows(_rows(1), tmp_path / "new" / "deeper" / "o.jsonl") == 1
    (tmp_path / "taken.jsonl").mkdir()
    with pytest.raises(InvalidInput, match="it is a folder"):
        check_output(str(tmp_path / "taken.jsonl"))
