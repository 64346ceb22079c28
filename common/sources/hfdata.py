"""Hugging Face datasets and other tables with an image column: Parquet and Arrow.

A source here is:

- a ``save_to_disk`` folder: a ``Dataset`` (``state.json`` naming its Arrow files) or a
  ``DatasetDict`` (``dataset_dict.json`` naming its splits, each such a folder; a row's
  split is recorded, and the summary scores each split);
- one or more Parquet files (a file, or a brace pattern ``part-{0..9}.parquet``);
- Arrow stream files (``.arrow``, what ``save_to_disk`` writes).

Rows are read a record batch at a time (pyarrow), never the whole table. Which column
holds what is ``Columns`` (``--image-column`` and the rest). The image column may hold
the bytes (binary, or a ``datasets`` ``Image`` struct ``{bytes, path}``) or a path or
URL (a relative path is taken from the table's folder). A row whose image is in the
table refers to its cell (``common.sources.locations.parquet_row`` / ``arrow_row``), so nothing
is copied; ``copy_to`` keeps the bytes in the upload store instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from common.config import ImageSettings
from common.contracts import SourceRow
from common.errors import ImageError, InvalidInput
from common.images import content_hash, image_suffix, keep_bytes
from common.sources.fields import given_text, is_options
from common.sources.locations import arrow_row, is_url, join, name_of, parent, parquet_row, within
from common.sources.reading import arrow_stream, open_binary, read_located
from common.sources.webdataset import Columns, expand_braces

TABLE_SUFFIXES = (".parquet", ".arrow")
BATCH_ROWS = 1024  # rows decoded from a file at once


@dataclass(frozen=True)
class TableFile:
    location: str  # path or URL
    kind: str  # "parquet" | "arrow"
    split: str | None = None  # a DatasetDict's split


def is_saved_dataset(files: dict[str, bytes | None]) -> bool:
    """Whether a folder holding these top-level files is a ``save_to_disk`` folder."""
    return "dataset_dict.json" in files or "state.json" in files


def saved_dataset_files(folder: str, read: Any) -> list[TableFile]:
    """The Arrow files of a ``save_to_disk`` folder, in order (``read(path)`` -> bytes or
    None: the folder may be remote)."""
    splits = read(join(folder, "dataset_dict.json"))
    if splits is not None:
        names = _json(splits, folder, "dataset_dict.json").get("splits")
        if not isinstance(names, list) or not all(_plain_name(n) for n in names):
            raise InvalidInput(f"{folder}/dataset_dict.json names no splits, or one outside it")
        return [
            TableFile(file.location, "arrow", split)
            for split in names
            for file in saved_dataset_files(join(folder, split), read)
        ]
    state = read(join(folder, "state.json"))
    if state is None:
        raise InvalidInput(f"{folder} is not a save_to_disk folder (no state.json)")
    files = _json(state, folder, "state.json").get("_data_files")
    if not isinstance(files, list) or not files:
        raise InvalidInput(f"{folder}/state.json names no data files")
    names = [entry.get("filename") for entry in files if isinstance(entry, dict)]
    if not all(_plain_name(name) for name in names):
        raise InvalidInput(f"{folder}/state.json names a data file outside the folder")
    return [TableFile(join(folder, name), "arrow") for name in names]


def _plain_name(name: Any) -> bool:
    """A file or folder name of this folder: no path, not ``.`` or ``..``."""
    return isinstance(name, str) and name not in ("", ".", "..") and not {"/", "\\"} & set(name)


def _json(data: bytes, folder: str, name: str) -> dict[str, Any]:
    try:
        loaded = json.loads(data)
    except (ValueError, RecursionError) as exc:  # (bad UTF-8, bad JSON, or nested too deep)
        raise InvalidInput(f"{folder}/{name} is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(loaded, dict):
        raise InvalidInput(f"{folder}/{name} is not a JSON object")
    return loaded


def table_files(source: str) -> list[TableFile]:
    """The files of a Parquet / Arrow source (a file or a brace pattern of them)."""
    names = expand_braces(source)
    if not is_url(source):
        names = [str(Path(name).resolve()) for name in names]
    return [TableFile(name, "arrow" if name.endswith(".arrow") else "parquet") for name in names]


def count_rows(files: list[TableFile]) -> int | None:
    """The rows of the source, where the files say so up front (Parquet's footers)."""
    total = 0
    for file in files:
        if file.kind != "parquet":
            return None
        try:
            with open_binary(file.location) as handle:
                total += pq.ParquetFile(handle).metadata.num_rows
        except (ImageError, pa.ArrowInvalid, OSError):
            return None  # (reading it then fails its row, with the reason)
    return total


def table_rows(
    files: list[TableFile],
    question: str | None,
    options: list[str] | None,
    columns: Columns,
    *,
    limits: ImageSettings,
    copy_to: str | None = None,
) -> Iterator[SourceRow]:
    """The rows of the table files, in order, a record batch at a time."""
    position = 0
    for file in files:
        try:
            for cells in _batches(file, columns):
                for record in cells:
                    yield _row(position, file, record, question, options, columns, limits, copy_to)
                    position += 1
        except (ImageError, pa.ArrowException, OSError) as exc:  # (InvalidInput: a usage error)
            yield SourceRow(
                position,
                f"{file.location}#broken",
                question or "",
                error=("invalid_input", f"{name_of(file.location)}: cannot be read ({exc})"),
            )
            position += 1


@dataclass(frozen=True)
class _Cell:
    """One row of a file: where it is, and its fields."""

    group: int  # Parquet row group (Arrow: 0)
    index: int  # row in the group (Arrow: row in the file)
    row: int  # row in the file
    image_column: str
    fields: dict[str, Any]


def _batches(file: TableFile, columns: Columns) -> Iterator[list[_Cell]]:
    if file.kind == "parquet":
        with open_binary(file.location) as handle:
            parquet = pq.ParquetFile(handle)
            schema = parquet.schema_arrow
            image_column = _image_column(schema, columns, file)
            wanted = _wanted(schema, columns, image_column)
            row = 0
            for group in range(parquet.num_row_groups):
                index = 0
                for batch in parquet.iter_batches(BATCH_ROWS, [group], wanted):
                    records = batch.to_pylist()
                    yield [
                        _Cell(group, index + i, row + i, image_column, record)
                        for i, record in enumerate(records)
                    ]
                    index += len(records)
                    row += len(records)
        return
    row = 0
    image_column = ""
    for batch in arrow_stream(file.location):
        if not image_column:
            image_column = _image_column(batch.schema, columns, file)
        wanted = _wanted(batch.schema, columns, image_column)
        records = batch.select(wanted).to_pylist()
        yield [_Cell(0, row + i, row + i, image_column, record) for i, record in enumerate(records)]
        row += len(records)


def _image_column(schema: pa.Schema, columns: Columns, file: TableFile) -> str:
    if columns.image is not None:
        if columns.image not in schema.names:
            raise InvalidInput(
                f"{name_of(file.location)} has no column {columns.image!r} "
                f"(--image-column; it has {', '.join(schema.names)})"
            )
        return columns.image
    if "image" in schema.names:
        return "image"
    for column in schema:
        if _holds_images(column.type):
            return column.name
    raise InvalidInput(
        f"{name_of(file.location)} has no image column (none named 'image', none of bytes "
        f"or of datasets' Image type); name it with --image-column ({', '.join(schema.names)})"
    )


def _holds_images(kind: pa.DataType) -> bool:
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return True
    return pa.types.is_struct(kind) and {"bytes", "path"} <= {f.name for f in kind}


def _wanted(schema: pa.Schema, columns: Columns, image_column: str) -> list[str]:
    names = [image_column, columns.question, columns.options, columns.answer, columns.id or "id"]
    return [name for name in dict.fromkeys(names) if name is not None and name in schema.names]


def _row(
    position: int,
    file: TableFile,
    cell: _Cell,
    question: str | None,
    options: list[str] | None,
    columns: Columns,
    limits: ImageSettings,
    copy_to: str | None,
) -> SourceRow:
    fields = cell.fields
    where = f"{name_of(file.location)} row {cell.row}"
    raw_id = fields.get(columns.id) if columns.id else fields.get("id")
    item_id = given_text(raw_id) or str(position)

    def broken(reason: str, asked: str = "", code: str = "invalid_input") -> SourceRow:
        error = (code, f"{where} (id {item_id}): {reason}")
        return SourceRow(position, item_id, asked, split=file.split, error=error)

    asked = fields.get(columns.question) or question
    if not isinstance(asked, str) or not asked.strip():
        return broken(f"no question (no {columns.question!r} value, no -q)")
    chosen = _options(fields.get(columns.options), options)
    if isinstance(chosen, bool):
        return broken("options must be a list of strings (or its JSON text)", asked)
    expected = given_text(fields.get(columns.answer))
    value = fields.get(cell.image_column)
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, bytes | bytearray):
        if len(value) > limits.max_bytes:
            reason = f"the image is {len(value)} bytes, above the limit of {limits.max_bytes}"
            return broken(reason, asked, "image_too_large")
        data = bytes(value)
        if copy_to is not None:
            locator, digest = keep_bytes(data, Path(copy_to), image_suffix(data))
        elif file.kind == "parquet":
            locator = parquet_row(file.location, cell.image_column, cell.group, cell.index)
            digest = content_hash(data)
        else:
            locator = arrow_row(file.location, cell.image_column, cell.index)
            digest = content_hash(data)
    elif isinstance(value, str) and value.strip():
        found = within(parent(file.location), value)
        if found is None:
            reason = (
                f"the image {value!r} is outside the table's folder: a corpus may name "
                "images inside itself only"
            )
            return broken(reason, asked, "image_missing")
        try:
            data = read_located(found, limits)
        except ImageError as exc:
            return broken(str(exc), asked, exc.code)
        locator, digest = found, content_hash(data)
        if copy_to is not None:
            locator, digest = keep_bytes(data, Path(copy_to), image_suffix(data))
    else:
        return broken(f"no image in the {cell.image_column!r} column", asked, "image_missing")
    return SourceRow(
        position,
        item_id,
        asked,
        chosen or None,
        locator,
        expected=expected,
        split=file.split,
        image_hash=digest,
    )


def _options(value: Any, default: list[str] | None) -> list[str] | bool | None:
    """A row's options: a list of strings, or its JSON text; False if neither."""
    if value is None:
        return default
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return False
    if is_options(value):
        return value
    return False
