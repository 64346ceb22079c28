"""The SpecEyes-Synth report: does the funnel work with the trained tiny models?

On a held-out synth set it measures, through the real code paths:

1. a screen pass (M_L) and a speculation pass (M_S) over every item: small-only
   accuracy, the separability of easy vs hard items, screen agreement with easy/hard,
   and the gate table (accepted vs rejected accuracy per mode at tau 0.97 / 0.98);
2. the embedded runner on the set, once as the funnel and once as ``--baseline``
   (agent only): accuracy, jobs/s, beta, alpha, and whether each hard item's first zoom
   landed on the target's cell;
3. a sweep of tau (min gate): the funnel's accuracy and speedup estimated from the
   per-item outcomes above and the measured per-job stage costs, plotted to a PNG.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from sqlalchemy import select

from common.backends import Models
from common.config import GateMode, GateSettings, Settings
from common.contracts import Query
from common.pipeline.funnel import screen_stage, speculate_stage
from common.pipeline.gate import score_answers
from common.pipeline.runner import EmbeddedRunner
from common.pipeline.submit import submit_corpus
from common.protocols.scoring import is_correct
from common.scores import accepts
from common.sources.corpus import read_source
from common.store.analytics import batch_accuracy
from common.store.db import open_store
from common.store.tables import BatchItem, Job
from lab.synth.world import SynthItem, items, write_manifest

MODES: tuple[GateMode, ...] = ("min", "mean", "bottom20", "logprob")
TAUS = (0.97, 0.98)


@dataclass
class ItemOutcome:
    item: SynthItem
    screen_tool_free: bool = False
    small_answer: str = ""
    small_correct: bool = False
    confidence: dict[str, float] = field(default_factory=dict)
    separability: float = 0.0  # S of the min gate
    agent_correct: bool = False
    zoom_on_target: bool | None = None  # hard items: first zoom box == the target's cell


def _queries(batch: Sequence[SynthItem]) -> list[Query]:
    return [
        Query(item.id, item.render(), item.question, tuple(item.options or ())) for item in batch
    ]


def direct_passes(
    models: Models, held_out: list[SynthItem], settings: Settings
) -> tuple[list[ItemOutcome], float]:
    """Screen and speculate every item; returns outcomes and fast-stage seconds per job."""
    outcomes, seconds = [], 0.0
    for start in range(0, len(held_out), settings.funnel.fast_batch_size):
        batch = held_out[start : start + settings.funnel.fast_batch_size]
        queries = _queries(batch)
        began = time.perf_counter()
        screens = screen_stage(
            queries, models.large, max_new_tokens=settings.funnel.screen_max_new_tokens
        )
        answers = speculate_stage(
            queries,
            models.small,
            max_new_tokens=settings.funnel.speculate_max_new_tokens,
            top_k=settings.funnel.gate.top_k,
        )
        seconds += time.perf_counter() - began
        for item, screen, answer in zip(batch, screens, answers, strict=True):
            outcome = ItemOutcome(item)
            if not isinstance(screen, Exception):
                outcome.screen_tool_free = not screen.needs_tools
            if not isinstance(answer, Exception):
                outcome.small_answer = answer.answer
                outcome.small_correct = is_correct(answer.answer, item.answer, item.options)
                for mode in MODES:
                    gate = GateSettings(mode=mode, top_k=settings.funnel.gate.top_k)
                    (result,) = score_answers([answer.scores], gate)
                    outcome.confidence[mode] = result.confidence
                    if mode == "min":
                        outcome.separability = result.score
            outcomes.append(outcome)
    return outcomes, seconds / max(1, len(held_out))


@dataclass
class RunFigures:
    jobs_per_s: float
    seconds: float
    accuracy: float
    beta: float | None
    alpha: float | None
    small_share: float
    answers: dict[str, tuple[str | None, Any]]  # item id -> (final answer, trajectory)


def embedded_run(
    models: Models, manifest: Path, settings: Settings, database_url: str
) -> RunFigures:
    """Annotate the held-out manifest with the embedded runner; read back the answers."""

    sessions = open_store(database_url)
    rows = read_source(manifest)
    batch_id = submit_corpus(
        sessions, rows, source=str(manifest), name="synth-report", settings=settings
    ).batch_id
    result = EmbeddedRunner(sessions, models, settings).run(batch_id, poll_s=0.2)
    with sessions() as session:
        scored, correct = batch_accuracy(session, batch_id)
        query = select(BatchItem.item_id, Job.final_answer, Job.trajectory).join(
            Job, Job.id == BatchItem.job_id
        )
        answers = {
            item_id: (answer, trajectory) for item_id, answer, trajectory in session.execute(query)
        }
    sessions.close()
    counts = result.counts
    return RunFigures(
        jobs_per_s=result.finished_now / result.seconds if result.seconds else 0.0,
        seconds=result.seconds,
        accuracy=correct / scored if scored else 0.0,
        beta=counts.beta,
        alpha=counts.alpha,
        small_share=counts.small_share,
        answers=answers,
    )


def mark_agent(outcomes: list[ItemOutcome], baseline: RunFigures) -> None:
    for outcome in outcomes:
        answer, trajectory = baseline.answers.get(outcome.item.id, (None, None))
        outcome.agent_correct = is_correct(answer, outcome.item.answer, outcome.item.options)
        if outcome.item.difficulty == "hard":
            steps = (trajectory or {}).get("steps") or []
            first_box = steps[0].get("box_original") if steps else None
            outcome.zoom_on_target = first_box == list(outcome.item.cell)


def _accepted(outcome: ItemOutcome, mode: GateMode, tau: float) -> bool:
    """Would the gate (``mode``, ``tau``) accept this item's small answer? None: no."""
    confidence = outcome.confidence.get(mode)
    return confidence is not None and accepts(confidence, tau)


