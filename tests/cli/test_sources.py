"""``speceyes annotate`` on corpora where they live: WebDataset shards, ``datasets``
save_to_disk folders, Parquet tables, each from a folder, an S3-compatible server and an
HTTP server on 127.0.0.1 (moto's server mode stands in for S3: no real S3 is reachable
here). Nothing is copied into the upload store; broken samples fail alone, named."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from cli.main import main
from common.store.db import open_store
from common.store.tables import BatchItem, Job
from tests.helpers.corpora import (
    Sample,
    http_folder,
    image_bytes,
    object_store,
    samples,
    write_parquet,
    write_saved_dataset,
    write_shard,
    write_shards,
)

SCRIPTED = ["--backend", "scripted"]


@pytest.fixture(autouse=True)
def uploads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The upload store: a test asserts nothing lands there."""
    folder = tmp_path / "uploads"
    monkeypatch.setenv("SPECEYES_UPLOAD_DIR", str(folder))
    return folder


def annotate(db: Path, *args: str) -> int:
    return main(["annotate", *args, *SCRIPTED, "--db", f"sqlite:///{db}", "--no-progress"])


def rows_of(out: Path) -> dict[str, dict]:
    return {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}


def jobs_of(db: Path) -> dict[str, Job]:
    sessions = open_store(f"sqlite:///{db}")
    try:
        with sessions() as session:
            found = session.execute(
                select(BatchItem.item_id, Job).join(Job, Job.id == BatchItem.job_id)
            ).all()
            return {item_id: job for item_id, job in found}
    finally:
        sessions.close()


def broken_shard(path: Path) -> Path:
    """A shard with a sample without an image, one whose JSON is broken and one whose
    image bytes are not an image, between good ones."""
    good = samples(2, start=100)
    no_image = Sample("000201", {"json": good[0].members["json"]})
    bad_json = Sample("000202", {"png": image_bytes(202), "json": b"{not json"})
    not_image = Sample(
        "000203", {"png": b"\x89PNG\r\n\x1a\nbroken", "json": good[0].members["json"]}
    )
    return write_shard(path, [good[0], no_image, bad_json, not_image, good[1]])


# -- local sources ---------------------------------------------------------------------


def test_a_brace_pattern_of_shards_is_annotated_in_place(tmp_path: Path, uploads: Path, capsys):
    write_shards(tmp_path / "shards", shards=3, per_shard=3)
    broken_shard(tmp_path / "shards" / "00003.tar")
    out, db = tmp_path / "out.jsonl", tmp_path / "s.db"

    code = annotate(db, str(tmp_path / "shards" / "{00000..00003}.tar"), "--out", str(out))

    printed = capsys.readouterr()
    assert code == 1  # the broken samples failed
    rows = rows_of(out)
    assert len(rows) == 14  # 3 x 3 good + 5 in the broken shard, each its own row
    good = [f"{i:06d}" for i in range(9)] + ["000100", "000101"]
    assert all(rows[key]["status"] == "done" for key in good)
    assert rows["000000"]["question"] == "What colour is sample 0?"
    assert rows["000000"]["options"] == ["red", "blue"] and rows["000000"]["expected"] == "red"
    assert rows["000201"]["error_code"] == "image_missing"
    assert rows["000201"]["error"].startswith("00003.tar key 000201: no image member")
    assert rows["000202"]["error"].startswith("00003.tar key 000202: the json member is not")
    assert rows["000203"]["error_code"] == "image_error"  # failed by the worker that read it
    assert "00003.tar member 000203.png" in rows["000203"]["error"]
    assert "00003.tar key 000201" in printed.err  # named as it is read
    # nothing copied: each job names its tar member, with the digest of its bytes
    assert not uploads.exists()
    locator = json.loads(jobs_of(db)["000004"].image_path)
    shard = (tmp_path / "shards" / "00001.tar").resolve()
    assert locator["tar"] == str(shard) and locator["member"] == "000004.png"
    data = shard.read_bytes()[locator["offset"] : locator["offset"] + locator["size"]]
    assert data == image_bytes(4)


