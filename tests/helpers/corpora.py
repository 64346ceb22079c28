"""Corpora as they are found in the wild, made small: WebDataset shards, Parquet tables,
``datasets`` save_to_disk folders; and the stores they sit in, started on 127.0.0.1: an
S3-compatible server (moto's server mode: no real S3 can be reached from here) and an
HTTP server that answers range requests, as object stores and CDNs do."""

from __future__ import annotations

import io
import json
import os
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from lab.ports import reserved_port


def image_bytes(index: int, size: tuple[int, int] = (40, 30)) -> bytes:
    """A distinct small PNG per index (distinct bytes: distinct jobs)."""
    buffer = io.BytesIO()
    Image.new("RGB", size, (index * 37 % 256, index * 11 % 256, 120)).save(buffer, "PNG")
    return buffer.getvalue()


@dataclass(frozen=True)
class Sample:
    key: str
    members: dict[str, bytes]  # extension -> bytes


def samples(count: int, start: int = 0, question: bool = True) -> list[Sample]:
    """``count`` samples: a PNG and a JSON sidecar (question, options, answer) each."""
    made = []
    for index in range(start, start + count):
        sidecar: dict[str, Any] = {"options": ["red", "blue"], "answer": "red"}
        if question:
            sidecar["question"] = f"What colour is sample {index}?"
        made.append(
            Sample(
                f"{index:06d}",
                {"png": image_bytes(index), "json": json.dumps(sidecar).encode()},
            )
        )
    return made


def write_shard(path: Path, items: list[Sample]) -> Path:
    """A tar shard holding ``items``, members in sample order (as WebDataset writes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for sample in items:
            for extension, data in sample.members.items():
                info = tarfile.TarInfo(f"{sample.key}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def write_shards(folder: Path, shards: int, per_shard: int) -> list[Path]:
    """``shards`` shards named ``00000.tar`` and on, ``per_shard`` samples each."""
    return [
        write_shard(folder / f"{n:05d}.tar", samples(per_shard, start=n * per_shard))
        for n in range(shards)
    ]


def table_rows(count: int, start: int = 0) -> dict[str, list[Any]]:
    ids = [f"row-{i}" for i in range(start, start + count)]
    return {
        "id": ids,
        "image": [image_bytes(i) for i in range(start, start + count)],
        "question": [f"What colour is row {i}?" for i in range(start, start + count)],
        "options": [["red", "blue"]] * count,
        "answer": ["red"] * count,
    }


def write_parquet(path: Path, count: int, *, row_group_size: int = 4) -> Path:
    """A Parquet table: id, image (PNG bytes), question, options (a list), answer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(table_rows(count)), path, row_group_size=row_group_size)
    return path


def write_saved_dataset(folder: Path, count: int) -> Path:
    """A ``datasets`` save_to_disk folder, its image column of datasets' Image type."""
    import datasets  # (a dev dependency: only these tests write the format)

    rows = table_rows(count)
    rows["image"] = [{"bytes": data, "path": None} for data in rows["image"]]
    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "image": datasets.Image(),
            "question": datasets.Value("string"),
            "options": datasets.Sequence(datasets.Value("string")),
            "answer": datasets.Value("string"),
        }
    )
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(folder))
    return folder


# -- stores ---------------------------------------------------------------------------


@dataclass
class ObjectStore:
    """An S3-compatible server on 127.0.0.1 (moto); the AWS_* environment points at it
    (and every process this test starts inherits that)."""

    endpoint: str
    server: Any

    def stop(self) -> None:
        """Stop answering (a store that went away); stopping again is harmless."""
        if self.server is not None:
            self.server.stop()
            self.server = None

    def upload(self, folder: Path, bucket: str) -> str:
        """Every file under ``folder`` into ``bucket``; returns ``s3://bucket``."""
        import fsspec

        filesystem = fsspec.filesystem("s3")
        if not filesystem.exists(bucket):
            filesystem.mkdir(bucket)
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            filesystem.pipe(f"{bucket}/{path.relative_to(folder).as_posix()}", path.read_bytes())
        filesystem.invalidate_cache()
        return f"s3://{bucket}"

    def put(self, url: str, data: bytes) -> None:
        import fsspec

        filesystem = fsspec.filesystem("s3")
        filesystem.pipe(url, data)
        filesystem.invalidate_cache()


@contextmanager
def object_store() -> Iterator[ObjectStore]:
    """Start moto's S3 server; set AWS_* to reach it; stop it and restore the env."""
    from moto.server import ThreadedMotoServer

    with reserved_port() as port:
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
    endpoint = f"http://127.0.0.1:{port}"
    names = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(names)
    store = ObjectStore(endpoint, server)
    try:
        yield store
    finally:
        store.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _forget_filesystems()


def _forget_filesystems() -> None:
    """fsspec keeps a filesystem per set of options: one made for this server must not
    serve the next test's."""
    import fsspec

    for protocol in ("s3", "http", "https"):
        fsspec.get_filesystem_class(protocol).clear_instance_cache()


class _RangeHandler(SimpleHTTPRequestHandler):
    """Files of a folder, with ``Range: bytes=A-B`` answered 206 (object stores do)."""

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def send_head(self):  # type: ignore[no-untyped-def]
        wanted = self.headers.get("Range")
        path = Path(self.translate_path(self.path))
        if not wanted or not path.is_file():
            return super().send_head()
        size = path.stat().st_size
        first_text, _, last_text = wanted.removeprefix("bytes=").partition("-")
        first = int(first_text) if first_text else max(0, size - int(last_text))
        last = min(int(last_text), size - 1) if last_text and first_text else size - 1
        if first >= size:
            self.send_error(416)
            return None
        handle = path.open("rb")
        handle.seek(first)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        self.send_header("Content-Length", str(last - first + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return io.BytesIO(handle.read(last - first + 1))


@contextmanager
def http_folder(folder: Path) -> Iterator[str]:
    """Serve ``folder`` on 127.0.0.1 (range requests too); yields its base URL."""
    with reserved_port() as port:
        server = ThreadingHTTPServer(
            ("127.0.0.1", port), partial(_RangeHandler, directory=str(folder))
        )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
        _forget_filesystems()
