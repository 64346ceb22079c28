"""``speceyes models``: build and inspect local checkpoints."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from common.config import Settings


def register(commands: Any) -> None:
    parser = commands.add_parser("models", help="build the tiny offline checkpoints")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    build = actions.add_parser(
        "build-tiny",
        help="write the tiny random-weight checkpoints ('tiny' model spec)",
        description="Write a tiny random-weight Qwen2.5-VL (stands in for the agentic "
        "model) and a tiny Qwen3-VL (the small model), with a locally trained tokenizer, "
        "a chat template and image-processor configs. A few MB, seconds, no network. "
        "Their answers are meaningless: they exercise the real code paths.",
    )
    build.add_argument(
        "--out",
        type=Path,
        help="folder to write into (default: the cache the 'tiny' spec reads, SPECEYES_CACHE_DIR)",
    )
    build.add_argument("--force", action="store_true", help="rebuild even if present")
    build.set_defaults(run=run_build_tiny)


def run_build_tiny(args: argparse.Namespace) -> int:
    from common.models.tiny import build_tiny, tiny_paths, tiny_root

    settings = Settings()
    folder = args.out or tiny_root(settings.cache_dir)
    paths = {"large": folder / "large", "small": folder / "small"}
    if args.out is None:
        paths = tiny_paths(settings.cache_dir)
    if not args.force and all((p / "config.json").is_file() for p in paths.values()):
        print(f"tiny checkpoints already built in {folder} (--force rebuilds)")
        return 0
    started = time.perf_counter()
    paths = build_tiny(folder)
    seconds = time.perf_counter() - started
    for role, path in paths.items():
        size = sum(f.stat().st_size for f in path.iterdir()) / 1e6
        print(f"{role:<6} {path}  ({size:.1f} MB)")
    print(f"built in {seconds:.1f} s")
    return 0
