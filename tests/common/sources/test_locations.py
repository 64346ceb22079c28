"""Locators (``common.sources.locations``) and the WebDataset helpers they are made by."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.config import ImageSettings
from common.errors import ImageError, InvalidInput, RetryableError, SourceUnavailable
from common.sources.locations import describe, is_local_file, parquet_row, tar_member
from common.sources.reading import _GROUPS, _RECENT, read_located
from common.sources.webdataset import expand_braces, read_samples, split_name
from tests.helpers.corpora import image_bytes, object_store, samples, write_shard


def test_brace_patterns_expand_as_shard_sets_are_named():
    assert expand_braces("s/{00000..00002}.tar") == ["s/00000.tar", "s/00001.tar", "s/00002.tar"]
    assert expand_braces("{8..10}.tar") == ["8.tar", "9.tar", "10.tar"]
    assert expand_braces("{a,b}/{0..1}.tar") == ["a/0.tar", "a/1.tar", "b/0.tar", "b/1.tar"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    with pytest.raises(InvalidInput, match="runs backwards"):
        expand_braces("{5..1}.tar")


def test_members_are_grouped_by_key_as_webdataset_splits_names():
    assert split_name("a/b.c.jpg") == ("a/b", "c.jpg")
    assert split_name("000123.JPG") == ("000123", "jpg")
    assert split_name("dir.v2/000123.json") == ("dir.v2/000123", "json")


def test_a_tar_member_is_read_by_its_range_and_checked_against_the_limit(tmp_path: Path):
    shard = write_shard(tmp_path / "s.tar", samples(3))
    (first, second, _) = read_samples(str(shard))
    image = second.members["png"]
    locator = tar_member(str(shard), image.name, image.offset, image.size)
    assert read_located(locator, ImageSettings()) == image_bytes(1)
    assert describe(locator) == f"{shard} member 000001.png"
    with pytest.raises(ImageError, match="above the limit") as refused:
        read_located(locator, ImageSettings(max_bytes=image.size - 1))
    assert refused.value.code == "image_too_large"
    past = tar_member(str(shard), "x.png", shard.stat().st_size - 10, 100)
    with pytest.raises(ImageError, match="ends before the member does"):
        read_located(past, ImageSettings())
    assert first.key == "000000" and set(first.members) == {"png", "json"}


def test_a_parquet_cell_is_read_from_its_row_group(tmp_path: Path):
    table = pa.table({"image": [image_bytes(i) for i in range(5)], "n": list(range(5))})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2)
    locator = parquet_row(str(tmp_path / "t.parquet"), "image", 1, 1)  # row 3
    assert read_located(locator, ImageSettings()) == image_bytes(3)
    assert "row group 1 row 1" in describe(locator)
    for wrong, reason in (
        (parquet_row(str(tmp_path / "t.parquet"), "n", 0, 0), "holds no image bytes"),
        (parquet_row(str(tmp_path / "t.parquet"), "image", 9, 0), "fewer row groups"),
        (parquet_row(str(tmp_path / "t.parquet"), "image", 2, 5), "row is not in the file"),
        (parquet_row(str(tmp_path / "gone.parquet"), "image", 0, 0), "not found"),
    ):
        with pytest.raises(ImageError, match=reason):
            read_located(wrong, ImageSettings())


@pytest.mark.parametrize(
    "locator, reason",
    [
        ('{"tar": "relative/s.tar", "offset": 0, "size": 1}', "not an absolute path"),
        ('{"zip": "/s.zip"}', "names no container"),
        ('{"tar": "/s.tar", "parquet": "/t.parquet"}', "names no container"),
        ('{"tar": "/s.tar", "offset": -1, "size": 1}', "no valid 'offset'"),
        ('{"tar": "/s.tar", "offset": true, "size": 1}', "no valid 'offset'"),
        ("{not json", "not valid JSON"),
        ('{"tar": 5}', "names no container"),
    ],
)
def test_a_locator_we_did_not_write_is_refused(locator: str, reason: str):
    with pytest.raises(ImageError, match=reason):
        read_located(locator, ImageSettings())


def test_a_kept_group_is_read_anew_once_it_is_old(tmp_path: Path, monkeypatch):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"image": [image_bytes(1)]}), path)
    locator = parquet_row(str(path), "image", 0, 0)
    assert read_located(locator, ImageSettings()) == image_bytes(1)
    pq.write_table(pa.table({"image": [image_bytes(2)]}), path)
    assert read_located(locator, ImageSettings()) == image_bytes(1)  # kept a while
    monkeypatch.setattr(_GROUPS, "max_age_s", 0.0)
    monkeypatch.setattr(_RECENT, "max_age_s", 0.0)
    assert read_located(locator, ImageSettings()) == image_bytes(2)  # (the digest then fails it)


def test_only_plain_paths_are_local_files():
    assert is_local_file("/data/a.png")
    assert not is_local_file("s3://b/a.png") and not is_local_file("HTTPS://x/a.png")
    assert not is_local_file(json.dumps({"tar": "/s.tar"}))


def test_a_store_that_stops_answering_is_a_retry_not_a_failure(tmp_path: Path, monkeypatch):
    """The worker puts such a job back to wait (``SourceUnavailable`` is retryable), as
    for a model server that is down; a missing object fails its job for good."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # (botocore's own retries: one try)
    (tmp_path / "corpus").mkdir()
    pq.write_table(pa.table({"image": [image_bytes(0)]}), tmp_path / "corpus" / "t.parquet")
    with object_store() as store:
        base = store.upload(tmp_path / "corpus", "corpus")
        locator = parquet_row(f"{base}/t.parquet", "image", 0, 0)
        assert read_located(locator, ImageSettings()) == image_bytes(0)
        with pytest.raises(ImageError) as missing:
            read_located(f"{base}/nothing.png", ImageSettings())
        assert missing.value.code == "image_missing"
        store.stop()
        _GROUPS.clear(), _RECENT.clear()
        with pytest.raises(SourceUnavailable, match="cannot be reached now"):
            read_located(locator, ImageSettings())
        assert issubclass(SourceUnavailable, RetryableError)