def test_the_same_shards_again_resume_and_a_changed_member_is_caught(tmp_path: Path, capsys):
    shard = write_shard(tmp_path / "one.tar", samples(3))
    db = tmp_path / "s.db"
    assert annotate(db, str(shard)) == 0
    assert annotate(db, str(shard)) == 0
    assert "resumed: 3 rows, 0 new jobs" in capsys.readouterr().out
    # the same bytes at the same place, other pixels: the worker's digest check fails it
    from common.config import ImageSettings
    from common.pipeline.funnel import prepare_query

    job = jobs_of(db)["000001"]
    data = bytearray(shard.read_bytes())
    place = json.loads(job.image_path)
    replaced = image_bytes(50)[: place["size"]].ljust(place["size"], b"\0")
    data[place["offset"] : place["offset"] + place["size"]] = replaced
    shard.write_bytes(bytes(data))
    from common.sources.reading import _GROUPS, _RECENT

    _GROUPS.clear(), _RECENT.clear()
    failed = prepare_query(
        job.id, job.image_path, job.question, None, ImageSettings(), expected_hash=job.image_hash
    )
    assert failed.code == "image_changed"  # type: ignore[union-attr]
    assert "one.tar member 000001.png changed since it was submitted" in failed.message  # type: ignore[union-attr]


