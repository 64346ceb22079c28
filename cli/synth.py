"""``speceyes synth``: the SpecEyes-Synth world, written in the benchmarks' formats."""

from __future__ import annotations

import argparse
from pathlib import Path

from common.errors import InvalidInput
from lab.synth.world import items, write_hr, write_manifest, write_pope, write_vstar


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    generate = actions.add_parser(
        "generate",
        help="write a synth corpus (manifest, V* folders, POPE parquet)",
        description="Write N seeded synth items: 896x896 images of two or three coloured shapes, "
        "a target named by its kind, large (easy) or small (hard, needs zooming), with "
        "V*-style colour questions and "
        "POPE-style yes/no questions. Writes OUT/manifest.jsonl (+ images/) for "
        "`speceyes annotate`, OUT/vstar/direct_attributes/, OUT/hr_bench_synth.tsv (HR-Bench "
        "layout) and OUT/POPE/Full/*.parquet: each is an `annotate` SOURCE.",
    )
    generate.add_argument("out", type=Path, metavar="OUT")
    generate.add_argument("--items", type=int, default=200, help="how many (200)")
    generate.add_argument("--seed", type=int, default=2026, help="world seed (2026)")
    generate.add_argument(
        "--hard-share",
        type=float,
        metavar="P",
        help="the share of hard items, which need a zoom (the world's draw, about half, "
        "when not given): e.g. 0.8 for a tool-heavy split like V*, 0.2 for one like POPE",
    )
    generate.add_argument(
        "--kind",
        choices=("choice", "yesno"),
        help="only items of this kind (both when not given): V* and HR-Bench hold the "
        "multiple-choice ones, POPE the yes/no ones, so --items is then a split's rows",
    )
    generate.add_argument(
        "--formats",
        default="manifest,vstar,hr,pope",
        help="comma-separated subset of manifest,vstar,hr,pope (all)",
    )
    generate.set_defaults(run=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    formats = {name.strip() for name in args.formats.split(",") if name.strip()}
    unknown = formats - {"manifest", "vstar", "hr", "pope"}
    if unknown:
        raise InvalidInput(f"unknown format(s) {', '.join(sorted(unknown))}")
    if args.hard_share is not None and not 0 <= args.hard_share <= 1:
        raise InvalidInput(f"--hard-share {args.hard_share}: a share between 0 and 1")
    generated = list(items(args.items, args.seed, hard_share=args.hard_share, kind=args.kind))
    written = []
    if "manifest" in formats:
        written.append(str(write_manifest(generated, args.out)))
    if "vstar" in formats:
        write_vstar(generated, args.out / "vstar")
        written.append(str(args.out / "vstar"))
    if "hr" in formats:
        write_hr(generated, args.out / "hr_bench_synth.tsv")
        written.append(str(args.out / "hr_bench_synth.tsv"))
    if "pope" in formats:
        pope = args.out / "POPE" / "Full" / "random-00000-of-00001.parquet"
        write_pope(generated, pope)
        written.append(str(pope))
    hard = sum(item.difficulty == "hard" for item in generated)
    print(f"wrote {len(generated)} items ({hard} hard): {', '.join(written)}")
    return 0
