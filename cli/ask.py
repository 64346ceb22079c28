"""``speceyes ask``: one image and question through the whole funnel, explained."""

from __future__ import annotations

import argparse
import json
import uuid
from typing import TYPE_CHECKING, Any, cast

from cli.options import add_funnel_flags, add_model_flags, settings_from_args
from common.backends import check_models, load_models
from common.contracts import Accepted, AnsweredBy, DeferReason, Deferred, Failed, JobStatus
from common.limits import check_query
from common.pipeline.funnel import prepare_query, run_agent_stage, run_fast_stage
from common.sandbox import require_code_sandbox

if TYPE_CHECKING:
    from common.agents.trajectory import AgentStep
    from common.backends.base import Generation, VisionLanguageModel
    from common.chat import Conversation


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run one query through screening, speculation, the gate and, when "
        "deferred, the agent loop, and show what each phase decided."
    )
    parser.add_argument("image", help="image file")
    parser.add_argument("--question", "-q", required=True, help="the question")
    parser.add_argument(
        "--options", nargs="+", metavar="OPTION", help="multiple-choice options (A, B, ...)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="also print the exact text each phase sent (the chat template's output; each "
        "image stands as its vision tokens): what the models were asked",
    )
    add_model_flags(parser)
    add_funnel_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    check_query(args.question, args.options, settings.requests)
    require_code_sandbox(settings)
    check_models(settings)
    job_id = uuid.uuid4().hex
    query = prepare_query(job_id, args.image, args.question, args.options, settings.images)
    if isinstance(query, Failed):
        _report(
            {"status": JobStatus.FAILED, "error_code": query.code, "error": query.message},
            args.json,
        )
        return 1
    models = load_models(settings)
    recorder, proposer = _Recorder(models.large), _Recorder(models.small)
    sent: dict[str, Any] = {}
    specreason = settings.funnel.method == "specreason"
    if args.explain:
        if not specreason:
            sent["screen"] = models.large.render(models.large.protocol.screen_query(query))
            sent["speculate"] = models.small.render(models.small.protocol.speculate_query(query))
        models.large = cast("VisionLanguageModel", recorder)
        models.small = cast("VisionLanguageModel", proposer)
    report: dict[str, Any]
    if specreason:  # no funnel: SpecReason's rounds from the start
        outcome: Accepted | Deferred | Failed = Deferred(job_id, DeferReason.SPECREASON)
        report = {"method": f"specreason, score threshold {settings.funnel.specreason_threshold}"}
    else:
        (outcome,) = run_fast_stage(
            [query],
            large=models.large,
            small=models.small,
            settings=settings.funnel,
            limits=settings.agent,
        ).outcomes
        gate = settings.funnel.gate
        report = {"gate": f"{gate.mode}, K={gate.top_k}, tau={gate.threshold}"}
    if getattr(outcome, "screen", None) is None:  # (no screen ran: nothing sent for one)
        sent.pop("screen", None)
    if not isinstance(outcome, Accepted) and getattr(outcome, "small_answer", None) is None:
        sent.pop("speculate", None)  # the screen sent it to the agent: no speculation
    if isinstance(outcome, Accepted):
        report |= {
            "status": JobStatus.DONE,
            "answered_by": AnsweredBy.SMALL,
            "answer": outcome.answer,
            "confidence": outcome.confidence,
            "screen": outcome.screen.raw_text if outcome.screen else None,
        }
        _report(report | _sent(sent, recorder, proposer, args.explain), args.json)
        return 0
    assert isinstance(outcome, Deferred)
    report |= {
        "deferred": outcome.reason,
        "small_answer": outcome.small_answer,
        "confidence": outcome.confidence,
        "screen": outcome.screen.raw_text if outcome.screen else None,
    }
    pair = (models.small, settings.funnel.specreason_threshold) if specreason else None
    agent = run_agent_stage(query, models.large, settings.agent, specreason=pair)
    report |= {
        "answered_by": AnsweredBy.LARGE,
        "steps": [_step(step) for step in agent.trajectory.steps],
    }
    report |= _sent(sent, recorder, proposer, args.explain)
    if agent.answer is None:
        report |= {"status": JobStatus.FAILED, "error_code": agent.error_code, "error": agent.error}
        _report(report, args.json)
        return 1
    report |= {"status": JobStatus.DONE, "answer": agent.answer}
    _report(report, args.json)
    return 0


class _Recorder:
    """The agent model, keeping the exact text of every agent step it is sent."""

    def __init__(self, model: VisionLanguageModel) -> None:
        self._model = model
        self.sent: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def generate(self, conversation: Conversation, **kwargs: Any) -> Generation:
        self.sent.append(self._model.render(conversation.messages, conversation.continue_cut))
        return self._model.generate(conversation, **kwargs)


def _sent(
    sent: dict[str, Any], recorder: _Recorder, proposer: _Recorder, explain: bool
) -> dict[str, Any]:
    """What the models were sent, for the report (``--explain``): the large model's agent
    steps (SpecReason: its scoring and correcting calls), the small model's proposals."""
    if not explain:
        return {}
    more = {"agent": recorder.sent} if recorder.sent else {}
    if proposer.sent:
        more["proposals"] = proposer.sent
    return {"sent": {**sent, **more}}


def _step(step: AgentStep) -> dict[str, Any]:
    """One step as the report shows it (SpecReason's: who wrote it, its score)."""
    shown: dict[str, Any] = {
        "text": step.text,
        "box": step.box_original,
        "observation": step.observation,
    }
    if step.proposer is not None:
        shown |= {"proposer": step.proposer, "score": step.score, "accepted": step.accepted}
    return shown


def _report(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, indent=2))
        return
    sent = report.pop("sent", None)
    for key, value in report.items():
        if key == "steps":
            for index, step in enumerate(value):
                text = step["text"] if len(step["text"]) <= 160 else step["text"][:157] + "..."
                print(f"  step {index + 1}: {text!r}")
                if "proposer" in step:
                    verdict = "kept" if step["accepted"] else "rejected, the large model wrote it"
                    print(f"          small model's step scored {step['score']}: {verdict}")
                print(f"          -> {step['observation'] or 'answer'}")
            continue
        print(f"{key:<12} {value}")
    for phase, texts in (sent or {}).items():
        for index, text in enumerate(texts if isinstance(texts, list) else [texts]):
            step = f", step {index + 1}" if isinstance(texts, list) else ""
            print(f"--- sent ({phase}{step}) ---\n{text}")
