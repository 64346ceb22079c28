"""Reading a corpus to annotate, wherever it lies, as a stream of rows.

A SOURCE is a folder of images, a JSONL / CSV manifest, a benchmark in its published
layout (``common.sources.benchmarks``), WebDataset shards (``common.sources.webdataset``),
or a Hugging Face dataset / Parquet / Arrow table (``common.sources.hfdata``); a path, or a URL (``s3://``,
``gs://``, ``https://``) read through fsspec. Only the operator's command line names a
SOURCE: the HTTP API reads no URLs.

Every row becomes a ``SourceRow``, read as it is needed (``Corpus.rows`` is an iterator:
a corpus of millions of rows is never held whole). A row that cannot be read (bad JSON,
no question, an image that does not exist, options that are not a list) keeps its place
with an ``error`` naming the file and line (or shard and key), so it can be recorded as a
failed job while the rest of the corpus is annotated. Only a SOURCE that cannot be read
at all raises.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec

from common.config import Settings
from common.contracts import SourceRow
from common.errors import ImageError, InvalidInput
from common.sources.benchmarks import detect, read_benchmark
from common.sources.fields import given_text, is_options
from common.sources.hfdata import (
    TABLE_SUFFIXES,
    TableFile,
    count_rows,
    saved_dataset_files,
    table_files,
    table_rows,
)
from common.sources.locations import is_url, join, name_of, within
from common.sources.reading import exists, open_binary
from common.sources.webdataset import Columns, is_shards, shard_rows, shards_of

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
MANIFEST_EXTENSIONS = (".jsonl", ".csv")
KINDS = (
    "a folder of images, a manifest (.jsonl, .csv), WebDataset shards (.tar, or a brace "
    "pattern such as shards/{00000..00127}.tar), a Hugging Face save_to_disk folder, "
    "Parquet or Arrow files, or a benchmark (a V* folder, an HR-Bench .tsv, a POPE "
    ".parquet)"
)


@dataclass
class Corpus:
    """A SOURCE, opened: its rows as a stream, and what is known of it up front."""

    location: str  # the resolved path or the URL (names the batch with its settings)
    kind: str  # folder | manifest | benchmark | webdataset | dataset | table
    rows: Iterator[SourceRow]
    total: int | None = None  # rows, where known before reading them
    shards: list[str] = field(default_factory=list)  # a WebDataset source's, in order


def read_source(
    source: str | Path,
    question: str | None = None,
    options: list[str] | None = None,
    *,
    image_store: Path | None = None,
    for_thyme: bool = False,
) -> list[SourceRow]:
    """Every row of a (small) ``source`` at once, images of benchmark files kept under
    ``image_store``: ``open_source`` for the tests and the lab."""
    settings = Settings()
    api = settings.api.model_copy(update={"upload_dir": image_store or Path(".speceyes-images")})
    settings = settings.model_copy(update={"api": api})
    return list(open_source(source, question, options, settings=settings, for_thyme=for_thyme).rows)


def open_source(
    source: str | Path,
    question: str | None = None,
    options: list[str] | None = None,
    *,
    settings: Settings | None = None,
    columns: Columns | None = None,
    for_thyme: bool = False,
) -> Corpus:
    """``source`` opened as a ``Corpus``. ``question`` / ``options`` apply to a folder's
    images and fill in rows that have none. A benchmark in its published layout brings
    its own questions; images inside its files are kept in the upload store
    (``for_thyme``: as the evaluation of Thyme writes them). ``columns``: which field of
    a table row or a sample's JSON holds what."""
    settings = settings or Settings()
    text = str(source)
    copy_to = str(settings.api.upload_dir) if settings.sources.copy_images else None
    asked = _Asked(question, options, columns or Columns(), settings, copy_to)
    limits = settings.images
    if "{" in text and not (is_shards(text) or text.lower().endswith(TABLE_SUFFIXES)):
        raise InvalidInput(f"a brace pattern names .tar shards or table files; got {text}")
    if is_shards(text):
        shards = shards_of(text)
        # (a missing shard among many fails its row; the first one missing: a typo)
        if not exists(shards[0]):
            raise InvalidInput(f"SOURCE shard not found: {shards[0]}")
        rows = shard_rows(
            shards, question, options, asked.columns, max_bytes=limits.max_bytes, copy_to=copy_to
        )
        return Corpus(_where(text), "webdataset", _first_checked(rows), shards=shards)
    if is_url(text):
        return _read_remote(text, asked)
    path = Path(text)
    if not path.exists() and "{" not in text:
        raise InvalidInput(f"SOURCE not found: {path}")
    if text.lower().endswith(TABLE_SUFFIXES) and ("{" in text or detect(path) is None):
        return _table(text, asked)
    if detect(path) is not None:
        rows_read = read_benchmark(path, settings.api.upload_dir, for_thyme=for_thyme)
        return Corpus(_where(text), "benchmark", iter(rows_read), len(rows_read))
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            files = saved_dataset_files(str(path.resolve()), _read_or_none)
            rows = _first_checked(asked.table(files))
            return Corpus(_where(text), "dataset", rows, count_rows(files))
        listed = _read_folder(path, question, options)
        return Corpus(_where(text), "folder", iter(listed), len(listed))
    suffix = path.suffix.lower()
    if suffix in IMAGE_EXTENSIONS:
        raise InvalidInput(
            f"SOURCE is one image ({path.name}): `speceyes ask {path} -q QUESTION` answers "
            "one; annotate takes a folder of them, a manifest, shards or a table"
        )
    if suffix in MANIFEST_EXTENSIONS:
        listed = list(_manifest_rows(str(path.resolve()), question, options))
        return Corpus(_where(text), "manifest", iter(listed), len(listed))
    raise InvalidInput(f"SOURCE must be {KINDS}; got {path}")


