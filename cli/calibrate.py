"""``speceyes calibrate``: pick the gate's tau for a corpus, with a guarantee."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from cli.options import add_store_flags, settings_from_args
from common.config import GateSettings
from common.errors import InvalidInput
from common.evaluation.calibration import default_grid, pick_tau, sweep
from common.evaluation.depth import DepthRow, recorded_depth, replay_depths
from common.store.analytics import STRICT_COUNTS, calibration_items, stage_costs
from common.store.db import open_store
from common.store.reads import require_batch

DESCRIPTION = """\
Without --max-error: sweep a calibration run (annotate --calibrate): replay every gate,
mode x K x tau, from its recorded logits, and print the share the funnel would accept,
the accuracy of those answers, the overall accuracy (the agent answering the rest), how
often the accepted answers agree with the agent's, and the speedup estimated from the
run's measured stage costs (--json, --plot). A calibration run at speculation depth
D >= 1 (annotate --calibrate --speculation-depth D) also replays each depth d <= D, at
its gate's mode and K, for each tau: one run at D = 2 reads D = 0, 1 and 2.

With --max-error: pick the loosest gate threshold tau whose accepted answers are wrong
at most --max-error of the time, with probability at least 1 - --delta: fixed-sequence
testing of tau from strict to loose with exact binomial tails (learn then test). The
evidence is a finished batch: every row the small model answered and the screen called
tool-free, accepted or not, under the batch's own gate mode and K, scored against its
known answer (an "answer" per row, or a benchmark) or, in a calibration run without
one, against the agent's. The guarantee holds for
new rows like those (exchangeable with them); a corpus that drifts needs a new run.

Prints each tested threshold (accepted rows, wrong ones, p-value) up to where the walk
stopped, and the choice, or says plainly that no tau meets the target. --out writes a
calibration file that `speceyes annotate --calibration FILE` takes.
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "batches",
        nargs="+",
        metavar="BATCH",
        help="batch ids or names (the newest of each); several are pooled (one per split)",
    )
    parser.add_argument(
        "--max-error", type=float, help="epsilon: pick tau so accepted answers err at most this"
    )
    parser.add_argument("--delta", type=float, default=0.05, help="1 - confidence (0.05)")
    parser.add_argument("--out", type=Path, help="write the calibration file (JSON)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="sweep: rows as JSON")
    parser.add_argument(
        "--plot", type=Path, metavar="PNG", help="sweep: accuracy against speedup per mode"
    )
    add_store_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    sessions = open_store(settings_from_args(args).database_url, create=False)
    items, ids, fast, agent = [], [], 0.0, 0.0
    with sessions() as session:
        for name in args.batches:
            batch = require_batch(session, name)
            found = calibration_items(session, batch.id)
            batch_fast, batch_agent = stage_costs(session, batch.id)
            fast, agent = fast + batch_fast * len(found), agent + batch_agent * len(found)
            items += found
            ids.append(batch.id)
    if not items:
        raise InvalidInput(f"{', '.join(ids)}: no rows the small model answered and can be scored")
    costs = (fast / len(items), agent / len(items))  # per job, pooled over the batches
    if args.max_error is None:
        return _sweep(items, costs, args.json, args.plot)
    # the funnel only ever accepts what the screen called tool-free (a calibration run
    # speculates the rest too, for the sweep)
    items = [item for item in items if item.tool_free]
    if not items:
        raise InvalidInput("the screen sent every answered row to the agent")
    gates = {(i.gate.get("mode"), i.gate.get("top_k")) for i in items}
    if len(gates) > 1:
        raise InvalidInput(f"the batch mixes gate settings {sorted(gates)}: calibrate one")
    ((mode, top_k),) = gates
    try:
        choice = pick_tau(
            [i.confidence for i in items],
            [not i.right for i in items],
            default_grid(),
            max_error=args.max_error,
            delta=args.delta,
        )
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    print(f"{', '.join(args.batches)}: {len(items)} answered rows, gate {mode}, K={top_k}")
    print("   tau  accepted  wrong  p-value")
    for test in choice.tests:
        if test.p_value == test.p_value:  # tested (not NaN)
            mark = "certified" if test.certified else "stops the walk"
            print(f"{test.tau:>6}  {test.accepted:>8}  {test.wrong:>5}  {test.p_value:.4f}  {mark}")
    if choice.tau is None:
        needed = math.ceil(math.log(args.delta) / math.log1p(-args.max_error))
        print(
            f"no tau keeps the error of accepted answers at most {args.max_error:g} with "
            f"probability {1 - args.delta:g} on this evidence (a tau needs at least {needed} "
            f"accepted rows, and more if any is wrong; {len(items)} were answered): keep "
            "the agent for every job, or gather more labelled rows"
        )
        return 1
    accepted = next(t for t in choice.tests if t.tau == choice.tau)
    print(
        f"tau {choice.tau:g}: accepts {accepted.accepted} of {len(items)} answered rows "
        f"({accepted.wrong} wrong); error <= {args.max_error:g} with probability "
        f">= {1 - args.delta:g}"
    )
    if args.out is not None:
        record = {
            "gate": {"mode": mode, "top_k": top_k, "threshold": choice.tau},
            "max_error": args.max_error,
            "delta": args.delta,
            "batches": ids,
            "items": len(items),
            "accepted": accepted.accepted,
            "wrong": accepted.wrong,
            # the audit's next steps on drift: the certified taus stricter than this one
            "stricter": sorted(t.tau for t in choice.tests if t.certified and t.tau > choice.tau),
        }
        args.out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.out} (speceyes annotate --calibration {args.out})")
    return 0


