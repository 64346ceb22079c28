"""``speceyes models``: build and inspect local checkpoints."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from common.config import Settings
from common.models.full_size import write_random_init
from common.models.tiny import build_tiny, tiny_root
from lab.synth.train import SMALL_ZOOM_MINUTES, train_synth


def configure(parser: argparse.ArgumentParser) -> None:
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

    random = actions.add_parser(
        "build-random",
        help="write a full-size architecture with random weights (GPU speed benchmarks)",
        description="Write a checkpoint folder with no weights: the architecture's config, "
        "the tiny tokenizer and chat template, and a marker; the weights are built on the "
        "device when it loads (seeded). Answers are meaningless; generation costs what the "
        "real model's does. For `speceyes bench agent --large DIR --device cuda --dtype "
        "bfloat16` where no model hub is reachable.",
    )
    random.add_argument(
        "--preset",
        choices=("qwen2.5-vl-7b", "test"),
        default="qwen2.5-vl-7b",
        help="qwen2.5-vl-7b (DeepEyes / Thyme 7B, default), or test (tiny dimensions)",
    )
    random.add_argument("--out", type=Path, required=True, help="folder to write")
    random.set_defaults(run=run_build_random)

    train = actions.add_parser(
        "train-synth",
        help="train the tiny models on the SpecEyes-Synth world ('synth' model spec)",
        description="Start from the tiny random checkpoints and teach them the SpecEyes "
        "task in the synth world, on the CPU, by teacher forcing: the small model answers "
        "colour questions directly from a 128 px view (where hard targets are a few "
        "pixels); the agent model screens (yes for small targets, no for large ones) and "
        "follows the DeepEyes protocol (answer, or zoom into the target's cell and answer "
        "from the crop). The small model trains first, then the agent, each on every core "
        "(at once, the agent ran half its steps). The small model first learns lone "
        "shapes, the agent first where lone targets are (large, then smaller); then both "
        "learn the world, where the target is one of two or three shapes. On hard items "
        "the small model is taught to be unsure (an even share of the possible answers): "
        "it cannot see them. The log shows held-out progress every two minutes; the small "
        "model starts over with another seed when picking the named shape has not taken "
        "off after 10 minutes of the world, while its budget leaves time for it. Each "
        "trains for a fixed number of minutes of wall time, so a busy or slower machine "
        "gets fewer steps: "
        "check the result with `speceyes bench synth --small DIR/small --large DIR/large`.",
    )
    train.add_argument(
        "--out",
        type=Path,
        default=Path("synth-models"),
        help="folder for small/ and large/ (the shipped weights live in "
        "common/models/weights/synth)",
    )
    train.add_argument("--items", type=int, default=4000, help="training items (4000)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument(
        "--small-minutes",
        type=float,
        default=26.0,
        help="the small model's budget, rendering included (26, of which 1.5 on lone shapes)",
    )
    train.add_argument(
        "--large-minutes",
        type=float,
        default=32.0,
        help="the agent's budget, trained after the small model (32, of which 6 locate targets)",
    )
    train.add_argument(
        "--small-zoom-minutes",
        type=float,
        default=SMALL_ZOOM_MINUTES,
        help="then the small model's zooms (speculation in depth), on top of what it "
        f"learned ({SMALL_ZOOM_MINUTES:g}, of which 3 locate targets)",
    )
    train.add_argument(
        "--only",
        choices=("small", "large", "small-zoom"),
        help="train this model alone, keeping the other in --out; small-zoom: the small "
        "model's zoom stage alone, on the small model in --out",
    )
    train.set_defaults(run=run_train_synth)


def run_build_random(args: argparse.Namespace) -> int:
    folder = write_random_init(args.out, args.preset)
    print(f"wrote {args.preset} (random weights, built at load) to {folder}")
    return 0


def run_build_tiny(args: argparse.Namespace) -> int:
    folder = args.out or tiny_root(Settings().models.cache_dir)
    if not args.force and all(
        (folder / role / "config.json").is_file() for role in ("large", "small")
    ):
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


def run_train_synth(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    info = train_synth(
        args.out,
        items_count=args.items,
        seed=args.seed,
        small_minutes=args.small_minutes,
        large_minutes=args.large_minutes,
        small_zoom_minutes=args.small_zoom_minutes,
        only=args.only,
        on_log=lambda line: print(line, flush=True),
    )
    for role in (args.only,) if args.only else ("small", "small-zoom", "large"):
        report = info[role]
        held_out = "  ".join(f"{k} {v:.0%}" for k, v in (report["held_out"] or {}).items())
        print(
            f"{role:<6} {report['steps']} steps, loss {report['loss']:.4f}, "
            f"token accuracy {report['token_accuracy']:.3f}, attempts {report['attempts']}; "
            f"held-out: {held_out}"
        )
    print(f"trained in {(time.perf_counter() - started) / 60:.1f} min -> {args.out}")
    return 0
