"""Where a job's image lives: locators (a path, a URL, a place in a container).

A corpus is not copied: each job names its image where it lies, by a *locator* kept in
``jobs.image_path`` beside the image's digest (``jobs.image_hash``):

- an absolute file path: ``/data/cats/001.jpg``;
- the URL of an object: ``s3://bucket/cats/001.jpg``, ``gs://...``, ``https://...``;
- a place inside a container, as a JSON object (the text starts with ``{``):

  - a tar member (a WebDataset sample's image): ``{"tar": SHARD, "member": NAME,
    "offset": BYTE, "size": BYTES}``, read as one range of the shard;
  - a Parquet row: ``{"parquet": FILE, "column": COLUMN, "group": ROW_GROUP,
    "index": ROW_IN_GROUP}``;
  - an Arrow row (a ``datasets`` ``save_to_disk`` file): ``{"arrow": FILE, "column":
    COLUMN, "row": ROW}``.

  SHARD and FILE are a path or a URL.

Reading the bytes a locator names: ``common.sources.reading``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import ImageError

# The stores a locator may name (fsspec protocols); anything else is refused.
REMOTE_SCHEMES = ("s3", "s3a", "gs", "gcs", "http", "https")
_CONTAINERS = ("tar", "parquet", "arrow")


def is_url(text: str) -> bool:
    """Whether ``text`` is the URL of a remote store we read (``s3://``, ``https://``...)."""
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() in REMOTE_SCHEMES


def is_reference(text: str) -> bool:
    """Whether ``text`` is a place inside a container (a JSON locator)."""
    return text.startswith("{")


def is_local_file(locator: str) -> bool:
    """Whether ``locator`` names a file of this machine (the kind every part reads)."""
    return not is_url(locator) and not is_reference(locator)


def join(base: str, relative: str) -> str:
    """``relative`` under the folder or URL prefix ``base`` (URLs keep their scheme)."""
    if is_url(base):
        return base.rstrip("/") + "/" + relative.lstrip("/")
    return str((Path(base) / relative).resolve())


def within(base: str, value: str) -> str | None:
    """Where ``value`` (a path or URL a corpus row names for its image) lies, if that is
    inside ``base`` (the folder or URL prefix of the corpus file); None if it would
    leave it (an absolute path elsewhere, ``..``, another host or scheme, a URL in a
    local corpus). A corpus's content may point only inside the corpus: it never makes
    the service read other files or fetch other addresses."""
    if not is_url(base):
        if "://" in value:
            return None
        root = Path(base).resolve()
        found = (root / value).resolve()  # (links followed: one out of the folder is out)
        return str(found) if found.is_relative_to(root) else None
    prefix = base.rstrip("/") + "/"
    if is_url(value):
        candidate = value
    elif "://" in value or value.startswith("/"):
        return None
    else:
        candidate = prefix + value
    parts = candidate.split("://", 1)[1].split("/")
    if any(part in ("..", ".") for part in parts) or not candidate.startswith(prefix):
        return None
    return candidate


def parent(location: str) -> str:
    """The folder (or URL prefix) that holds ``location``."""
    if is_url(location):
        return location.rsplit("/", 1)[0]
    return str(Path(location).resolve().parent)


def name_of(location: str) -> str:
    """The last part of a path or URL (``shards/00001.tar`` -> ``00001.tar``)."""
    return location.rstrip("/").rsplit("/", 1)[-1]


# ----------------------------------------------------------------------------- locators


def tar_member(shard: str, member: str, offset: int, size: int) -> str:
    return _dump({"tar": shard, "member": member, "offset": offset, "size": size})


def parquet_row(path: str, column: str, group: int, index: int) -> str:
    return _dump({"parquet": path, "column": column, "group": group, "index": index})


def arrow_row(path: str, column: str, row: int) -> str:
    return _dump({"arrow": path, "column": column, "row": row})


def _dump(fields: dict[str, Any]) -> str:
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class Reference:
    """A JSON locator, parsed: ``kind`` (tar, parquet, arrow), the container and where."""

    kind: str
    container: str
    fields: dict[str, Any]

    def number(self, name: str) -> int:
        value = self.fields.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ImageError(f"the image's locator has no valid {name!r}: {self.container}")
        return value


def parse_reference(locator: str) -> Reference:
    """A JSON locator's parts; ``ImageError`` if it is not one we wrote."""
    try:
        fields: dict[str, Any] = json.loads(locator)  # (an object: the text starts with "{")
    except json.JSONDecodeError:
        raise ImageError("the image's locator is not valid JSON") from None
    kinds = [kind for kind in _CONTAINERS if isinstance(fields.get(kind), str)]
    if len(kinds) != 1:
        raise ImageError(f"the image's locator names no container ({', '.join(_CONTAINERS)})")
    container = fields[kinds[0]]
    if not is_url(container) and not Path(container).is_absolute():
        raise ImageError(f"the image's container is not an absolute path or a URL: {container}")
    return Reference(kinds[0], container, fields)


def describe(locator: str) -> str:
    """``locator`` as a person reads it (in failure reasons and on the review pages)."""
    if not is_reference(locator):
        return locator
    try:
        return describe_ref(parse_reference(locator))
    except ImageError:
        return locator


def describe_ref(ref: Reference) -> str:
    """A parsed locator as a person reads it."""
    if ref.kind == "tar":
        return f"{ref.container} member {ref.fields.get('member')}"
    if ref.kind == "parquet":
        where = f"row group {ref.fields.get('group')} row {ref.fields.get('index')}"
        return f"{ref.container} {where} ({ref.fields.get('column')})"
    return f"{ref.container} row {ref.fields.get('row')} ({ref.fields.get('column')})"
