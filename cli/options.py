"""Command-line flags built from the settings' fields, and how they become one ``Settings``.

A flag is a setting's: its name, type, choices, metavar and help come from the field in
``common.config`` (``flag=`` there), so a setting is written once. A flag left out
leaves the setting to the environment (``SPECEYES_*``) or its default.
"""

from __future__ import annotations

import argparse
import types
import typing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from common.config import Leaf, Settings, default_of, leaves
from common.errors import ConfigurationError

_LEAVES = {leaf.path: leaf for leaf in leaves()}
MODEL_SETTINGS = (
    "models.small.name",
    "models.large.name",
    "agent.kind",
    "models.backend",
    "models.device",
    "models.dtype",
    "models.protocol",
)
FUNNEL_SETTINGS = (
    "calibration_file",
    "funnel.gate.mode",
    "funnel.gate.top_k",
    "funnel.gate.threshold",
    "funnel.screener",
    "funnel.speculation_depth",
    "funnel.depth_scope",
    "funnel.baseline",
    "funnel.method",
    "funnel.specreason_threshold",
    "funnel.calibrate",
    "audit.rate",
    "audit.on_drift",
    "agent.max_steps",
)


def add_settings(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *paths: str, flag: str | None = None
) -> None:
    """Flags for the settings at ``paths`` (``flag`` renames the one setting given)."""
    for path in paths:
        leaf = _LEAVES[path]
        name = flag or leaf.extra.get("flag")
        if name is None:
            raise ValueError(f"{path} has no flag in common.config")
        parser.add_argument(name, dest=_dest(path), **_argument(leaf))


def _argument(leaf: Leaf) -> dict[str, Any]:
    """argparse's keywords for a setting: type, choices, metavar, help."""
    annotation = leaf.field.annotation
    kind = annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # X | None: X
        kind = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    default = default_of(leaf.path)
    meaning = leaf.field.description or ""
    if not meaning.endswith("..."):  # (an ellipsis is part of what it says)
        meaning = meaning.removesuffix(".")
    shown = "unset" if default is None else str(default)
    help_text = f"{meaning} (default {shown}; {leaf.env})".replace("%", "%%")
    if kind is bool:
        return {"action": "store_true", "default": None, "help": help_text}
    metavar = leaf.extra.get("metavar") or leaf.path.rsplit(".", 1)[-1].upper()
    keywords: dict[str, Any] = {"help": help_text, "metavar": metavar}
    if typing.get_origin(kind) is typing.Literal:
        keywords["choices"] = list(typing.get_args(kind))
        keywords.pop("metavar")
    elif kind in (int, float, Path):
        keywords["type"] = kind
    return keywords


def _dest(path: str) -> str:
    return "setting__" + path.replace(".", "__")


def flag_defaults(**values: Any) -> dict[str, Any]:
    """A command's own defaults for some settings' flags, by flat name or path
    (``parser.set_defaults(**flag_defaults(small_model="tiny"))``)."""
    paths = {leaf.env[len("SPECEYES_") :].lower(): leaf.path for leaf in _LEAVES.values()}
    return {_dest(paths.get(name, name)): value for name, value in values.items()}


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    add_settings(parser.add_argument_group("models"), *MODEL_SETTINGS)


def add_funnel_flags(parser: argparse.ArgumentParser) -> None:
    add_settings(parser.add_argument_group("funnel"), *FUNNEL_SETTINGS)


def add_store_flags(parser: argparse.ArgumentParser) -> None:
    add_settings(parser, "database_url")


def add_broker_flags(parser: argparse.ArgumentParser) -> None:
    add_settings(parser, "broker.url")


def add_pipeline_flags(parser: argparse.ArgumentParser) -> None:
    """Everything a command that runs or serves the pipeline takes: models, funnel, store,
    broker."""
    add_model_flags(parser)
    add_funnel_flags(parser)
    add_store_flags(parser)
    add_broker_flags(parser)


def settings_from_args(args: argparse.Namespace, **overrides: Any) -> Settings:
    """Settings from the flags that were given, the environment, then the defaults (a
    gate flag or variable beats a calibration file's gate). ``overrides`` are settings
    by flat name or path."""
    given = {
        name[len("setting__") :].replace("__", "."): value
        for name, value in vars(args).items()
        if name.startswith("setting__") and value is not None
    }
    try:
        return Settings(**given, **overrides)
    except ValidationError as exc:
        problems = "; ".join(f"{_named(error['loc'])}: {error['msg']}" for error in exc.errors())
        raise ConfigurationError(problems) from None


def _named(location: tuple[int | str, ...]) -> str:
    """A setting as a person sets it: its path, flag and variable."""
    path = ".".join(str(part) for part in location)
    leaf = _LEAVES.get(path)
    if leaf is None:
        return path
    ways = [leaf.extra["flag"]] if "flag" in leaf.extra else []
    return f"{path} ({', '.join([*ways, leaf.env])})"


def require_shared_store(settings: Settings) -> None:
    """With a broker, every worker must reach the same store: refuse SQLite (a file of
    this machine's, which workers elsewhere cannot share) before anything is sent."""
    if settings.broker.url and settings.database_url.startswith("sqlite"):
        raise ConfigurationError(
            f"a broker ({settings.broker.url.split('@')[-1]}) needs a job store every worker "
            f"shares, not the SQLite file {settings.database_url.removeprefix('sqlite:///')}: "
            "set SPECEYES_DATABASE_URL (or --db) to PostgreSQL, e.g. "
            "postgresql+psycopg://HOST/speceyes; or unset the broker to run embedded"
        )


def iso_moment(text: str) -> datetime:
    """A flag's ISO 8601 date or time, in UTC (one without a zone is read as UTC)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO date or time") from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