def _where(text: str) -> str:
    """A SOURCE's canonical name: a URL as given, a path resolved (a pattern's folder)."""
    if is_url(text):
        return text
    folder, _, name = text.rpartition("/")
    if "{" in text:
        return str(Path(folder or ".").resolve() / name)
    return str(Path(text).resolve())


def _first_checked(rows: Iterator[SourceRow]) -> Iterator[SourceRow]:
    """``rows``, whose first one is read now: a SOURCE that cannot be read at all (a
    column that is not there) raises here, before a batch is made."""
    rows = iter(rows)
    try:
        first = next(rows)
    except StopIteration:
        raise InvalidInput("the SOURCE has no rows") from None

    def stream() -> Iterator[SourceRow]:
        yield first
        yield from rows

    return stream()


@dataclass(frozen=True)
class _Asked:
    """What applies to every row a reader makes: the default question and options,
    which column holds what, the limits, and where images are copied (if they are)."""

    question: str | None
    options: list[str] | None
    columns: Columns
    settings: Settings
    copy_to: str | None

    def table(self, files: list[TableFile]) -> Iterator[SourceRow]:
        return table_rows(
            files,
            self.question,
            self.options,
            self.columns,
            limits=self.settings.images,
            copy_to=self.copy_to,
        )


def _table(text: str, asked: _Asked) -> Corpus:
    files = table_files(text)
    for file in files:
        if not exists(file.location):
            raise InvalidInput(f"SOURCE file not found: {file.location}")
    return Corpus(_where(text), "table", _first_checked(asked.table(files)), count_rows(files))


def _read_or_none(location: str) -> bytes | None:
    try:
        with open_binary(location) as handle:
            return handle.read()
    except ImageError as exc:
        if exc.code == "image_missing":
            return None
        raise InvalidInput(str(exc)) from None


def _read_remote(url: str, asked: _Asked) -> Corpus:
    """A folder, a manifest or a table behind a URL."""
    lowered = url.lower().rstrip("/")
    if lowered.endswith(TABLE_SUFFIXES):
        return _table(url, asked)
    if lowered.endswith(MANIFEST_EXTENSIONS):
        if not exists(url):
            raise InvalidInput(f"SOURCE not found: {url}")
        return Corpus(url, "manifest", _manifest_rows(url, asked.question, asked.options))
    folder = url.rstrip("/")
    if exists(join(folder, "dataset_dict.json")) or exists(join(folder, "state.json")):
        files = saved_dataset_files(folder, _read_or_none)
        return Corpus(url, "dataset", _first_checked(asked.table(files)), count_rows(files))
    images = _remote_images(folder)
    if not asked.question:
        raise InvalidInput(f"annotating a folder needs --question (SOURCE is the folder {url})")
    listed = [
        SourceRow(i, image[len(folder) + 1 :], asked.question, asked.options, image)
        for i, image in enumerate(images)
    ]
    return Corpus(url, "folder", iter(listed), len(listed))


def _remote_images(folder: str) -> list[str]:
    """The image URLs below a remote folder (or prefix), sorted."""

    try:
        filesystem, root = fsspec.core.url_to_fs(folder)
        found = filesystem.find(root)
    except FileNotFoundError:
        raise InvalidInput(f"SOURCE not found: {folder}") from None
    except Exception as exc:  # each store's client has its own errors
        raise InvalidInput(f"cannot list {folder}: {exc}") from None
    images = sorted(
        filesystem.unstrip_protocol(name)
        for name in found
        if name.lower().endswith(IMAGE_EXTENSIONS)
    )
    if not images:
        raise InvalidInput(
            f"no images in {folder} (looked recursively for {', '.join(IMAGE_EXTENSIONS)})"
        )
    prefix = folder if is_url(folder) else filesystem.unstrip_protocol(root)
    return [image if image.startswith(prefix) else join(folder, image) for image in images]


