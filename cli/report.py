"""``speceyes report``: accuracy and speedup per benchmark split, as the paper lays it out."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from cli.options import add_store_flags, settings_from_args
from cli.output import say
from common.config import GateSettings
from common.errors import InvalidInput
from common.evaluation.depth import agent_alone, recorded_depth, replay_depths
from common.pipeline.audit import describe
from common.store import reads
from common.store.analytics import (
    STRICT_COUNTS,
    SplitRun,
    calibration_items,
    split_runs,
    stage_costs,
)
from common.store.db import open_store
from common.store.overview import overview
from common.store.reads import find_batch, require_batch

DESCRIPTION = """\
Print accuracy and speedup per benchmark split, in the layout of the paper's main table:
one column per split (V* attributes and positions, HR-Bench 4K and 8K, POPE adversarial,
popular and random, then any others) and the average; one line for the baseline batches
("agent alone", accuracy), one for the BATCHes ("SpecEyes", accuracy / speedup), and one
for those of the BATCHes run with --method specreason ("SpecReason", the paper's
comparison arm). Give one batch per split, or batches that hold several.

Accuracy is the reference's (its rules, its LLM judge where asked; a failed row it would
still score, an empty, tagged or cut-off answer, scored on its text, other failed rows
left out as its errors are);
speedup is the baseline's seconds per row over the line's, on the same split (--baseline:
batches run with --baseline), each split timed from its first claim to its last result
(the reference's latency per item). Then beta and alpha per split (SpecEyes), the small
model's share (SpecEyes: the answers it gave; SpecReason: the steps kept from it), and
the tokens generated per item as the reference counts them (every agent step;
SpecReason's proposals and the large model's corrections, never its scoring calls).

A calibration run at speculation depth D >= 1 (annotate --calibrate --speculation-depth
D) first gets tables of its own: each depth d <= D, replayed at the run's gate, per split
beside the agent alone: accuracy / speedup, beta / alpha / accepted share, and tokens per
job (each job's own measured times; "all": the jobs the screen sent to the agent zoom
too). One run at D = 2 reads D = 0, 1 and 2.

A batch that is not a benchmark but has known answers (a manifest's "answer" column) is
one column of its own, scored by our rules (the reference has none for it): named after
the batch (with its id's last 8 characters where two batches named share a name, such
as the API's default "api"), or as --column BATCH=KEY says: give a baseline batch the
same KEY as the funnel's to get its speedup. The last lines say which columns were
scored how. --markdown prints the tables as Markdown.
"""

PAPER_ORDER = (
    "vstar/direct_attributes",
    "vstar/relative_position",
    "hr/hr_bench_4k",
    "hr/hr_bench_8k",
    "pope/adversarial",
    "pope/popular",
    "pope/random",
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("batches", nargs="+", metavar="BATCH", help="batch ids or names")
    parser.add_argument(
        "--baseline", dest="baselines", nargs="+", metavar="BATCH", help="baseline batches"
    )
    parser.add_argument("--markdown", action="store_true", help="Markdown tables")
    parser.add_argument("--label", default="SpecEyes", help="the BATCHes' line (SpecEyes)")
    parser.add_argument(
        "--column",
        dest="columns",
        action="append",
        default=[],
        metavar="BATCH=KEY",
        help="the column a non-benchmark batch's rows go in (default: the batch's name); "
        "repeat for more batches, e.g. a funnel and its baseline under one KEY",
    )
    parser.add_argument(
        "--scoring",
        choices=["reference", "strict"],
        default="reference",
        help="reference: the evaluation's rules (and judge), failed rows as it counts them "
        "(scored where it would score them, else left out); strict: ours, a failed row is "
        "wrong (reference)",
    )
    add_store_flags(parser)
    parser.set_defaults(run=run)


def _column_keys(given: list[str]) -> dict[str, str]:
    """``--column BATCH=KEY`` flags as {batch: key}."""
    keys = {}
    for pair in given:
        batch, equals, key = pair.partition("=")
        if not equals or not batch or not key.strip():
            raise InvalidInput(f"--column {pair!r}: give BATCH=KEY (a batch name or id, a key)")
        keys[batch] = key.strip()
    return keys


def _print_audits(sessions: Any, args: argparse.Namespace) -> None:
    """Each batch's online audit, where it had one."""

    settings = settings_from_args(args)
    with sessions() as session:
        for name in args.batches:
            batch = find_batch(session, name)
            lines = describe(session, settings, batch) if batch is not None else []
            if lines:
                say(f"{batch.name} ({batch.id})" if batch else name)
                print("\n".join(lines))


@dataclasses.dataclass(frozen=True)
class Line:
    """A line of the tables: its label, the method its batches ran, their split runs."""

    label: str
    method: str  # "baseline", "speceyes" or "specreason"
    runs: dict[str, SplitRun]


def run(args: argparse.Namespace) -> int:
    sessions = open_store(settings_from_args(args).database_url, create=False)
    keys = _column_keys(args.columns)
    named = [*args.batches, *(args.baselines or [])]
    with sessions() as session:
        found = {name: require_batch(session, name) for name in named}
    names = [batch.name for batch in found.values()]

    def column(name: str) -> str:
        """The column of a batch's rows of no benchmark split (``--column``, else its name,
        with its id's start where two batches share that name)."""
        batch = found[name]
        chosen = keys.get(name, keys.get(batch.name, keys.get(batch.id)))
        if chosen is not None:
            return chosen
        return batch.name if names.count(batch.name) == 1 else f"{batch.name}:{batch.id[-8:]}"

    def runs_of(names: list[str], method: str | None = None) -> dict[str, SplitRun]:
        """The named batches' split runs (``method``: only batches run with it, or only
        the others for "speceyes")."""
        runs: dict[str, SplitRun] = {}
        with sessions() as session:
            for name in names:
                batch = found[name]
                ran = (batch.config or {}).get("method", "speceyes")
                if method is None or ran == method:
                    runs.update(split_runs(session, batch.id, column(name)))
        return runs

    _print_audits(sessions, args)
    _print_depths(sessions, args)
    baselines = runs_of(args.baselines or [])
    lines = [Line("agent alone", "baseline", baselines)] if baselines else []
    lines.append(Line(args.label, "speceyes", runs_of(args.batches, "speceyes")))
    specreason = runs_of(args.batches, "specreason")
    if specreason:
        lines.append(Line("SpecReason", "specreason", specreason))
    lines = [line for line in lines if line.runs or line.method == "speceyes"]
    splits = sorted({s for line in lines for s in line.runs}, key=_paper_position)
    price = settings_from_args(args).accounting.price_per_gpu_hour
    if not splits:  # nothing to score: what the funnel did needs no labels
        _print_funnel(sessions, named, args.markdown)
        return _print_usage(sessions, named, args.markdown, price)
    header = ["", *splits, "avg"]
    table, funnel, shares, tokens = [], [], [], []
    for line in lines:
        name, runs = line.label, line.runs
        cells, accuracies, speedups = [name], [], []
        for split in splits:
            run_ = runs.get(split)
            if run_ is None:
                cells.append("-")
                continue
            accuracy = run_.score.reference if args.scoring == "reference" else run_.score.strict
            accuracies.append(accuracy)
            cell = f"{100 * accuracy:.2f}"
            base = baselines.get(split) if runs is not baselines else None
            if base is not None and run_.seconds_per_item:
                speedups.append(base.seconds_per_item / run_.seconds_per_item)
                cell += f"/{speedups[-1]:.2f}"
            cells.append(cell)
        average = f"{100 * sum(accuracies) / len(accuracies):.2f}" if accuracies else "-"
        if speedups:
            average += f"/{sum(speedups) / len(speedups):.2f}"
        table.append([*cells, average])
        is_funnel = line.method == "speceyes"
        funnel.append(
            [name, *(_beta_alpha(runs.get(split) if is_funnel else None) for split in splits), ""]
        )
        shares.append(_row(name, splits, runs, lambda run, f=is_funnel: _small_share(run, f)))
        tokens.append(
            _row(name, splits, runs, lambda run, f=is_funnel: None if f else _tokens(run))
        )
    benchmark = [run.score.benchmark for line in lines for run in line.runs.values()]
    scoring = f"{args.scoring} scoring"
    if not any(benchmark):
        scoring = "our rules: no benchmark rows"
    elif not all(benchmark):
        scoring += " for the benchmark splits, our rules for the rest"
    print(f"accuracy % ({scoring})" + (" / speedup x" if baselines else ""))
    _print(header, table, args.markdown)
    print("\nbeta / alpha (screened tool-free / speculated answers accepted)")
    _print(header, funnel, args.markdown)
    print("\nsmall model's share % (SpecEyes: the answers it gave; SpecReason: the steps kept)")
    _print(header, shares, args.markdown)
    print("\ntokens per item (agent steps; SpecReason: proposals and corrections, not scoring)")
    _print(header, tokens, args.markdown)
    print("\nscored:")
    bullet = "- " if args.markdown else "  "
    for line in lines:
        name, runs = line.label, line.runs
        for split in splits:
            if split in runs:
                print(f"{bullet}{name:<12} {split}: {_how_scored(runs[split], args.scoring)}")
    return _print_usage(sessions, named, args.markdown, price)


def _print_usage(sessions: Any, names: list[str], markdown: bool, price: float | None) -> int:
    """Per batch, its model seconds and tokens, and what the funnel saved against the
    agent alone (``common.store.usage``), with its 95% interval."""
    header = ["batch", "model s", "tokens in", "tokens out", "saved s", "95% interval", "saved"]
    if price is not None:
        header += ["cost", "saved cost"]
    table = []
    with sessions() as session:
        for name in names:
            batch = require_batch(session, name)
            used = overview(session, batch.id).usage.to_dict(price)
            saved = used["saved"]
            row = [
                batch.name,
                f"{used['total_s']:.1f}",
                str(used["tokens_in"]),
                str(used["tokens_out"]),
                "-" if saved is None else f"{saved['seconds']:.1f}",
                "-" if saved is None else f"{saved['low']:.1f} to {saved['high']:.1f}",
                "-" if saved is None or saved["share"] is None else f"{100 * saved['share']:.1f}%",
            ]
            if price is not None:
                row += [
                    f"{used['cost']:.4f}",
                    "-" if saved is None else f"{used['saved_cost']:.4f}",
                ]
            table.append(row)
    print("\nmodel time (a batched call's shared by its jobs) and what the funnel saved against")
    print("the agent alone (the accepted jobs at what the agent's runs here say one costs, less")
    print("the fast stage; docs/api.md)")
    _print(header, table, markdown)
    return 0


def _print_depths(sessions: Any, args: argparse.Namespace) -> None:
    """The calibration runs at depth D >= 1 among the batches (one a split, or several
    splits each): every depth d <= D (and scope) replayed at the runs' gate, per split,
    beside the agent alone (common.evaluation.depth)."""
    splits: dict[str, list[Any]] = {}
    names = []
    with sessions() as session:
        for name in args.batches:
            batch = require_batch(session, name)
            items = calibration_items(session, batch.id)
            if recorded_depth(items):
                names.append(batch.name)
                for item in items:
                    splits.setdefault(item.split or batch.name, []).append(item)
    if not splits:
        return
    depth = min(recorded_depth(items) for items in splits.values())
    say(f"{', '.join(names)}: speculation in depth, replayed to D={depth}")
    _depth_tables(splits, depth, args.markdown)


def _depth_tables(splits: dict[str, list[Any]], depth: int, markdown: bool) -> None:
    order = sorted(splits, key=_paper_position)
    gates = {json.dumps(item.gate, sort_keys=True) for items in splits.values() for item in items}
    if len(gates) > 1:
        raise InvalidInput(f"the calibration runs mix gates {sorted(gates)}: report one at a time")
    gate = GateSettings.model_validate(json.loads(gates.pop()))
    replayed = {split: replay_depths(splits[split], gate, depth) for split in order}
    alone = {split: agent_alone(splits[split]) for split in order}
    print(
        f"gate {gate.mode}, K={gate.top_k}, tau {gate.threshold:g}; accuracy by {STRICT_COUNTS}; "
        "speedup over the agent alone from each job's measured times; 'all': the jobs the "
        "screen sent to the agent zoom too"
    )

    def line(label: str, cell: Any, rows: dict[str, Any]) -> list[str]:
        average = cell(_averaged(list(rows.values())))
        return [label, *(cell(rows[split]) for split in order), average]

    accuracy = [line("agent alone", lambda a: f"{100 * a.accuracy:.2f}/1.00", alone)]
    funnel, tokens = [], [line("agent alone", lambda a: f"{a.tokens:.1f}", alone)]
    for index, label in enumerate(row.label for row in replayed[order[0]]):
        rows = {split: replayed[split][index] for split in order}
        accuracy.append(line(label, lambda r: f"{100 * r.accuracy:.2f}/{r.speedup:.2f}", rows))
        funnel.append(
            line(label, lambda r: f"{r.beta:.2f}/{r.alpha:.2f}/{100 * r.accepted:.1f}", rows)
        )
        tokens.append(line(label, lambda r: f"{r.tokens:.1f}", rows))
    header = ["", *order, "avg"]
    print("\naccuracy % / speedup x")
    _print(header, accuracy, markdown)
    print("\nbeta / alpha / accepted % (reach the small model / of those accepted / of all)")
    _print(header, funnel, markdown)
    print("\ntokens per job (the small model's and, where it ran, the agent's)")
    _print(header, tokens, markdown)
    print()


def _averaged(rows: list[Any]) -> Any:
    """The mean of each figure over rows of one kind (splits weigh alike, as the paper's
    average does)."""
    kind = type(rows[0])
    names = [n for n in kind.__dataclass_fields__ if isinstance(getattr(rows[0], n), float)]
    means = {n: sum(getattr(row, n) for row in rows) / len(rows) for n in names}
    return dataclasses.replace(rows[0], **means)


def _print_funnel(sessions: Any, names: list[str], markdown: bool) -> None:
    """Per batch, what needs no known answer: beta, alpha, the share the small model
    answered, and each stage's seconds per job."""
    header = [
        "batch",
        "jobs",
        "finished",
        "beta",
        "alpha",
        "accepted %",
        "fast s/job",
        "agent s/job",
    ]
    table = []
    with sessions() as session:
        for name in names:
            batch = require_batch(session, name)
            counts = reads.batch_counts(session, batch.id)
            fast_s, agent_s = stage_costs(session, batch.id)
            accepted = (
                f"{100 * counts.by_answerer['small'] / counts.finished:.1f}"
                if counts.finished
                else "-"
            )
            table.append(
                [
                    batch.name,
                    str(counts.jobs),
                    str(counts.finished),
                    _share(counts.beta),
                    _share(counts.alpha),
                    accepted,
                    f"{fast_s:.3f}" if fast_s else "-",
                    f"{agent_s:.3f}" if agent_s else "-",
                ]
            )
    print("no rows with a known answer to score: the funnel (beta: screened tool-free; alpha:")
    print("speculated answers the gate accepted; accepted: the share the small model answered)")
    _print(header, table, markdown)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _row(name: str, splits: list[str], runs: dict[str, SplitRun], figure: Any) -> list[str]:
    """A line of figures per split and their average ("-" where there is none)."""
    values = [figure(runs[split]) if split in runs else None for split in splits]
    known = [value for value in values if value is not None]
    average = f"{sum(known) / len(known):.2f}" if known else "-"
    return [name, *("-" if value is None else f"{value:.2f}" for value in values), average]


def _small_share(run: SplitRun, funnel: bool) -> float | None:
    """SpecEyes: the share of finished rows the small model answered; SpecReason: the
    share of kept steps it wrote; the agent alone: 0."""
    if funnel:
        finished = run.counts.finished
        return 100 * run.counts.by_answerer["small"] / finished if finished else None
    steps = run.steps
    return 100 * steps.small_steps / steps.steps if steps.steps else 0.0


def _tokens(run: SplitRun) -> float | None:
    """Tokens generated per job that ran (the agent's steps; SpecReason's proposals and
    corrections). None for SpecEyes, whose small answers' tokens are not kept."""
    steps = run.steps
    return steps.tokens / steps.trajectories if steps.trajectories else None


def _how_scored(run: SplitRun, scoring: str) -> str:
    score = run.score
    rows = f"{score.rows} rows with a known answer ({score.failed} failed)"
    if not score.benchmark:
        return f"{rows}, by our rules (no benchmark: the reference has no rules for these)"
    if scoring == "strict":
        return f"{rows}, by our rules, failed rows counted wrong"
    undecided = f", {score.undecided} left undecided (counted wrong)" if score.undecided else ""
    kept = score.failed - score.failed_scored
    return (
        f"{rows}, by the reference's rules and judge: {score.failed_scored} failed scored on "
        f"the text it would score, {kept} left out as its errors{undecided}"
    )


def _paper_position(split: str) -> tuple[int, str]:
    return (PAPER_ORDER.index(split) if split in PAPER_ORDER else len(PAPER_ORDER), split)


def _beta_alpha(run: Any) -> str:
    if run is None:
        return "-"
    beta, alpha = run.counts.beta, run.counts.alpha
    return f"{beta if beta is not None else 0:.2f}/{alpha if alpha is not None else 0:.2f}"


def _print(header: list[str], rows: list[list[str]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)))
