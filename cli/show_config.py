"""``speceyes config``: the effective settings, field by field."""

from __future__ import annotations

import argparse
import json
from typing import Any

from common.config import Settings


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "config",
        help="print the effective settings",
        description="Print every setting with its current value (flags aside): defaults, "
        "overridden by SPECEYES_<FIELD> environment variables or a .env file.",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = Settings()
    values = settings.model_dump(mode="json")
    if args.json:
        print(json.dumps(values, indent=2))
        return 0
    for name, field in Settings.model_fields.items():
        env = f"SPECEYES_{name.upper()}"
        print(f"{env:<34} {values[name]!s:<30} {field.description or ''}")
    return 0
