"""A calibration file (``speceyes calibrate --out``), read where its values are needed.

The gate it chose becomes the gate wherever no gate setting is given
(``common.config``); the agreement its accepted answers had with the truth, and its
stricter taus, are what the online audit expects and may raise tau to
(``common.pipeline.audit``). None of it is a setting: the settings name the file.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import ConfigurationError


@dataclass(frozen=True)
class CalibrationFile:
    """What a calibration file (``speceyes calibrate --out``) says: the gate it chose, the
    agreement its accepted answers had with the truth, and stricter taus, nearest first.
    These are read from the file where they are needed, not kept as settings."""

    gate: dict[str, Any]  # mode, top_k, threshold
    agreement: float | None
    stricter: list[float]


@functools.cache
def read_calibration(path: Path) -> CalibrationFile:
    """The calibration file at ``path`` (``ConfigurationError`` if it is not one)."""
    try:
        record = json.loads(path.read_text())
        gate = record["gate"]
        values = {
            "mode": gate["mode"],
            "top_k": int(gate["top_k"]),
            "threshold": float(gate["threshold"]),
        }
        accepted = record.get("accepted")
        agreement = 1 - record["wrong"] / accepted if accepted else None
        stricter = [float(tau) for tau in record.get("stricter", [])]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"{path}: not a calibration file ({exc})") from None
    return CalibrationFile(values, agreement, stricter)
