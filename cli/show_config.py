"""``speceyes config``: the effective settings, field by field (and their documentation)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from common.config import Settings, configuration_markdown, leaves, without_password


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Print every setting with its current value (flags aside): defaults, "
        "overridden by SPECEYES_<NAME> environment variables or a .env file. Secrets, "
        "and the passwords in URLs, are shown as stars."
    )
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="machine-readable output")
    shown.add_argument(
        "--markdown",
        action="store_true",
        help="the settings' reference, as docs/configuration.md holds it",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.markdown:
        print(configuration_markdown(), end="")
        return 0
    settings = Settings()
    values = _hide_passwords(settings.model_dump(mode="json"))
    if args.json:
        print(json.dumps(values, indent=2))
        return 0
    for leaf in leaves():
        value: Any = values
        for part in leaf.path.split("."):
            value = value[part]
        print(f"{leaf.env:<34} {value!s:<30} {leaf.field.description or ''}")
    return 0


def _hide_passwords(value: Any) -> Any:
    """Every string of the dump with a URL's password starred (the database's, the
    broker's)."""
    if isinstance(value, dict):
        return {key: _hide_passwords(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_hide_passwords(item) for item in value]
    return without_password(value) if isinstance(value, str) else value
