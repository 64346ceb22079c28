"""How the small model zooms (speculation in depth) on held-out synth items.

Through the serving code path: the models as ``load_models`` loads them, depth 1 through
``speculate_in_depth`` (the agent's box rules and crops), depth 0 through the funnel's
phase II and the gate's scoring (``report.direct_passes``). For each difficulty:

- at depth 1: the share of first turns that are a well-formed zoom (the call parses and
  the agent's rules accept its box), and that zoom into the target's grid cell; of the
  answers that follow a zoom (or come without one), the share right, the share the gate
  would take (min gate at the served threshold) and how many of those are right;
- at depth 0: accuracy and the min gate's separability, easy against hard (the AUC): what
  the paper's method and the served threshold rely on.

``python -m lab.synth.zoom_report --small DIR/small`` prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.backends import Models, load_models
from common.config import GateSettings, Settings
from common.contracts import Query
from common.pipeline.depth import Zoomed, speculate_in_depth
from common.pipeline.gate import score_answers
from common.protocols.scoring import is_correct
from common.scores import accepts
from lab.synth.report import auc, direct_passes, share
from lab.synth.world import SynthItem, items

SYNTH_TAU = 0.9  # the gate threshold the synth models are served with (make demo)


@dataclass
class ZoomOutcome:
    """One item's speculation at depth 1: its first turn, and the answer it led to."""

    item: SynthItem
    zoomed: bool  # a well-formed zoom: the call parses, its box accepted and cropped
    on_target: bool  # ... into the target's grid cell
    answered: bool = False  # an answer, after the zoom or instead of it
    correct: bool = False
    accepted: bool = False  # the gate would take the answer


def zoom_outcomes(
    models: Models, held_out: Sequence[SynthItem], settings: Settings
) -> list[ZoomOutcome]:
    """Speculation at depth 1 over ``held_out``, in the funnel's micro-batches."""
    funnel, found = settings.funnel, []
    gate = GateSettings(mode="min", top_k=funnel.gate.top_k)
    for start in range(0, len(held_out), funnel.fast_batch_size):
        batch = list(held_out[start : start + funnel.fast_batch_size])
        zoomed = speculate_in_depth(
            [_query(item) for item in batch],
            models.small,
            depth=1,
            max_new_tokens=funnel.zoom_max_new_tokens,
            top_k=funnel.gate.top_k,
            limits=settings.agent,
        )
        found += [_outcome(item, job, gate) for item, job in zip(batch, zoomed, strict=True)]
    return found


def _query(item: SynthItem) -> Query:
    return Query(item.id, item.render(), item.question, tuple(item.options or ()))


def _outcome(item: SynthItem, job: Zoomed, gate: GateSettings) -> ZoomOutcome:
    first_box = job.steps[0].box_original if job.steps else None
    outcome = ZoomOutcome(item, first_box is not None, first_box == list(item.cell))
    if job.speculation is not None:
        (result,) = score_answers([job.speculation.scores], gate)
        outcome.answered = True
        outcome.correct = is_correct(job.speculation.answer, item.answer, item.options)
        outcome.accepted = accepts(result.confidence, SYNTH_TAU)
    return outcome


def _answers(outcomes: Sequence[ZoomOutcome]) -> dict[str, float]:
    """Of ``outcomes``: the share right, the share the gate takes, and how many of
    those are right."""
    accepted = [o for o in outcomes if o.accepted]
    return {
        "items": len(outcomes),
        "right": share([o.correct for o in outcomes]),
        "accepted": share([o.accepted for o in outcomes]),
        "accepted_right": share([o.correct for o in accepted]),
    }


def zoom_report(models: Models, settings: Settings, *, count: int, seed: int) -> dict[str, Any]:
    """The figures for ``count`` held-out items of ``seed`` (half of them hard)."""
    held_out = list(items(count, seed))
    depth_zero, _ = direct_passes(models, held_out, settings)
    zooms = zoom_outcomes(models, held_out, settings)
    report: dict[str, Any] = {"items": count, "seed": seed, "tau": SYNTH_TAU}
    for difficulty in ("easy", "hard"):
        mine = [o for o in zooms if o.item.difficulty == difficulty]
        direct = [o for o in depth_zero if o.item.difficulty == difficulty]
        report[difficulty] = {
            "items": len(mine),
            "depth_1": {
                "well_formed_zoom": share([o.zoomed for o in mine]),
                "on_target": share([o.on_target for o in mine]),
                "answered_without_zoom": share([o.answered and not o.zoomed for o in mine]),
                "after_zoom": _answers([o for o in mine if o.zoomed]),
                "after_zoom_on_target": _answers([o for o in mine if o.on_target]),
                "without_zoom": _answers([o for o in mine if o.answered and not o.zoomed]),
            },
            "depth_0": {
                "accuracy": share([o.small_correct for o in direct]),
                "separability": sum(o.separability for o in direct) / max(1, len(direct)),
                "accepted": share(
                    [accepts(o.confidence.get("min", 0.0), SYNTH_TAU) for o in direct]
                ),
            },
        }
    report["depth_0_auc_easy_over_hard"] = auc(
        [o.separability for o in depth_zero if o.item.difficulty == "easy"],
        [o.separability for o in depth_zero if o.item.difficulty == "hard"],
    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", default="synth", help="the small model (default: synth)")
    parser.add_argument("--large", default="synth", help="the agent, for the screen (synth)")
    parser.add_argument("--items", type=int, default=160, help="held-out items (160)")
    parser.add_argument("--seed", type=int, default=77, help="held-out seed (77)")
    args = parser.parse_args(argv)
    settings = Settings(small_model=args.small, large_model=args.large, device="cpu")
    report = zoom_report(load_models(settings), settings, count=args.items, seed=args.seed)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
