"""WebDataset shards: tar files of samples, read as streams and written with labels.

A shard is a tar file whose members are grouped into samples by key: ``dir/000123.jpg``
and ``dir/000123.json`` are the sample ``dir/000123`` (the key is the member's path up to
the first dot of its file name, the rest is the extension, as WebDataset splits them).
Consecutive members with one key make one sample. A sample's image is its ``jpg``,
``jpeg``, ``png`` or ``webp`` member; its question, options and expected answer come
from its ``json`` member (fields named as ``Columns`` says), else from ``-q``, else from
its ``txt`` member (img2dataset's caption: a ``-q`` is asked instead). The key is the
row id.

Shards are read as streams, member by member, never extracted: a job refers to its
image by the shard, the member's offset and its size (``common.sources.locations.tar_member``),
so a worker reads those bytes alone. A compressed shard (``.tar.gz``) has no offsets to
read by range: it is read only when its images are copied into the upload store
(``sources.copy_images``).

A sample that cannot be used (no image, bad JSON, no question) is a failed row naming
the shard and the key; a shard that cannot be opened, or ends in the middle, is a failed
row naming the shard (and the last key read), and the next shard is read.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from common.contracts import SourceRow
from common.errors import ImageError, InvalidInput
from common.images import content_hash, keep_bytes
from common.sources.fields import given_text, is_options
from common.sources.locations import is_url, name_of, tar_member
from common.sources.reading import open_binary

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")
MAX_SHARDS = 1_000_000


@dataclass(frozen=True)
class Columns:
    """Which field (column, or sidecar key) holds each part of a row."""

    image: str | None = None  # None: the first image column (tables only)
    question: str = "question"
    options: str = "options"
    id: str | None = None  # None: the sample key / the row number
    answer: str = "answer"


def expand_braces(pattern: str) -> list[str]:
    """Every name a brace pattern stands for, in order: ``{00000..00127}`` is a numeric
    range (zero-padded to the first bound's width), ``{a,b}`` a list; several braces
    multiply. A pattern without braces is itself."""
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    head, tail, body = pattern[: match.start()], pattern[match.end() :], match.group(1)
    numbers = _RANGE.match(body)
    if numbers:
        first, last = numbers.group(1), numbers.group(2)
        if int(last) < int(first):
            raise InvalidInput(f"the brace range {{{body}}} runs backwards")
        if int(last) - int(first) >= MAX_SHARDS:
            raise InvalidInput(f"the brace range {{{body}}} names over {MAX_SHARDS} shards")
        width = len(first) if first.startswith("0") else 0
        choices = [str(n).zfill(width) for n in range(int(first), int(last) + 1)]
    else:
        choices = body.split(",")
    return [head + choice + rest for choice in choices for rest in expand_braces(tail)]


def is_shards(source: str) -> bool:
    """Whether ``source`` names WebDataset shards: a tar file or a brace pattern of them."""
    return source.lower().endswith(SHARD_SUFFIXES)


def split_name(name: str) -> tuple[str, str]:
    """(key, extension) of a member's path: ``a/b.c.jpg`` -> (``a/b``, ``c.jpg``)."""
    folder, _, base = name.rpartition("/")
    stem, _, extension = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), extension.lower()


@dataclass
class Member:
    name: str
    offset: int  # of its data in the shard
    size: int
    data: bytes | None = None  # read for an image, a json or a txt member


@dataclass
class Sample:
    shard: str
    key: str
    members: dict[str, Member] = field(default_factory=dict)  # by extension


