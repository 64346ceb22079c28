"""A deterministic stand-in model for tests and throughput experiments.

Each job follows a ``JobScript``: its screen decision, the small model's answer and the
gate confidence its per-token scores will produce, the agent's steps, and the phases in
which the job's calls fail. Scripts are looked up by job id (``Query.job_id`` in batch
calls, ``Conversation.key`` in agent steps); jobs without one follow the ``"*"`` script
if there is one (so a whole corpus can replay chosen agent steps, e.g. Thyme code an
auditor wants to see run through the workers), else ``default(job_id)``.

An optional simulated cost per call (fixed seconds + seconds per item, slept) makes the
funnel's throughput measurable without a model; an agent step's model time
(``Generation.seconds``) is then the cost it was told, not the sleep's overshoot on a
busy machine.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.backends.base import FinishReason, Generation, Speculation, plain_render
from common.chat import Conversation, Message
from common.contracts import Query, ScreenResult
from common.errors import Interrupted, ModelError
from common.images import ResizeRule
from common.protocols import REFERENCE, Protocol, get_protocol
from common.scores import TokenScores, score_for

Phase = str  # "screen" | "speculate" | "zoom" (a step of speculation in depth) | "generate"
# the scripted model's tokens: a tag, a word, or a run of white space
_PIECE = re.compile(r"<[^>]*>|[^<\s]+|\s+")
EVERY_JOB = "*"  # the key of a script every job without its own follows


class ScriptedSettings(BaseSettings):
    """The scripted backend's knobs: a test hook, not a setting of the service (read from
    ``SPECEYES_SCRIPTED__<NAME>``, for tests that start workers in other processes).

    Jobs are drawn deterministically from their id: a share ``tool_free`` is screened
    tool-free, and of those a share ``confident`` passes the gate. Simulated costs are
    slept: a fast-stage call costs ``fast_batch_s`` + ``fast_job_s`` per job (half in
    screening, half in speculation), an agent step ``agent_step_s``, a round of the small
    model's zooms (speculation in depth) ``zoom_step_s``.
    """

    model_config = SettingsConfigDict(env_prefix="SPECEYES_SCRIPTED__", extra="ignore")

    tool_free: float = Field(1.0, ge=0.0, le=1.0)
    confident: float = Field(1.0, ge=0.0, le=1.0)
    fast_batch_s: float = Field(0.0, ge=0.0)
    fast_job_s: float = Field(0.0, ge=0.0)
    agent_step_s: float = Field(0.0, ge=0.0)
    zoom_step_s: float = Field(0.0, ge=0.0)  # a round of the small model's zooms
    scripts_file: Path | None = Field(
        None,
        description="JSON object: job id -> that job's script (JobScript's fields); the key "
        "'*' scripts every other job (e.g. chosen Thyme code for a whole corpus, to replay "
        "an attack through annotate or the workers).",
    )


@dataclass(frozen=True)
class JobScript:
    """What the scripted model does for one job."""

    needs_tools: bool = False
    screen_text: str | None = None  # raw phase-I text; default "yes" / "no"
    answer: str = "A"  # the small model's answer
    confidence: float = 0.999  # the gate confidence its token scores give (min mode)
    agent_steps: tuple[str, ...] | None = None  # agent outputs, step by step (last repeats)
    agent_answer: str = "A"  # used when agent_steps is None: one step that answers
    # SpecReason (common.agents.specreason), round by round (last repeats): the small
    # model's proposals (None: the agent's steps) and the large model's scores of them
    # (None: 9, every proposal kept); its corrections are the agent's steps
    proposals: tuple[str, ...] | None = None
    scores: tuple[int | str, ...] | None = None
    # the small model's turns when it may zoom before the gate (speculation depth >= 1),
    # step by step (last repeats); None: it answers at once, <answer>{answer}</answer>.
    # Every token of them scores ``confidence``.
    zoom_steps: tuple[str, ...] | None = None
    fail: frozenset[Phase] = frozenset()  # phases whose calls raise for this job
    crash: frozenset[Phase] = frozenset()  # phases whose calls kill the process (a segfault)

    @classmethod
    def from_dict(cls, fields: Mapping[str, object]) -> JobScript:
        """A script from JSON: lists become the tuples / sets the fields hold."""
        values = dict(fields)
        for name in ("fail", "crash"):
            values[name] = frozenset(values.get(name) or ())  # type: ignore[call-overload]
        for name in ("agent_steps", "proposals", "scores", "zoom_steps"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])  # type: ignore[arg-type]
        return cls(**values)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        values = asdict(self)
        for name in ("fail", "crash"):
            values[name] = sorted(values[name])
        return values

    def steps(self) -> tuple[str, ...]:
        if self.agent_steps is not None:
            return self.agent_steps
        return (f"<think>scripted</think> <answer>{self.agent_answer}</answer>",)


@dataclass(frozen=True)
class SimulatedCost:
    """Seconds a call takes: ``fixed_s`` per call plus ``per_item_s`` per job in it."""

    fixed_s: float = 0.0
    per_item_s: float = 0.0

    def seconds(self, items: int) -> float:
        return self.fixed_s + self.per_item_s * items

    def spend(self, items: int, stop: threading.Event | None = None) -> None:
        """Take the call's time; as a real model ends at its next token when the process
        stops, a set ``stop`` ends it at once (``Interrupted``)."""
        seconds = self.seconds(items)  # (simulates model time: the work, not a wait)
        if seconds > 0 and (stop or threading.Event()).wait(seconds):
            raise Interrupted("the model stopped generating: the process is stopping")


# a Thyme trajectory for the scripted backend: code that crops (run in the sandbox), then
# the answer
THYME_STEPS = (
    "<think>Zoom in on the centre.</think><code>\n```python\nfrom PIL import Image\n"
    "image = Image.open(image_path)\nwidth, height = image.size\n"
    'processed_path = "/mnt/data/temp_processed_images/centre.png"\n'
    "image.crop((width // 4, height // 4, 3 * width // 4, 3 * height // 4))"
    ".save(processed_path)\nprint(processed_path)\n```\n</code>",
    "<think>Seen.</think><answer>A</answer>",
)


def mixture(
    tool_free: float,
    confident: float,
    *,
    answer: str = "A",
    agent_steps: tuple[str, ...] | None = None,
) -> Callable[[str], JobScript]:
    """Scripts drawn per job id: a share ``tool_free`` screened tool-free, and of those a
    share ``confident`` gated confidently. Deterministic in the job id."""

    def script(job_id: str) -> JobScript:
        digest = hashlib.sha256(job_id.encode()).digest()
        first, second = digest[0] / 256 + digest[1] / 65536, digest[2] / 256 + digest[3] / 65536
        return JobScript(
            needs_tools=first >= tool_free,
            answer=answer,
            confidence=0.999 if second < confident else 0.6,
            agent_answer=answer,
            agent_steps=agent_steps,
        )

    return script


@dataclass
class ScriptedModel:
    """A model that follows scripts; counts its calls and batch sizes for tests."""

    scripts: Mapping[str, JobScript] = field(default_factory=dict)
    default: Callable[[str], JobScript] = field(default=lambda job_id: JobScript())
    costs: Mapping[Phase, SimulatedCost] = field(default_factory=dict)
    name: str = "scripted"
    protocol: Protocol = REFERENCE
    resize_rule: ResizeRule = field(default_factory=ResizeRule)
    # set when the process stops: a call ends at once, as a real model's does
    stop: threading.Event = field(default_factory=threading.Event)
    calls: Counter[Phase] = field(default_factory=Counter, init=False)
    batch_sizes: list[tuple[Phase, int]] = field(default_factory=list, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def script(self, job_id: str) -> JobScript:
        """The job's own script, else the one for every job (``"*"``), else the default."""
        return self.scripts.get(job_id) or self.scripts.get(EVERY_JOB) or self.default(job_id)

    def screen(self, queries: Sequence[Query], *, max_new_tokens: int) -> list[ScreenResult]:
        scripts = self._call("screen", [q.job_id for q in queries])
        screens = []
        for query, s in zip(queries, scripts, strict=True):
            text = s.screen_text or ("yes" if s.needs_tools else "no")
            screens.append(ScreenResult(s.needs_tools, text, _words(query.question), _words(text)))
        return screens

    def speculate(
        self, queries: Sequence[Query], *, max_new_tokens: int, top_k: int
    ) -> list[Speculation]:
        scripts = self._call("speculate", [q.job_id for q in queries])
        return [
            replace(_speculation(s.answer, s.confidence, top_k), prompt_tokens=_words(q.question))
            for q, s in zip(queries, scripts, strict=True)
        ]

    def generate(
        self,
        conversation: Conversation,
        *,
        stop: Sequence[str],
        max_new_tokens: int,
        ignore_eos: bool = False,
    ) -> Generation:
        (script,) = self._call("generate", [conversation.key])
        steps: Sequence[str | int] = script.steps()
        if conversation.purpose == "propose" and script.proposals is not None:
            steps = script.proposals
        elif conversation.purpose == "verify":
            steps = script.scores if script.scores is not None else (9,)
        text = str(steps[min(conversation.generations, len(steps) - 1)])
        ends = [text.find(s) + len(s) for s in stop if s in text]
        said = [part for m in conversation.messages for part in m.content if isinstance(part, str)]
        read = sum(_words(part) for part in said)
        if ends:
            text = text[: min(ends)]
        told = self.costs.get("generate", SimulatedCost()).seconds(1)
        return Generation(
            text,
            "stop" if ends else "eos",
            _words(text),
            prompt_tokens=read,
            seconds=told if told > 0 else None,  # (its model time is what it was told)
        )

    def agent_turns(
        self, conversations: Sequence[Conversation], *, max_new_tokens: int, top_k: int
    ) -> list[Generation]:
        scripts = self._call("zoom", [conversation.key for conversation in conversations])
        generations = []
        for conversation, script in zip(conversations, scripts, strict=True):
            steps = script.zoom_steps or (f"<answer>{script.answer}</answer>",)
            text = steps[min(conversation.generations, len(steps) - 1)]
            ends = [text.find(s) + len(s) for s in self.protocol.agent_stop if s in text]
            finish: FinishReason = "stop" if ends else "eos"
            text = text[: min(ends)] if ends else text
            pieces = tuple(_PIECE.findall(text))[:max_new_tokens]
            if len(pieces) == max_new_tokens and "".join(pieces) != text:
                text, finish = "".join(pieces), "length"
            row = _speculation("x", script.confidence, top_k).scores
            scores = TokenScores(row.top_values * len(pieces), row.log_normalizer * len(pieces))
            generations.append(Generation(text, finish, len(pieces), scores, pieces))
        return generations

    def render(self, chat: Sequence[Message], continue_cut: str | None = None) -> str:
        return plain_render(chat, continue_cut)

    def _call(self, phase: Phase, job_ids: list[str]) -> list[JobScript]:
        with self._lock:
            self.calls[phase] += 1
            self.batch_sizes.append((phase, len(job_ids)))
        self.costs.get(phase, SimulatedCost()).spend(len(job_ids), self.stop)
        scripts = [self.script(job_id) for job_id in job_ids]
        if any(phase in script.crash for script in scripts):
            os._exit(70)  # what a poison input does to a real model server: no cleanup
        failing = [job_id for job_id, s in zip(job_ids, scripts, strict=True) if phase in s.fail]
        if failing:
            raise ModelError(f"scripted {phase} failure for job(s) {', '.join(failing)}")
        return scripts


