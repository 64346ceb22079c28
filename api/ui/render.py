"""The pages' templates (Jinja2, every value escaped unless a template says otherwise,
which none does) and the filters they format numbers with."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import Request
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from api.ui.session import UiSession
from common.store.tables import as_utc


def _real(value: Any) -> bool:
    """A number to format (a trace's field may hold anything: it shows as a dash)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def _percent(value: Any, digits: int = 1) -> str:
    return f"{100 * value:.{digits}f}%" if _real(value) else "–"


def _number(value: Any, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if _real(value) else "–"


def _seconds(value: Any) -> str:
    if not _real(value):
        return "–"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def _when(value: datetime | None) -> str:
    return "–" if value is None else as_utc(value).strftime("%Y-%m-%d %H:%M:%S UTC")


ENVIRONMENT = Environment(
    loader=PackageLoader("api.ui", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    undefined=StrictUndefined,  # a name a template misspells fails its test, not silently
    trim_blocks=True,
    lstrip_blocks=True,
)
ENVIRONMENT.filters.update(percent=_percent, number=_number, seconds=_seconds, when=_when)


def shows_image(job: Any) -> bool:
    """Whether a job has an image the pages can show: not one that failed for its image
    (unreadable, too large, of a refused shape, gone) or never had one; those get a
    placeholder with the reason instead of a broken picture and a 404."""
    if not job.image_path:
        return False
    return not (job.status == "failed" and (job.error_code or "").startswith("image"))


ENVIRONMENT.globals.update(shows_image=shows_image)


def render(name: str, request: Request, ui: UiSession | None, **context: Any) -> str:
    """The page ``name`` for the signed-in ``ui`` (None: signed out)."""
    return ENVIRONMENT.get_template(name).render(
        request=request,
        ui=ui,
        csrf=ui.csrf if ui else "",
        who=ui.caller.name if ui else None,
        **context,
    )