def read_samples(
    shard: str, *, keep: Iterable[str] = (), max_bytes: int | None = None
) -> Iterator[Sample]:
    """The samples of one shard, streamed. Images, ``json`` and ``txt`` members are read
    (with those whose extension is in ``keep``, ``*``: all), unless over ``max_bytes``;
    others are skipped. A shard that cannot be read, or that ends before its end marker
    (cut short), raises ``ImageError`` after the samples read whole before that."""
    wanted = {*IMAGE_EXTENSIONS, "json", "txt", *keep}
    current: Sample | None = None
    done = ""  # the last sample read whole
    with open_binary(shard) as raw:
        stream = _Counted(raw)
        tar = _tar_stream(stream, shard)
        try:
            for info in tar:
                if not info.isfile():
                    continue
                key, extension = split_name(info.name)
                if current is not None and key != current.key:
                    yield current
                    done, current = current.key, None
                if current is None:
                    current = Sample(shard, key)
                member = Member(info.name, info.offset_data, info.size)
                small = max_bytes is None or info.size <= max_bytes
                if (extension in wanted or "*" in wanted) and small:
                    handle = tar.extractfile(info)
                    member.data = handle.read() if handle is not None else b""
                    if len(member.data) != info.size:
                        raise EOFError("a member is cut short")
                current.members.setdefault(extension, member)
            if shard.lower().endswith(".tar"):
                _check_end(stream, tar.offset)
        except (tarfile.TarError, EOFError, OSError, ImageError) as exc:
            after = f" after the sample {done}" if done else ""
            raise ImageError(f"{name_of(shard)}: truncated or corrupt{after} ({exc})") from None
        finally:
            tar.close()
    if current is not None:
        yield current


