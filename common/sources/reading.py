"""Reading an image from where its locator says it lives (``common.sources.locations``).

s the bytes, refusing more than ``images.max_bytes``; whoever
decodes them checks them against the digest first (``common.pipeline.funnel.prepare_query``), so
content that changed under a locator fails its job with ``image_changed``. Nothing here
decodes an image. Remote objects go through fsspec, with each store's own credentials
(``AWS_*`` for S3, ``GOOGLE_APPLICATION_CREDENTIALS`` for GCS); only the operator's
command line names them (the HTTP API refuses anything but its own files).

Reading a row of a Parquet or Arrow file reads its row group (or record batch): the last
few are kept (``_GROUPS``), since a batch of jobs from one file names neighbouring rows.
Both caches forget within a minute, so content replaced under a locator is read anew
(and its digest then fails the job).
"""

from __future__ import annotations

import io
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import IO, Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from common.config import ImageSettings
from common.errors import ImageError, InvalidInput, SourceUnavailable
from common.images import image_pixels, read_image_bytes
from common.sources.locations import Reference, describe_ref, is_local_file, is_url, parse_reference

_GROUP_CACHE_BYTES = 256 * 1024 * 1024  # row groups / record batches kept per process
_RECENT_BYTES = 64 * 1024 * 1024  # images read from elsewhere, kept per process
_GROUP_CACHE_S = 60.0  # and for this long at most: a file replaced since is read anew


def read_located(locator: str, limits: ImageSettings) -> bytes:
    """The bytes of the image ``locator`` names (``ImageError`` with the reason: missing,
    unreachable, over ``limits.max_bytes``, not an image cell). What is not a local file
    is kept a while (``_RECENT``): a worker reads an image's header to plan a batch, then
    the image."""
    if is_local_file(locator):
        return read_image_bytes(locator, limits)
    data: bytes = _RECENT.get(
        (locator, "bytes", limits.max_bytes, ""), partial(_fetch, locator, limits)
    )
    return data


def _fetch(locator: str, limits: ImageSettings) -> bytes:
    if is_url(locator):
        return _read_object(locator, limits)
    ref = parse_reference(locator)
    reader = {"tar": _read_tar_member, "parquet": _read_parquet_cell, "arrow": _read_arrow}
    return reader[ref.kind](ref, limits)


def located_pixels(locator: str, limits: ImageSettings) -> int:
    """The pixel count an image declares (its header); 0 if it cannot be read (decoding
    it later gives the reason)."""
    if is_local_file(locator):
        return image_pixels(locator)
    try:
        return image_pixels(io.BytesIO(read_located(locator, limits)))
    except (ImageError, SourceUnavailable):  # (loading it then says why, and retries)
        return 0


@contextmanager
def open_binary(location: str, **options: Any) -> Iterator[IO[bytes]]:
    """A file or remote object, opened for reading; a missing one is ``ImageError``
    ``image_missing``, an unreadable one ``ImageError`` with its reason, and a store that
    does not answer (a lost connection, a timeout, a 5xx or 429) ``SourceUnavailable``:
    a worker puts the job back to wait, as for a model server that is down. (fsspec's
    HTTP client reports a server that refuses connections as a missing file.)"""
    try:
        if is_url(location):
            filesystem, path = fsspec.core.url_to_fs(location)
            with filesystem.open(path, "rb", **options) as handle:
                yield handle
        else:
            with open(location, "rb") as handle:
                yield handle
    except FileNotFoundError as exc:
        cause = exc.__cause__  # (fsspec's HTTP client: any failure, the answer kept here)
        if is_url(location) and cause is not None and _transient(cause):
            raise SourceUnavailable(f"{location} cannot be reached now: {_reason(cause)}") from None
        raise ImageError(f"not found: {location}", code="image_missing") from None
    except ImageError:
        raise
    except ImportError as exc:  # (gs:// without gcsfs)
        raise ImageError(f"cannot read {location}: {exc}") from None
    except Exception as exc:  # a store's client raises its own kinds (botocore, aiohttp)
        if is_url(location) and _transient(exc):
            raise SourceUnavailable(f"{location} cannot be reached now: {_reason(exc)}") from None
        if isinstance(exc, OSError | ValueError) or _from_store_client(exc):
            raise ImageError(f"cannot read {location}: {_reason(exc)}") from None
        raise


