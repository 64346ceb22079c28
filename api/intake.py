"""Turning what a request carries into a job the workers can run, within the limits.

An image arrives as bytes (a multipart upload or base64) or as a server-side path. Bytes
are checked (size, then decoded: format, pixels) and kept in ``upload_dir`` under their
content hash, so workers on other machines read them from a shared folder. A path is
accepted only inside one of ``image_roots`` after resolving symlinks, and checked the
same way. A bad image is refused here (422) and no job is created.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from common.config import Settings
from common.errors import ImageError
from common.images import content_hash, decode_image, read_image_bytes


class ApiError(Exception):
    """An error answer: HTTP status, a stable code, and what to do about it."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail


@dataclass(frozen=True)
class StoredImage:
    path: str
    digest: str


def check_question(question: str, options: list[str] | None, settings: Settings) -> None:
    if not question.strip():
        raise ApiError(422, "question_empty", "the question is empty")
    if len(question) > settings.max_question_chars:
        raise ApiError(
            413,
            "max_question_chars",
            f"the question has {len(question)} characters; the limit "
            f"(max_question_chars) is {settings.max_question_chars}",
        )
    if options is not None:
        if len(options) > settings.max_options:
            raise ApiError(
                413,
                "max_options",
                f"{len(options)} options; the limit (max_options) is {settings.max_options}",
            )
        if len(options) < 2:
            raise ApiError(422, "options_too_few", "multiple choice needs at least 2 options")


def image_from_bytes(data: bytes, settings: Settings) -> StoredImage:
    """Check uploaded bytes and keep them under ``upload_dir`` by content hash."""
    if len(data) > settings.max_upload_bytes:
        raise ApiError(
            413,
            "max_upload_bytes",
            f"the image has {len(data)} bytes; the limit (max_upload_bytes) is "
            f"{settings.max_upload_bytes}",
        )
    _decode(data, settings)
    digest = content_hash(data)
    suffix = "." + (Image.open(io.BytesIO(data)).format or "img").lower()
    target = settings.upload_dir / digest[:2] / f"{digest}{suffix}"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, scratch = tempfile.mkstemp(dir=target.parent, suffix=".part")
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(scratch, target)  # atomic: a reader sees the whole file or none
    return StoredImage(str(target), digest)


def image_from_base64(text: str, settings: Settings) -> StoredImage:
    if len(text) > settings.max_upload_bytes * 4 // 3 + 4:
        raise ApiError(
            413, "max_upload_bytes",
            f"the image is over the limit (max_upload_bytes) of {settings.max_upload_bytes}",
        )  # fmt: skip
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(422, "image_base64_invalid", "image_base64 is not valid base64") from None
    return image_from_bytes(data, settings)


def image_from_path(path: str, settings: Settings) -> StoredImage:
    """A server-side file, accepted only inside ``image_roots``."""
    if not settings.image_roots:
        raise ApiError(
            403,
            "server_paths_disabled",
            "this server accepts no server-side image paths (image_roots is empty); "
            "upload the image instead",
        )
    if ".." in Path(path).parts:
        raise ApiError(422, "path_traversal", "image_path may not contain '..'")
    resolved = Path(path).resolve()  # follows symlinks: a link out of the roots is refused
    roots = [root.expanduser().resolve() for root in settings.image_roots]
    if not any(resolved.is_relative_to(root) for root in roots):
        raise ApiError(
            403, "path_outside_roots", f"{path} is not inside an allowed folder (image_roots)"
        )
    try:
        data = read_image_bytes(resolved, settings.image_limits)
    except ImageError as exc:
        if exc.code == "image_too_large":
            raise ApiError(413, "max_image_bytes", f"{exc} (the max_image_bytes setting)") from None
        status = 404 if exc.code == "image_missing" else 422
        raise ApiError(status, exc.code, str(exc)) from None
    _decode(data, settings)
    return StoredImage(str(resolved), content_hash(data))


def _decode(data: bytes, settings: Settings) -> Image.Image:
    try:
        return decode_image(data, settings.image_limits)
    except ImageError as exc:
        if exc.code == "image_too_large":
            limit = "max_image_pixels" if "pixels" in str(exc) else "max_image_bytes"
            raise ApiError(413, limit, f"{exc} (the {limit} setting)") from None
        raise ApiError(422, "image_invalid", str(exc)) from None