def _words(text: str) -> int:
    """A stand-in's token count: the words (a real model's tokens are its tokenizer's)."""
    return len(text.split())


def _speculation(answer: str, confidence: float, top_k: int) -> Speculation:
    """An answer whose every token has the separability S that ``confidence`` squashes from.

    The competitors (ranks 2..K) are K-2 copies of v = 1/sqrt(K-2) and one of -sqrt(K-2):
    mean 0, population std 1, so s_t = S. Confidences below about 0.52 cannot be written
    this way (S would fall under v) and come out at that floor.
    """
    tokens = answer.split()
    k = max(3, top_k)
    spread = math.sqrt(k - 2)
    target = score_for(confidence)
    top = max(target, 1 / spread + 1e-3)
    row = [top] + [1 / spread] * (k - 2) + [-spread]
    log_norm = math.log(sum(math.exp(value) for value in row))
    scores = TokenScores([list(row) for _ in tokens], [log_norm] * len(tokens))
    return Speculation(answer, None, scores)


def scripted_from_settings(settings: ScriptedSettings, protocol: str = "auto") -> ScriptedModel:
    """The scripted model the settings describe (shares and simulated costs); its agent
    loop follows ``protocol`` (``auto``: reference; ``thyme``: its trajectories crop in
    the sandbox before they answer)."""
    half_fast = SimulatedCost(settings.fast_batch_s / 2, settings.fast_job_s / 2)
    scripts = {}
    if settings.scripts_file is not None:
        raw = json.loads(settings.scripts_file.read_text())
        scripts = {job_id: JobScript.from_dict(fields) for job_id, fields in raw.items()}
    return ScriptedModel(
        protocol=get_protocol("reference" if protocol == "auto" else protocol),
        scripts=scripts,
        default=mixture(
            settings.tool_free,
            settings.confident,
            agent_steps=THYME_STEPS if protocol == "thyme" else None,
        ),
        costs={
            "screen": half_fast,
            "speculate": half_fast,
            "generate": SimulatedCost(settings.agent_step_s),
            "zoom": SimulatedCost(settings.zoom_step_s),
        },
    )