def test_a_truncated_shard_fails_one_row_naming_it_and_the_rest_goes_on(tmp_path: Path):
    whole = write_shard(tmp_path / "s" / "00000.tar", samples(4)).read_bytes()
    (tmp_path / "s" / "00000.tar").write_bytes(whole[: len(whole) // 2 + 100])
    write_shard(tmp_path / "s" / "00001.tar", samples(2, start=10))
    out = tmp_path / "out.jsonl"

    annotate(tmp_path / "s.db", str(tmp_path / "s" / "{00000..00001}.tar"), "--out", str(out))

    rows = rows_of(out)
    assert rows["000010"]["status"] == rows["000011"]["status"] == "done"
    broken = rows[f"{(tmp_path / 's' / '00000.tar').resolve()}#broken"]
    assert broken["status"] == "failed" and "00000.tar: truncated or corrupt" in broken["error"]


def test_a_compressed_shard_is_refused_unless_its_images_are_copied(
    tmp_path: Path, uploads, capsys
):
    shard = tmp_path / "s.tar.gz"
    with tarfile.open(shard, "w:gz") as tar:
        for sample in samples(2):
            for extension, data in sample.members.items():
                info = tarfile.TarInfo(f"{sample.key}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    assert annotate(tmp_path / "a.db", str(shard)) == 2
    assert "s.tar.gz is compressed" in capsys.readouterr().err
    assert annotate(tmp_path / "b.db", str(shard), "--copy-images") == 0
    assert len(list(uploads.rglob("*.png"))) == 2


def test_a_save_to_disk_folder_is_annotated_by_its_columns(tmp_path: Path, uploads: Path):
    folder = write_saved_dataset(tmp_path / "saved", 6)
    out, db = tmp_path / "out.jsonl", tmp_path / "s.db"

    assert annotate(db, str(folder), "--out", str(out)) == 0

    rows = rows_of(out)
    assert sorted(rows) == [f"row-{i}" for i in range(6)]
    assert rows["row-3"]["question"] == "What colour is row 3?"
    assert rows["row-3"]["options"] == ["red", "blue"] and rows["row-3"]["correct"] is not None
    assert not uploads.exists()
    locator = json.loads(jobs_of(db)["row-3"].image_path)
    assert locator["arrow"].endswith(".arrow") and locator["row"] == 3


def test_a_parquet_table_with_named_columns_and_a_path_column(tmp_path: Path, uploads: Path):
    # columns under other names, the image as bytes in one file and as a path in another
    table = pa.table(
        {
            "key": ["a", "b", "c"],
            "picture": [image_bytes(1), image_bytes(2), None],
            "prompt": ["Which?", "Which?", "Which?"],
            "choices": ['["x", "y"]', '["x", "y"]', '["x", "y"]'],
        }
    )
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2)
    out, db = tmp_path / "out.jsonl", tmp_path / "s.db"

    code = annotate(
        db,
        str(tmp_path / "t.parquet"),
        "--image-column", "picture", "--question-column", "prompt",
        "--options-column", "choices", "--id-column", "key", "--out", str(out),
    )  # fmt: skip

    rows = rows_of(out)
    assert code == 1 and rows["a"]["status"] == rows["b"]["status"] == "done"
    assert rows["a"]["options"] == ["x", "y"]
    assert rows["c"]["error_code"] == "image_missing" and "t.parquet row 2" in rows["c"]["error"]
    assert json.loads(jobs_of(db)["b"].image_path) == {
        "parquet": str((tmp_path / "t.parquet").resolve()),
        "column": "picture",
        "group": 0,
        "index": 1,
    }
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "p.png").write_bytes(image_bytes(7))
    pq.write_table(
        pa.table({"image": ["pics/p.png"], "question": ["Q?"]}), tmp_path / "paths.parquet"
    )
    assert annotate(tmp_path / "p.db", str(tmp_path / "paths.parquet")) == 0
    assert jobs_of(tmp_path / "p.db")["0"].image_path == str((tmp_path / "pics/p.png").resolve())
    assert not uploads.exists()


def test_a_table_without_its_columns_is_refused_before_any_job(tmp_path: Path, capsys):
    pq.write_table(pa.table({"name": ["a"]}), tmp_path / "t.parquet")
    assert annotate(tmp_path / "s.db", str(tmp_path / "t.parquet"), "-q", "Q?") == 2
    assert "has no image column" in capsys.readouterr().err


def test_results_go_out_as_parquet_parts_and_as_labelled_shards(tmp_path: Path, capsys):
    write_shards(tmp_path / "shards", shards=2, per_shard=5)
    pattern = str(tmp_path / "shards" / "{00000..00001}.tar")
    db = tmp_path / "s.db"

    assert annotate(db, pattern, "--out", f"{tmp_path}/parts/", "--shard-rows", "4") == 0
    parts = sorted((tmp_path / "parts").glob("*.parquet"))
    assert [p.name for p in parts] == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    assert sum(pq.read_metadata(p).num_rows for p in parts) == 10

    assert (
        annotate(db, pattern, "--out", f"{tmp_path}/labelled/", "--out-format", "webdataset") == 0
    )
    assert "wrote 2 shards" in capsys.readouterr().out
    with tarfile.open(tmp_path / "labelled" / "00001.tar") as tar:
        names = tar.getnames()
        label = json.loads(tar.extractfile("000007.speceyes.json").read())  # type: ignore[union-attr]
        kept = tar.extractfile("000007.png").read()  # type: ignore[union-attr]
    assert names[:3] == ["000005.png", "000005.json", "000005.speceyes.json"]
    assert len(names) == 15  # every member kept, a label added to each sample
    assert label["id"] == "000007" and label["status"] == "done" and label["final_answer"]
    assert kept == image_bytes(7)


def test_labelled_shards_need_a_webdataset_source(tmp_path: Path, capsys):
    write_parquet(tmp_path / "t.parquet", 2)
    code = annotate(tmp_path / "s.db", str(tmp_path / "t.parquet"), "--out", f"{tmp_path}/o/",
                    "--out-format", "webdataset")  # fmt: skip
    assert code == 2 and "needs WebDataset shards" in capsys.readouterr().err


# -- remote sources --------------------------------------------------------------------


def _corpora(root: Path) -> dict[str, tuple[str, int]]:
    """One of each kind under ``root``: the SOURCE that names it (relative to ``root``)
    and its rows."""
    write_shards(root / "shards", shards=2, per_shard=3)
    write_saved_dataset(root / "saved", 4)
    write_parquet(root / "table.parquet", 5)
    (root / "images").mkdir()
    for i in range(3):
        (root / "images" / f"{i}.png").write_bytes(image_bytes(30 + i))
    (root / "manifest.jsonl").write_text(
        "".join(json.dumps({"image": f"images/{i}.png", "question": "Q?"}) + "\n" for i in range(3))
    )
    return {
        "tar": ("shards/00001.tar", 3),
        "shards": ("shards/{00000..00001}.tar", 6),
        "saved": ("saved", 4),
        "table": ("table.parquet", 5),
        "manifest": ("manifest.jsonl", 3),
        "folder": ("images/", 3),
    }


@pytest.mark.parametrize("kind", ["tar", "shards", "saved", "table", "manifest", "folder"])
def test_each_source_is_read_from_an_s3_compatible_server(tmp_path: Path, uploads, kind):
    corpora = _corpora(tmp_path / "corpus")
    name, count = corpora[kind]
    out, db = tmp_path / "out.jsonl", tmp_path / "s.db"
    with object_store() as store:
        base = store.upload(tmp_path / "corpus", "corpus")
        args = ["-q", "What is it?"] if kind == "folder" else []
        assert annotate(db, f"{base}/{name}", *args, "--out", str(out)) == 0
        store.upload(tmp_path / "corpus", "other")  # (the store is still up: s3 out)
        # (a prefix of its own: another batch's parts in one are refused, never replaced)
        assert annotate(db, f"{base}/{name}", *args, "--out", f"s3://other/results-{kind}/") == 0
        import fsspec

        written = fsspec.filesystem("s3").ls(f"other/results-{kind}")
        names = sorted(name.rsplit("/", 1)[-1] for name in written)
        assert names == ["_speceyes.json", "part-00000.parquet"]  # (the parts, whose batch)
        if kind == "shards":  # labelled shards written back to the store
            labelled = "s3://other/labelled/"
            assert (
                annotate(db, f"{base}/{name}", "--out", labelled, "--out-format", "webdataset") == 0
            )
            with (
                fsspec.open("s3://other/labelled/00001.tar", "rb") as handle,
                tarfile.open(fileobj=handle) as tar,
            ):
                names = tar.getnames()
            assert "000004.speceyes.json" in names and len(names) == 9
    rows = rows_of(out)
    assert len(rows) == count and all(row["status"] == "done" for row in rows.values())
    assert not uploads.exists()
    images = [job.image_path for job in jobs_of(db).values()]
    assert all("s3://corpus/" in image for image in images)


@pytest.mark.parametrize("kind", ["tar", "shards", "saved", "table", "manifest"])
def test_each_source_is_read_from_an_http_server(tmp_path: Path, uploads, kind):
    corpora = _corpora(tmp_path / "corpus")
    name, count = corpora[kind]
    out, db = tmp_path / "out.jsonl", tmp_path / "s.db"
    with http_folder(tmp_path / "corpus") as base:
        assert annotate(db, f"{base}/{name}", "--out", str(out)) == 0
    rows = rows_of(out)
    assert len(rows) == count and all(row["status"] == "done" for row in rows.values())
    assert not uploads.exists()


def test_a_missing_remote_source_is_a_clear_error(tmp_path: Path, capsys):
    with object_store() as store:
        store.upload(write_shards(tmp_path / "c", 1, 1)[0].parent, "corpus")
        assert annotate(tmp_path / "s.db", "s3://corpus/nothing.parquet") == 2
    assert "nothing.parquet" in capsys.readouterr().err


# -- hostile corpora -------------------------------------------------------------------


def test_a_table_may_name_images_inside_its_own_folder_only(tmp_path: Path, uploads: Path):
    """Text in an image column is the corpus's, not the operator's: a path that leaves
    the table's folder, an absolute path elsewhere or a URL fails its row, unread."""
    (tmp_path / "secret.png").write_bytes(image_bytes(1))
    (tmp_path / "t" / "pics").mkdir(parents=True)
    (tmp_path / "t" / "pics" / "ok.png").write_bytes(image_bytes(2))
    (tmp_path / "t" / "pics" / "out.png").symlink_to(tmp_path / "secret.png")
    values = {
        "inside": "pics/ok.png",
        "climbs": "../secret.png",
        "absolute": str(tmp_path / "secret.png"),
        "link-out": "pics/out.png",
        "url": "http://127.0.0.1:9/latest/meta-data",
    }
    table = pa.table({"id": list(values), "image": list(values.values())})
    pq.write_table(table, tmp_path / "t" / "table.parquet")
    out = tmp_path / "out.jsonl"

    assert annotate(tmp_path / "s.db", str(tmp_path / "t" / "table.parquet"), "-q", "Q?",
                    "--out", str(out)) == 1  # fmt: skip

    rows = rows_of(out)
    assert rows["inside"]["status"] == "done"
    for name in ("climbs", "absolute", "link-out", "url"):
        assert rows[name]["status"] == "failed", name
        assert "outside the table's folder" in rows[name]["error"], name
    with http_folder(tmp_path / "t") as base:  # a remote table naming a local file
        remote = tmp_path / "r.jsonl"
        annotate(tmp_path / "r.db", f"{base}/table.parquet", "-q", "Q?", "--out", str(remote))
    assert rows_of(remote)["absolute"]["status"] == "failed"
    assert rows_of(remote)["inside"]["status"] == "done"


def test_a_remote_manifest_names_objects_under_its_own_prefix_only(tmp_path: Path):
    (tmp_path / "c" / "images").mkdir(parents=True)
    (tmp_path / "c" / "images" / "a.png").write_bytes(image_bytes(1))
    (tmp_path / "secret.png").write_bytes(image_bytes(2))
    lines = [
        {"id": "ok", "image": "images/a.png"},
        {"id": "climbs", "image": "../secret.png"},
        {"id": "absolute", "image": "/etc/hostname"},
        {"id": "elsewhere", "image": "http://127.0.0.1:9/x.png"},
    ]
    (tmp_path / "c" / "m.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    with http_folder(tmp_path / "c") as base:
        annotate(tmp_path / "s.db", f"{base}/m.jsonl", "-q", "Q?", "--out", str(out))
    rows = rows_of(out)
    assert rows["ok"]["status"] == "done"
    for name in ("climbs", "absolute", "elsewhere"):
        assert "outside the manifest's prefix" in rows[name]["error"], name
    # a manifest on this machine names files, never URLs
    (tmp_path / "local.jsonl").write_text(json.dumps(lines[3]) + "\n")
    annotate(tmp_path / "l.db", str(tmp_path / "local.jsonl"), "-q", "Q?", "--out", str(out))
    assert "names files, not URLs" in rows_of(out)["elsewhere"]["error"]


def test_a_saved_dataset_naming_a_split_outside_it_is_refused(tmp_path: Path, capsys):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": ["../elsewhere"]}))
    assert annotate(tmp_path / "s.db", str(folder)) == 2
    assert "one outside it" in capsys.readouterr().err


def test_a_sidecar_nested_too_deep_fails_its_sample_alone(tmp_path: Path):
    deep = b"[" * 100_000 + b"]" * 100_000
    shard = write_shard(
        tmp_path / "s.tar", [*samples(1), Sample("000009", {"png": image_bytes(9), "json": deep})]
    )
    out = tmp_path / "out.jsonl"
    assert annotate(tmp_path / "s.db", str(shard), "--out", str(out)) == 1
    rows = rows_of(out)
    assert rows["000000"]["status"] == "done"
    assert "nested too deep" in rows["000009"]["error"]


def test_labelled_shards_never_overwrite_each_other_or_their_source(tmp_path: Path, capsys):
    write_shards(tmp_path / "train", 1, 2)
    write_shards(tmp_path / "test", 1, 2)
    both = str(tmp_path / "{train,test}" / "00000.tar")
    labelled = ["--out-format", "webdataset"]
    assert annotate(tmp_path / "a.db", both, "--out", f"{tmp_path}/o/", *labelled) == 2
    assert "would overwrite each other" in capsys.readouterr().err
    source = str(tmp_path / "train" / "00000.tar")
    assert annotate(tmp_path / "b.db", source, "--out", f"{tmp_path}/train/", *labelled) == 2
    assert "would overwrite the source shard" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # (refused before any work)