def _read_folder(folder: Path, question: str | None, options: list[str] | None) -> list[SourceRow]:
    if not question:
        raise InvalidInput(f"annotating a folder needs --question (SOURCE is the folder {folder})")
    images = sorted(
        path
        for path in folder.rglob("*")
        if path.suffix.lower() in IMAGE_EXTENSIONS and path.is_file()
    )
    if not images:
        raise InvalidInput(
            f"no images in {folder} (looked recursively for {', '.join(IMAGE_EXTENSIONS)})"
        )
    return [
        SourceRow(i, str(path.relative_to(folder)), question, options, str(path.resolve()))
        for i, path in enumerate(images)
    ]


def _manifest_rows(
    location: str, question: str | None, options: list[str] | None
) -> Iterator[SourceRow]:
    """A JSONL or CSV manifest's rows; image paths are relative to the manifest."""
    base = location.rsplit("/", 1)[0] if is_url(location) else str(Path(location).parent)
    name = name_of(location)
    reader = _jsonl_rows if location.lower().endswith(".jsonl") else _csv_rows
    count = 0
    with open_binary(location) as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as text:
        for row in reader(text, name, base, question, options):
            count += 1
            yield row
    if not count:
        raise InvalidInput(f"the manifest {location} has no rows")


def _jsonl_rows(
    lines: Iterable[str], name: str, base: str, question: str | None, options: list[str] | None
) -> Iterator[SourceRow]:
    position = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{name} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            yield _broken(position, where, f"not valid JSON ({exc.msg})")
        except RecursionError:
            yield _broken(position, where, "not valid JSON (nested too deep)")
        else:
            yield _row(position, record, base, where, question, options)
        position += 1


def _csv_rows(
    handle: io.TextIOWrapper,
    name: str,
    base: str,
    question: str | None,
    options: list[str] | None,
) -> Iterator[SourceRow]:
    reader = csv.DictReader(handle)
    if not reader.fieldnames or "image" not in reader.fieldnames:
        raise InvalidInput(f"the manifest {name} needs a header row with an 'image' column")
    position = 0
    for record in reader:
        where = f"{name} line {reader.line_num}"
        raw_options = (record.get("options") or "").strip()
        if raw_options:
            try:
                record["options"] = json.loads(raw_options)
            except (json.JSONDecodeError, RecursionError):
                reason = 'options must be a JSON list like ["a", "b"]'
                yield _broken(position, where, reason, record.get("id") or None)
                position += 1
                continue
        else:
            record.pop("options", None)
        yield _row(position, dict(record), base, where, question, options)
        position += 1


def _row(
    position: int,
    record: Any,
    base: str,
    where: str,
    default_question: str | None,
    default_options: list[str] | None,
) -> SourceRow:
    if not isinstance(record, dict):
        return _broken(position, where, "a row must be a JSON object")
    item_id = str(record.get("id") or record.get("image") or where)
    question = record.get("question") or default_question
    if not isinstance(question, str) or not question.strip():
        return _broken(position, where, "missing question", item_id)
    options = record.get("options", default_options)
    if options is not None and not is_options(options):
        return _broken(position, where, "options must be a list of strings", item_id, question)
    image = record.get("image")
    if not isinstance(image, str) or not image.strip():
        return _broken(position, where, "missing image", item_id, question)
    if is_url(base):  # a remote manifest names objects under its own prefix only
        found = within(base, image)
        if found is None:
            reason = f"the image {image!r} is outside the manifest's prefix"
            return _broken(position, where, reason, item_id, question)
        image_path = found
    elif "://" in image:
        reason = "a manifest on this machine names files, not URLs"
        return _broken(position, where, reason, item_id, question)
    else:  # (the operator's own file: any path on this machine, as always)
        image_path = join(base, image)
    expected = given_text(record.get("answer"))  # (kept on a failed row too: scored wrong)
    if not is_url(image_path) and not Path(image_path).is_file():
        return SourceRow(
            position,
            item_id,
            question,
            options or None,
            str(image_path),
            error=("image_missing", f"{where}: image not found: {image_path}"),
            expected=expected,
        )
    return SourceRow(position, item_id, question, options or None, str(image_path), None, expected)


def _broken(
    position: int, where: str, reason: str, item_id: str | None = None, question: str = ""
) -> SourceRow:
    return SourceRow(
        position, item_id or where, question, error=("invalid_input", f"{where}: {reason}")
    )
