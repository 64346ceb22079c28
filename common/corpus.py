"""Reading a corpus to annotate: a folder of images, or a JSONL / CSV manifest.

Every row becomes a ``SourceRow``. A row that cannot be read (bad JSON, no question, an
image that does not exist, options that are not a list) keeps its place with an
``error`` naming the file and line, so it can be recorded as a failed job while the rest
of the corpus is annotated. Only a SOURCE that cannot be read at all raises.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from common.benchmarks import detect, read_benchmark
from common.contracts import SourceRow
from common.errors import InvalidInput

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
MANIFEST_EXTENSIONS = (".jsonl", ".csv")


def read_source(
    source: Path,
    question: str | None = None,
    options: list[str] | None = None,
    *,
    image_store: Path | None = None,
    for_thyme: bool = False,
) -> list[SourceRow]:
    """The rows of ``source``. ``question`` / ``options`` apply to a folder's images and
    fill in manifest rows that have none. A benchmark in its published layout (V* folder,
    HR-Bench TSV, POPE parquet: ``common.benchmarks``) brings its own questions; images
    inside its files are kept under ``image_store`` (``for_thyme``: as the evaluation of
    Thyme writes them)."""
    if not source.exists():
        raise InvalidInput(f"SOURCE not found: {source}")

    if detect(source) is not None:
        store = image_store or Path(".speceyes-images")
        return read_benchmark(source, store, for_thyme=for_thyme)
    if source.is_dir():
        return _read_folder(source, question, options)
    suffix = source.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(source, question, options)
    if suffix == ".csv":
        return _read_csv(source, question, options)
    raise InvalidInput(
        f"SOURCE must be a folder of images, a manifest ({', '.join(MANIFEST_EXTENSIONS)}) or "
        f"a benchmark (a V* folder, an HR-Bench .tsv, a POPE .parquet); got {source}"
    )


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


def _read_jsonl(path: Path, question: str | None, options: list[str] | None) -> list[SourceRow]:
    rows: list[SourceRow] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path.name} line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                rows.append(_broken(len(rows), where, f"not valid JSON ({exc.msg})"))
                continue
            rows.append(_row(len(rows), record, path.parent, where, question, options))
    if not rows:
        raise InvalidInput(f"the manifest {path} has no rows")
    return rows


def _read_csv(path: Path, question: str | None, options: list[str] | None) -> list[SourceRow]:
    rows: list[SourceRow] = []
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or "image" not in reader.fieldnames:
            raise InvalidInput(f"the manifest {path} needs a header row with an 'image' column")
        for record in reader:
            where = f"{path.name} line {reader.line_num}"
            raw_options = (record.get("options") or "").strip()
            if raw_options:
                try:
                    record["options"] = json.loads(raw_options)
                except json.JSONDecodeError:
                    reason = 'options must be a JSON list like ["a", "b"]'
                    rows.append(_broken(len(rows), where, reason, record.get("id") or None))
                    continue
            else:
                record.pop("options", None)
            rows.append(_row(len(rows), dict(record), path.parent, where, question, options))
    if not rows:
        raise InvalidInput(f"the manifest {path} has no rows")
    return rows


def _row(
    position: int,
    record: Any,
    base: Path,
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
    if options is not None and (
        not isinstance(options, list) or not all(isinstance(o, str) for o in options)
    ):
        return _broken(position, where, "options must be a list of strings", item_id, question)
    image = record.get("image")
    if not isinstance(image, str) or not image.strip():
        return _broken(position, where, "missing image", item_id, question)
    image_path = (base / image).resolve()
    expected = record.get("answer")  # (kept on a failed row too: it is scored, as wrong)
    expected = str(expected) if expected not in (None, "") else None
    if not image_path.is_file():
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
