"""The service's own log lines, as text or JSON lines (``api.log_format``).

Two loggers carry what an operator ships and alerts on:

- ``speceyes.access``: one line per HTTP request (method, route template, status,
  milliseconds, the key's name, the client's address; never a secret);
- ``speceyes.jobs``: one line per job that fails (job, stage, error code, reason).

Their fields travel as the record's ``fields`` (``log.info(message, extra={"fields":
{...}})``): the text form appends them as ``name=value``, the JSON form makes each a key.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

ACCESS = logging.getLogger("speceyes.access")
JOBS = logging.getLogger("speceyes.jobs")

LogFormat = Literal["text", "json"]


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] = getattr(record, "fields", {})
    return fields


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: message name=value ...``"""

    def format(self, record: logging.LogRecord) -> str:
        pairs = " ".join(f"{name}={_text(value)}" for name, value in fields_of(record).items())
        line = f"{self.formatTime(record)} {record.levelname} {record.name}: {record.getMessage()}"
        line = f"{line} {pairs}" if pairs else line
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, the fields."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **fields_of(record),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def formatter(form: LogFormat) -> logging.Formatter:
    return JsonFormatter() if form == "json" else TextFormatter()


def log_service(form: LogFormat) -> None:
    """Send the access and job lines to stderr in ``form``, whatever the root logger's
    level (a service logs every request, not only with -v)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(form))
    for logger in (ACCESS, JOBS):
        logger.handlers[:] = [handler]
        logger.setLevel(logging.INFO)
        logger.propagate = False


def job_failed(job_id: str, stage: str, code: str | None, message: str | None) -> None:
    """The one line a failed job gets."""
    JOBS.warning(
        "job failed",
        extra={"fields": {"job": job_id, "stage": stage, "error": code, "reason": message}},
    )


def _text(value: object) -> str:
    """A field's value on a text line: quoted where it holds a space, controls escaped."""
    shown = str(value)
    if not shown or any(char.isspace() or not char.isprintable() for char in shown):
        return json.dumps(shown, ensure_ascii=True)
    return shown