MODES = ("min", "mean", "bottom20", "logprob")
SWEEP_KS = (16, 32, 64, 128)
SWEEP_TAUS = (0.9, 0.95, 0.97, 0.98, 0.99)


def _sweep(
    items: list[Any], costs: tuple[float, float], json_path: Path | None, plot: Path | None
) -> int:
    recorded = [item for item in items if item.replay]
    if not recorded:
        raise InvalidInput(
            "no recorded logits to sweep: run annotate --calibrate, or give --max-error to "
            "pick tau from this batch's own gate"
        )
    rows = sweep(recorded, MODES, SWEEP_KS, SWEEP_TAUS, costs)
    print(
        f"{len(recorded)} jobs replayed (accepted: screened tool-free and over tau); measured "
        f"{costs[0]:.3f} s per job in the fast stage, {costs[1]:.3f} s per agent job; "
        f"accuracy by {STRICT_COUNTS} (the agent's answer where a row has no other label)"
    )
    print("mode       K    tau    accepted  acc. accepted  accuracy  agrees  speedup (est.)")
    for row in rows:
        print(
            f"{row.mode:<9} {row.top_k:>3}  {row.tau:<5}  {row.accepted:>8.1%}  "
            f"{row.accepted_accuracy:>13.1%}  {row.accuracy:>8.1%}  {row.agreement:>6.1%}  "
            f"{row.speedup:>6.2f}x"
        )
    depths = _depth_sweep(recorded)
    if json_path is not None:
        found: Any = [asdict(row) for row in rows]
        if depths:  # (a run without depth keeps the plain list it always wrote)
            found = {"gates": found, "depths": [asdict(row) | {"tau": t} for t, row in depths]}
        json_path.write_text(json.dumps(found, indent=2) + "\n")
        print(f"wrote {json_path}")
    if plot is not None:
        _plot(rows, plot)
        print(f"wrote {plot}")
    return 0


def _depth_sweep(items: list[Any]) -> list[tuple[float, DepthRow]]:
    """A calibration run at depth D >= 1: each depth d <= D (and scope) replayed at the
    run's gate mode and K, for each tau of the sweep, printed; (tau, row) pairs."""
    depth = recorded_depth(items)
    if depth == 0:
        return []
    gates = {(i.gate.get("mode"), i.gate.get("top_k")) for i in items}
    if len(gates) > 1:
        raise InvalidInput(f"the batch mixes gate settings {sorted(gates)}: calibrate one")
    ((mode, top_k),) = gates
    print(f"\nspeculation in depth, replayed to D={depth} (gate {mode}, K={top_k}; each job's")
    print("own measured times; 'all': the jobs the screen sent to the agent zoom too;")
    print(f"accuracy by {STRICT_COUNTS})")
    print("depth        tau    beta   alpha  accepted  accuracy  tokens/job  speedup (est.)")
    found = []
    for tau in SWEEP_TAUS:
        gate = GateSettings(mode=mode, top_k=top_k, threshold=tau)
        for row in replay_depths(items, gate, depth):
            found.append((tau, row))
            print(
                f"{row.label:<11}  {tau:<5}  {row.beta:>5.2f}  {row.alpha:>5.2f}  "
                f"{row.accepted:>8.1%}  {row.accuracy:>8.1%}  {row.tokens:>10.1f}  "
                f"{row.speedup:>6.2f}x"
            )
    return found


def _plot(rows: list[Any], path: Path) -> None:
    """Accuracy against estimated speedup, one curve per mode (at K = 64)."""
    figure = Figure(figsize=(6.5, 4.2))  # (no pyplot: no backend, no global state)
    axis = figure.subplots()
    for mode in MODES:
        points = sorted(
            (r.speedup, 100 * r.accuracy) for r in rows if r.mode == mode and r.top_k == 64
        )
        axis.plot([p[0] for p in points], [p[1] for p in points], "o-", label=mode)
    axis.set_xlabel("estimated speedup over the agent alone (x)")
    axis.set_ylabel("accuracy (%)")
    axis.set_title("gates replayed from a calibration run (K = 64, tau 0.90-0.99)")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