def _from_store_client(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("botocore", "aiohttp", "aiobotocore")


def _transient(exc: BaseException) -> bool:
    """Whether a remote read failed for a reason that may pass: the connection or a
    timeout, or the store's answer was 5xx or 429 (a 4xx other than 429 is for good)."""
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    if not _from_store_client(exc):
        return False
    status = getattr(exc, "status", None)  # aiohttp's answers
    if status is None:  # botocore's: its answer's status, or none (no connection)
        response = getattr(exc, "response", None) or {}
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status is None or status >= 500 or status == 429


def exists(location: str) -> bool:
    """Whether a file or remote object is there (``InvalidInput`` if the store cannot
    be asked)."""
    if not is_url(location):
        return Path(location).is_file()
    try:
        filesystem, path = fsspec.core.url_to_fs(location)
        return bool(filesystem.exists(path))
    except Exception as exc:  # each store's client has its own errors
        raise InvalidInput(f"cannot reach {location}: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _read_object(url: str, limits: ImageSettings) -> bytes:
    with open_binary(url) as handle:
        return _read_at_most(handle, limits, url)


def _read_at_most(handle: IO[bytes], limits: ImageSettings, where: str) -> bytes:
    data = handle.read(limits.max_bytes + 1)
    if len(data) > limits.max_bytes:
        raise ImageError(
            f"{where} is over the limit of {limits.max_bytes} bytes", code="image_too_large"
        )
    return data


def _read_tar_member(ref: Reference, limits: ImageSettings) -> bytes:
    offset, size = ref.number("offset"), ref.number("size")
    if size > limits.max_bytes:
        raise ImageError(
            f"{describe_ref(ref)} is {size} bytes, above the limit of {limits.max_bytes}",
            code="image_too_large",
        )
    # one range of the shard: a remote store is asked for those bytes only
    with open_binary(ref.container, block_size=max(size, 1), cache_type="none") as handle:
        try:
            handle.seek(offset)
            data = handle.read(size)
        except (OSError, ValueError) as exc:
            raise ImageError(f"cannot read {describe_ref(ref)}: {_reason(exc)}") from None
    if len(data) != size:
        raise ImageError(f"{describe_ref(ref)}: the shard ends before the member does")
    return data


def _read_parquet_cell(ref: Reference, limits: ImageSettings) -> bytes:
    group, index, column = ref.number("group"), ref.number("index"), _column(ref)

    def load() -> Any:
        with open_binary(ref.container) as handle:
            parquet = pq.ParquetFile(handle)
            if group >= parquet.num_row_groups:
                raise ImageError(f"{describe_ref(ref)}: the file has fewer row groups")
            return parquet.read_row_group(group, columns=[column]).column(0)

    cells = _GROUPS.get((ref.container, "parquet", group, column), load)
    return _cell_bytes(cells, index, ref, limits)


def _read_arrow(ref: Reference, limits: ImageSettings) -> bytes:
    row, column = ref.number("row"), _column(ref)
    batch_rows = _GROUPS.get((ref.container, "arrow-batches", 0, ""), lambda: _arrow_batches(ref))
    start = 0
    for number, rows in enumerate(batch_rows):
        if row < start + rows:
            key = (ref.container, "arrow", number, column)
            cells = _GROUPS.get(key, partial(_arrow_batch, ref, number, column))
            return _cell_bytes(cells, row - start, ref, limits)
        start += rows
    raise ImageError(f"{describe_ref(ref)}: the file has fewer rows")


def _arrow_batches(ref: Reference) -> list[int]:
    """The row count of each record batch of an Arrow stream file."""
    return [batch.num_rows for batch in arrow_stream(ref.container)]


def _arrow_batch(ref: Reference, number: int, column: str) -> Any:
    for index, batch in enumerate(arrow_stream(ref.container)):
        if index == number:
            if column not in batch.schema.names:
                raise ImageError(f"{describe_ref(ref)}: no column {column!r}")
            return batch.column(column)
    raise ImageError(f"{describe_ref(ref)}: the file has fewer record batches")


def arrow_stream(location: str) -> Iterator[Any]:
    """The record batches of an Arrow stream file (what ``save_to_disk`` writes). A local
    file is read, not memory-mapped: a file rewritten while a mapping of it is used
    kills the process (SIGBUS), where a read only sees other bytes (and the digest then
    fails the job)."""
    if is_url(location):
        with open_binary(location) as handle:
            yield from pa.ipc.open_stream(handle)
        return
    try:
        with pa.OSFile(location) as file:
            yield from pa.ipc.open_stream(file)
    except FileNotFoundError:
        raise ImageError(f"not found: {location}", code="image_missing") from None
    except (OSError, pa.ArrowInvalid) as exc:
        raise ImageError(f"cannot read {location}: {_reason(exc)}") from None


def _column(ref: Reference) -> str:
    column = ref.fields.get("column")
    if not isinstance(column, str) or not column:
        raise ImageError(f"the image's locator names no column: {ref.container}")
    return column


def _cell_bytes(cells: Any, index: int, ref: Reference, limits: ImageSettings) -> bytes:
    """The image bytes of one cell: binary, or a ``datasets`` Image struct's ``bytes``."""
    if index >= len(cells):
        raise ImageError(f"{describe_ref(ref)}: the row is not in the file")
    value = cells[index].as_py()
    if isinstance(value, dict):
        value = value.get("bytes")
    if not isinstance(value, bytes | bytearray):
        raise ImageError(f"{describe_ref(ref)}: the cell holds no image bytes")
    if len(value) > limits.max_bytes:
        raise ImageError(
            f"{describe_ref(ref)} is {len(value)} bytes, above the limit of {limits.max_bytes}",
            code="image_too_large",
        )
    return bytes(value)


class _RecentGroups:
    """The row groups / record batches read in the last ``max_age_s``, up to a number of
    bytes in all (the oldest go first)."""

    def __init__(self, limit_bytes: int, max_age_s: float) -> None:
        self.limit = limit_bytes
        self.max_age_s = max_age_s
        self._held: OrderedDict[tuple[str, str, int, str], tuple[Any, int, float]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, int, str], load: Callable[[], Any]) -> Any:
        now = time.monotonic()
        with self._lock:
            held = self._held.get(key)
            if held is not None and now - held[2] < self.max_age_s:
                self._held.move_to_end(key)
                return held[0]
        value = load()  # (two threads may both load one group: the second one's is kept)
        size = len(value) if isinstance(value, bytes) else int(getattr(value, "nbytes", 0))
        with self._lock:
            self._held[key] = (value, size, now)
            self._held.move_to_end(key)
            while len(self._held) > 1 and sum(h[1] for h in self._held.values()) > self.limit:
                self._held.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._held.clear()


_GROUPS = _RecentGroups(_GROUP_CACHE_BYTES, _GROUP_CACHE_S)
_RECENT = _RecentGroups(_RECENT_BYTES, _GROUP_CACHE_S)