def share(values: Sequence[bool]) -> float:
    return sum(values) / len(values) if values else float("nan")


def auc(higher: Sequence[float], lower: Sequence[float]) -> float:
    """The chance that a draw from ``higher`` beats one from ``lower`` (ties count half)."""
    if not higher or not lower:
        return float("nan")
    wins = sum((up > down) + 0.5 * (up == down) for up in higher for down in lower)
    return wins / (len(higher) * len(lower))


def sweep(
    outcomes: list[ItemOutcome], fast_s: float, agent_s: float, taus: Sequence[float]
) -> list[dict[str, float]]:
    """Funnel accuracy and speedup per tau (min gate), from per-item outcomes and costs."""
    rows = []
    for tau in taus:
        accepted = [o.screen_tool_free and _accepted(o, "min", tau) for o in outcomes]
        correct = [
            o.small_correct if a else o.agent_correct
            for o, a in zip(outcomes, accepted, strict=True)
        ]
        funnel_s = fast_s + (1 - share(accepted)) * agent_s
        rows.append(
            {
                "tau": tau,
                "accuracy": share(correct),
                "accepted": share(accepted),
                "speedup": agent_s / funnel_s if funnel_s else 0.0,
            }
        )
    return rows


def plot(rows: list[dict[str, float]], agent_only: float, path: Path) -> None:
    taus = [row["tau"] for row in rows]
    figure = Figure(figsize=(7, 4.2))  # (no pyplot: no backend, no global state)
    accuracy_axis = figure.subplots()
    accuracy_axis.plot(
        taus,
        [100 * row["accuracy"] for row in rows],
        "o-",
        color="tab:blue",
        label="funnel accuracy",
    )
    accuracy_axis.axhline(
        100 * agent_only, color="tab:blue", linestyle=":", label="agent-only accuracy"
    )
    accuracy_axis.set_xlabel("gate threshold tau (min aggregation)")
    accuracy_axis.set_ylabel("accuracy %", color="tab:blue")
    speed_axis = accuracy_axis.twinx()
    speed_axis.plot(
        taus, [row["speedup"] for row in rows], "s--", color="tab:red", label="speedup (est.)"
    )
    speed_axis.set_ylabel("speedup over agent-only (x)", color="tab:red")
    figure.legend(loc="lower left", bbox_to_anchor=(0.1, 0.15))
    accuracy_axis.set_title("SpecEyes-Synth: accuracy and speedup against tau")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def run_report(
    models: Models,
    settings: Settings,
    *,
    count: int,
    seed: int,
    plot_path: Path,
    on_log: Callable[[str], None] = print,
) -> dict[str, Any]:
    held_out = list(items(count, seed))
    on_log(
        f"held-out set: {count} items (seed {seed}), "
        f"{sum(i.difficulty == 'hard' for i in held_out)} hard"
    )
    outcomes, fast_s = direct_passes(models, held_out, settings)
    with tempfile.TemporaryDirectory() as scratch:
        manifest = write_manifest(held_out, Path(scratch) / "corpus")
        funnel = embedded_run(models, manifest, settings, f"sqlite:///{scratch}/funnel.db")
        base_settings = settings.replace(baseline=True)
        baseline = embedded_run(models, manifest, base_settings, f"sqlite:///{scratch}/base.db")
    mark_agent(outcomes, baseline)
    return summarise(outcomes, funnel, baseline, fast_s, plot_path, settings.funnel.gate.threshold)