class _Counted(io.RawIOBase):
    """A stream that counts the bytes read from it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.count = raw, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.count += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _check_end(stream: _Counted, end: int) -> None:
    """An intact tar ends with two zero blocks after its last member (``end``): a shard
    cut at a member's edge has none, and tarfile's stream reader takes that for its end.
    What is left (the end marker and padding) is read to count it."""
    while stream.read(1 << 16):
        pass
    if stream.count < end + 2 * tarfile.BLOCKSIZE:
        raise EOFError("the shard ends without the tar end marker: it was cut short")


def _tar_stream(stream: IO[bytes] | _Counted, shard: str) -> tarfile.TarFile:
    mode = "r|" if shard.lower().endswith(".tar") else "r|*"
    try:
        return tarfile.open(fileobj=stream, mode=mode)  # type: ignore[call-overload]
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ImageError(f"{name_of(shard)}: not a tar file ({exc})") from None


def shards_of(source: str) -> list[str]:
    """The shard paths or URLs of a source (a tar file, or a brace pattern)."""
    shards = expand_braces(source)
    if not is_url(source):
        shards = [str(Path(shard).resolve()) for shard in shards]
    return shards


def shard_rows(
    shards: list[str],
    question: str | None,
    options: list[str] | None,
    columns: Columns,
    *,
    max_bytes: int,
    copy_to: str | None = None,
) -> Iterator[SourceRow]:
    """The rows of a shard set, in order. ``copy_to``: keep each image in that folder
    (the upload store) and refer to the copy."""
    check_shards(shards, copying=copy_to is not None)
    position = 0
    for shard in shards:
        try:
            for sample in read_samples(shard, max_bytes=max_bytes):
                yield _sample_row(position, sample, question, options, columns, max_bytes, copy_to)
                position += 1
        except ImageError as exc:
            yield SourceRow(
                position,
                f"{shard}#broken",  # (the whole location: names repeat across folders)
                question or "",
                error=("invalid_input", str(exc)),
            )
            position += 1


def check_shards(shards: list[str], *, copying: bool) -> None:
    """Refuse, before any work, compressed shards whose images would be referred to."""
    compressed = [shard for shard in shards if not shard.lower().endswith(".tar")]
    if compressed and not copying:
        raise InvalidInput(
            f"{name_of(compressed[0])} is compressed: a worker cannot read one image of it "
            "by range. Decompress the shards, or copy their images into the upload store "
            "(--copy-images)"
        )


def _sample_row(
    position: int,
    sample: Sample,
    question: str | None,
    options: list[str] | None,
    columns: Columns,
    max_bytes: int,
    copy_to: str | None,
) -> SourceRow:
    where = f"{name_of(sample.shard)} key {sample.key}"

    def broken(reason: str, asked: str = "", code: str = "invalid_input") -> SourceRow:
        return SourceRow(
            position, sample.key, asked, chosen or None, error=(code, f"{where}: {reason}")
        )

    chosen: list[str] | None = None
    sidecar: dict[str, Any] = {}
    if "json" in sample.members:
        member = sample.members["json"]
        if member.data is None:
            return broken(f"the json member is over the limit of {max_bytes} bytes", question or "")
        try:
            loaded = json.loads(member.data)
        except (ValueError, RecursionError) as exc:  # (bad UTF-8 or JSON, nested too deep)
            reason = exc if isinstance(exc, ValueError) else "nested too deep"
            return broken(f"the json member is not valid JSON ({reason})", question or "")
        if not isinstance(loaded, dict):
            return broken("the json member is not a JSON object", question or "")
        sidecar = loaded
    asked = sidecar.get(columns.question) or question or _text(sample.members.get("txt"))
    if not isinstance(asked, str) or not asked.strip():
        return broken("no question (none in the json member, no -q, no txt member)")
    given = sidecar.get(columns.options, options)
    if given is not None and not is_options(given):
        return broken("options must be a list of strings", asked)
    chosen = given
    expected = given_text(sidecar.get(columns.answer))
    image = next((sample.members[e] for e in IMAGE_EXTENSIONS if e in sample.members), None)
    if image is None:
        return broken(f"no image member ({', '.join(IMAGE_EXTENSIONS)})", asked, "image_missing")
    if image.size > max_bytes:
        reason = f"the image is {image.size} bytes, above the limit of {max_bytes}"
        return broken(reason, asked, "image_too_large")
    data = image.data or b""
    if copy_to is not None:
        suffix = "." + image.name.rsplit(".", 1)[-1].lower()
        locator, digest = keep_bytes(data, Path(copy_to), suffix)
    else:
        locator, digest = tar_member(sample.shard, image.name, image.offset, image.size), None
    return SourceRow(
        position,
        sample.key,
        asked,
        chosen or None,
        locator,
        expected=expected,
        image_hash=digest or content_hash(data),
    )


def _text(member: Member | None) -> str | None:
    if member is None or member.data is None:
        return None
    try:
        return member.data.decode("utf-8").strip() or None
    except UnicodeDecodeError:
        return None


# ----------------------------------------------------------------------------- writing


def write_labelled_shard(
    shard: str,
    out: IO[bytes],
    labels: Callable[[list[Sample]], dict[str, dict[str, Any]]],
    member: str,
    *,
    group: int = 256,
) -> tuple[int, int]:
    """Copy ``shard``'s samples into a new tar on ``out``, each followed by a ``member``
    (``KEY.speceyes.json``) holding its label. ``labels`` is asked for ``group`` samples
    at a time (label by key; a sample without one gets no member). Returns (samples,
    labelled)."""
    samples = labelled = 0
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as writer:
        pending: list[Sample] = []

        def flush() -> int:
            found = labels(pending) if pending else {}
            for sample in pending:
                for part in sample.members.values():
                    _add(writer, part.name, part.data or b"")
                label = found.get(sample.key)
                if label is not None:
                    text = json.dumps(label, ensure_ascii=False, sort_keys=True).encode()
                    _add(writer, f"{sample.key}.{member}", text)
            done = sum(1 for sample in pending if sample.key in found)
            pending.clear()
            return done

        for sample in read_samples(shard, keep=("*",)):
            samples += 1
            pending.append(sample)
            if len(pending) >= group:
                labelled += flush()
        labelled += flush()
    return samples, labelled


def _add(writer: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    writer.addfile(info, io.BytesIO(data))