def summarise(
    outcomes: list[ItemOutcome],
    funnel: RunFigures,
    baseline: RunFigures,
    fast_s: float,
    plot_path: Path,
    funnel_tau: float,
) -> dict[str, Any]:
    """The report's figures; ``funnel_tau``: the funnel run's gate threshold."""
    easy = [o for o in outcomes if o.item.difficulty == "easy"]
    hard = [o for o in outcomes if o.item.difficulty == "hard"]
    gate_table = []
    for mode in MODES:
        for tau in TAUS:
            accepted = [o for o in outcomes if _accepted(o, mode, tau)]
            rejected = [o for o in outcomes if not _accepted(o, mode, tau)]
            gate_table.append(
                {
                    "mode": mode,
                    "tau": tau,
                    "accepted": len(accepted),
                    "rejected": len(rejected),
                    "accepted_accuracy": share([o.small_correct for o in accepted]),
                    "rejected_accuracy": share([o.small_correct for o in rejected]),
                }
            )
    agent_s = 1 / baseline.jobs_per_s if baseline.jobs_per_s else 0.0
    rows = sweep(
        outcomes, fast_s, agent_s, [0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999]
    )
    plot(rows, baseline.accuracy, plot_path)
    return {
        "items": len(outcomes),
        "small_only_accuracy": {
            "all": share([o.small_correct for o in outcomes]),
            "easy": share([o.small_correct for o in easy]),
            "hard": share([o.small_correct for o in hard]),
        },
        "separability_mean": {
            "easy": sum(o.separability for o in easy) / max(1, len(easy)),
            "hard": sum(o.separability for o in hard) / max(1, len(hard)),
            "auc_easy_over_hard": auc(
                [o.separability for o in easy], [o.separability for o in hard]
            ),
        },
        "screen_agreement": share(
            [o.screen_tool_free == (o.item.difficulty == "easy") for o in outcomes]
        ),
        "agent_only": {
            "accuracy": baseline.accuracy,
            "jobs_per_s": baseline.jobs_per_s,
            "easy": share([o.agent_correct for o in easy]),
            "hard": share([o.agent_correct for o in hard]),
            "choice": share([o.agent_correct for o in outcomes if o.item.kind == "choice"]),
            "yesno": share([o.agent_correct for o in outcomes if o.item.kind == "yesno"]),
            "zoom_on_target_hard": share([bool(o.zoom_on_target) for o in hard]),
        },
        "funnel": {
            "tau": funnel_tau,
            "accuracy": funnel.accuracy,
            "jobs_per_s": funnel.jobs_per_s,
            "beta": funnel.beta,
            "alpha": funnel.alpha,
            "small_share": funnel.small_share,
            "speedup": funnel.jobs_per_s / baseline.jobs_per_s if baseline.jobs_per_s else None,
        },
        "fast_stage_s_per_job": fast_s,
        "gate_table": gate_table,
        "tau_sweep": rows,
        "plot": str(plot_path),
    }


def format_report(report: dict[str, Any]) -> str:
    small, agent, funnel = report["small_only_accuracy"], report["agent_only"], report["funnel"]
    funnel_label = f"funnel (tau {funnel['tau']:g})"
    separability = report["separability_mean"]
    lines = [
        f"items                {report['items']}",
        f"small only           {small['all']:.1%} "
        f"(easy {small['easy']:.1%}, hard {small['hard']:.1%})",
        f"separability S       easy {separability['easy']:.2f}, hard {separability['hard']:.2f} "
        f"(AUC easy > hard {separability['auc_easy_over_hard']:.2f})",
        f"screen agreement     {report['screen_agreement']:.1%} (yes = hard, no = easy)",
        f"agent only           {agent['accuracy']:.1%} "
        f"(easy {agent['easy']:.1%}, hard {agent['hard']:.1%}; "
        f"choice {agent['choice']:.1%}, yes/no {agent['yesno']:.1%}), "
        f"zoom on target {agent['zoom_on_target_hard']:.1%} of hard, "
        f"{agent['jobs_per_s']:.2f} jobs/s",
        f"{funnel_label:<21}{funnel['accuracy']:.1%}, "
        f"{funnel['jobs_per_s']:.2f} jobs/s = "
        f"{funnel['speedup']:.2f}x agent-only; beta {funnel['beta'] or 0:.2f}, "
        f"alpha {funnel['alpha'] or 0:.2f}, small model answered {funnel['small_share']:.1%}",
        "",
        "gate      tau   accepted  acc.acc  rejected  rej.acc",
    ]
    for row in report["gate_table"]:
        lines.append(
            f"{row['mode']:<9} {row['tau']:.2f}  {row['accepted']:>8}  "
            f"{row['accepted_accuracy']:>7.1%}  {row['rejected']:>8}  "
            f"{row['rejected_accuracy']:>7.1%}"
        )
    lines += [
        "",
        "tau sweep (min gate; estimated from per-item outcomes and measured costs)",
        "  tau    accepted  accuracy  speedup",
    ]
    for row in report["tau_sweep"]:
        lines.append(
            f"  {row['tau']:<6} {row['accepted']:>8.1%}  {row['accuracy']:>8.1%}  "
            f"{row['speedup']:>6.2f}x"
        )
    lines.append(f"plot: {report['plot']}")
    return "\n".join(lines)


def save(report: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(report, indent=2, default=str))
