"""A batch as a finished run leaves it, written straight into the store's tables, for
``speceyes bench ui`` (``lab.bench.ui``).

``seed_batch`` uses Core ``insert`` executemany in chunks of ``CHUNK`` rows (a few round
trips per chunk on PostgreSQL), no ORM object per row and no funnel run, so 100,000 jobs
take seconds. One ``random.Random(seed)`` draws every job:

- ~90% done: screened tool-free and accepted by the gate (the small model's answer,
  ~5% of them audited), or deferred (tools needed, or not confident enough) and
  answered by the agent with a DeepEyes trajectory;
- ~5% failed, at the fast stage (the image) or in the agent (its trajectory kept);
- the rest queued, deferred or running;
- V*- and POPE-like questions (options or yes/no) with their known answers on the
  batch items, some answered wrong; a reviewer's answer on ~1% of the finished jobs.

Only ids and keys are uuid4 (so one store holds many seeded batches) and timestamps
follow the clock; everything else depends on ``seed`` alone.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import MISSING, dataclass, fields
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

from PIL import Image
from sqlalchemy import Table, insert, text
from sqlalchemy.orm import Session, sessionmaker

from common.agents.trajectory import UNREADABLE, AgentStep
from common.contracts import AnsweredBy, CancelReason, DeferReason, JobStatus, Priority, Stage
from common.images import content_hash
from common.store.db import is_postgres
from common.store.tables import Batch, BatchItem, Job, utcnow

CHUNK = 5_000  # rows per executemany
GATE = {"mode": "min", "top_k": 64, "threshold": 0.9}  # as the fast stage stores it
THRESHOLD = float(cast(float, GATE["threshold"]))
SPLITS = (
    "pope/random",
    "pope/popular",
    "pope/adversarial",
    "vstar/direct_attributes",
    "vstar/relative_position",
)
OBJECTS = ("car", "umbrella", "dog", "cup", "bicycle", "backpack", "bench", "kite", "clock")
COLOURS = ("red", "blue", "green", "white", "black", "yellow", "orange", "purple")
LETTERS = "ABCD"
FAST_FAILURES = {  # code -> message, as the image checks write them
    "image_missing": "image file not found: {path}",
    "image_error": "cannot identify image file {path}",
    "image_too_many_pixels": "the image has 201,326,592 pixels, more than 100,000,000",
}
AGENT_FAILURES = {
    "step_limit": "no answer after 8 generations",
    "tool_call_invalid": "the tool call cannot be carried out (KeyError: 'bbox_2d')",
    UNREADABLE: "the model's <answer> is empty",
}
STEP = {f.name: f.default for f in fields(AgentStep) if f.default is not MISSING}
IMAGE_SIZE = (640, 480)


@dataclass(frozen=True)
class Question:
    split: str
    item_id: str
    text: str
    options: list[str] | None
    expected: str  # as the benchmark gives it (V*: the option's text)
    right: str  # answers as a model writes them
    wrong: str


def seed_batch(
    sessions: sessionmaker[Session],
    jobs: int,
    *,
    tenant: str | None,
    image_dir: Path,
    seed: int = 0,
) -> str:
    """A batch of ``jobs`` drawn jobs of ``tenant``, written in one transaction; its id.

    Every job points at one 640x480 PNG written into ``image_dir``."""
    image = image_dir / "bench-ui.png"
    Image.new("RGB", IMAGE_SIZE, (200, 40, 40)).save(image)
    draws = _Draws(random.Random(seed), image, content_hash(image.read_bytes()), tenant)
    batch_id = uuid.uuid4().hex
    batch = {
        "id": batch_id,
        "key": uuid.uuid4().hex,
        "name": f"bench-ui-{jobs}",
        "source": str(image_dir),
        "config": {
            "small_model": "Qwen/Qwen3-VL-2B-Instruct",
            "large_model": "ChenShawn/DeepEyes-7B",
            "agent": "deepeyes",
            "gate": GATE,
        },
        "created_at": draws.start,
        "tenant": tenant,
        "audit_alarm": None,
    }
    job_table, item_table = cast(Table, Job.__table__), cast(Table, BatchItem.__table__)
    with sessions.begin() as session:
        connection = session.connection()
        connection.execute(insert(cast(Table, Batch.__table__)), [batch])
        for start in range(0, jobs, CHUNK):
            rows = [
                draws.job(batch_id, position) for position in range(start, min(jobs, start + CHUNK))
            ]
            connection.execute(insert(job_table), [job for job, _ in rows])
            connection.execute(insert(item_table), [item for _, item in rows])
    _analyze(sessions)
    return batch_id


def _analyze(sessions: sessionmaker[Session]) -> None:
    """Refresh the planner's statistics, as a live database's own upkeep does (PostgreSQL's
    autovacuum; SQLite's ``PRAGMA optimize``): a batch written in one go and timed at once
    would otherwise be planned as an empty table (PostgreSQL then joins 100,000 rows to
    find 50)."""
    with sessions.begin() as session:
        if is_postgres(session):
            session.execute(text("ANALYZE jobs"))
            session.execute(text("ANALYZE batch_items"))
        else:
            session.execute(text("ANALYZE"))


class _Draws:
    """Jobs and their batch items, one at a time, each drawn from ``rng`` in order."""

    def __init__(self, rng: random.Random, image: Path, image_hash: str, tenant: str | None):
        self.rng = rng
        self.start = utcnow() - timedelta(hours=3)
        self.blank: dict[str, Any] = {
            column.key: None for column in cast(Table, Job.__table__).columns
        }
        self.blank |= {"image_path": str(image), "image_hash": image_hash, "tenant": tenant}
        self.blank["priority"] = Priority.NORMAL.rank
        self.blank["announces"] = False  # (a batch's jobs: its end is told, not theirs)

    def job(self, batch_id: str, position: int) -> tuple[dict[str, Any], dict[str, Any]]:
        question = self.question(position)
        job_id = uuid.uuid4().hex
        row = self.blank | {
            "id": job_id,
            "idempotency_key": uuid.uuid4().hex,
            "question": question.text,
            "options": question.options,
            "stage": Stage.FAST,
            "attempts": 0,
            "created_at": self.start + timedelta(seconds=position * 0.05),
        }
        share = self.rng.random()
        if share < 0.90:
            self.done(row, question)
        elif share < 0.95:
            self.failed(row, question)
        elif share < 0.965:
            row["status"] = JobStatus.QUEUED
        elif share < 0.97:  # cancelled while it waited
            row |= {
                "status": JobStatus.CANCELLED,
                "error_code": CancelReason.CANCELLED,
                "error_message": "cancelled by its caller",
                "finished_at": row["created_at"] + timedelta(minutes=30),
            }
        elif share < 0.985:
            self.fast_stage(row, question, defer=True)  # (and waits for the agent)
        else:
            self.running(row, question)
        item = {
            "batch_id": batch_id,
            "position": position,
            "item_id": question.item_id,
            "expected": question.expected,
            "split": question.split,
            "category": None,
            "judge_verdict": None,
            "job_id": job_id,
        }
        return row, item

    def question(self, position: int) -> Question:
        rng = self.rng
        split = rng.choice(SPLITS)
        item_id = f"{split.split('/')[1]}/{position}"
        if split.startswith("pope/"):
            yes = rng.random() < 0.5
            expected, wrong = ("yes", "no") if yes else ("no", "yes")
            text = f"Is there a {rng.choice(OBJECTS)} in the image?"
            return Question(split, item_id, text, None, expected, expected, wrong)
        if split == "vstar/direct_attributes":
            options = rng.sample(COLOURS, 4)  # V*: the right option is the first
            text = f"What is the color of the {rng.choice(OBJECTS)}?"
            wrong = rng.choice(LETTERS[1:])
        else:
            near, far = rng.sample(OBJECTS, 2)
            options = ["left", "right"] if rng.random() < 0.5 else ["right", "left"]
            text = f"Is the {rng.choice(COLOURS)} {near} on the left or right side of the {far}?"
            wrong = "B"
        return Question(split, item_id, text, options, options[0], "A", wrong)

    def answer(self, question: Question, right_share: float) -> str:
        return question.right if self.rng.random() < right_share else question.wrong

    def done(self, row: dict[str, Any], question: Question) -> None:
        if self.fast_stage(row, question):
            self.audit(row, question)
        else:
            answer = self.answer(question, 0.8)
            self.agent(row, question, answer=answer)
            row |= {"answered_by": AnsweredBy.LARGE, "final_answer": answer}
        row["status"] = JobStatus.DONE
        self.review(row, question)

    def failed(self, row: dict[str, Any], question: Question) -> None:
        rng = self.rng
        if rng.random() < 0.6:  # the image, found wanting at the fast stage
            code = rng.choice(list(FAST_FAILURES))
            started = self.after(row["created_at"], 0.5, 20.0)
            row |= {"attempts": 1, "fast_started_at": started}
            row["finished_at"] = self.after(started, 0.01, 0.2)
            message = FAST_FAILURES[code].format(path=row["image_path"])
        else:  # the agent's trajectory ended without an answer
            self.fast_stage(row, question, defer=True)
            code = rng.choice(list(AGENT_FAILURES))
            self.agent(row, question, error=code)
            message = AGENT_FAILURES[code]
        row |= {"status": JobStatus.FAILED, "error_code": code, "error_message": message}

    def running(self, row: dict[str, Any], question: Question) -> None:
        row |= {"status": JobStatus.RUNNING, "attempts": 1}
        if self.rng.random() < 0.5:
            row["fast_started_at"] = self.after(row["created_at"], 0.5, 20.0)
            row["worker"] = "fast0@bench:4121:3f9a"
            return
        self.fast_stage(row, question, defer=True)
        row |= {"stage": Stage.AGENT, "attempts": 1, "worker": "slow0@bench:4188:77c2"}
        row["agent_started_at"] = self.after(row["gated_at"], 0.5, 90.0)

    def fast_stage(self, row: dict[str, Any], question: Question, *, defer: bool = False) -> bool:
        """Phases I-III: whether the gate accepted the small model's answer (never, with
        ``defer``); a deferred job is left waiting for the agent."""
        rng = self.rng
        needs_tools = rng.random() < 0.35
        started = self.after(row["created_at"], 0.5, 20.0)
        row |= {"attempts": 1, "fast_started_at": started, "screen_needs_tools": needs_tools}
        row |= {
            "screen_text": "Yes" if needs_tools else "No",
            "gated_at": self.after(started, 0.1, 1.5),
        }
        if needs_tools:
            row |= {"status": JobStatus.DEFERRED, "stage": Stage.AGENT, "attempts": 0}
            row["defer_reason"] = DeferReason.TOOLS_NEEDED
            return False
        confidence = round(rng.betavariate(8.0, 1.2), 6)
        if defer:  # (reflected below tau: a job still waiting was not accepted)
            confidence = min(confidence, round(2 * THRESHOLD - confidence, 6))
        answer = self.answer(question, 0.5 + 0.45 * confidence)
        others = [round(rng.uniform(confidence, 1.0), 6) for _ in range(rng.randint(0, 3))]
        scores = [*others, confidence]  # mode "min": the confidence is the lowest
        rng.shuffle(scores)
        row |= {"small_answer": answer, "confidence": confidence, "token_scores": scores}
        row["gate"] = GATE
        if confidence > THRESHOLD:  # the gate's rule: accept iff confidence > tau
            row |= {"status": JobStatus.DONE, "answered_by": AnsweredBy.SMALL}
            row |= {"final_answer": answer, "finished_at": row["gated_at"]}
            return True
        row |= {"status": JobStatus.DEFERRED, "stage": Stage.AGENT, "attempts": 0}
        row["defer_reason"] = DeferReason.LOW_CONFIDENCE
        return False

    def agent(
        self, row: dict[str, Any], question: Question, *, answer: str = "", error: str = ""
    ) -> None:
        """Phase IV after a deferral: the trajectory, ending in ``answer`` or ``error``."""
        started = self.after(row["gated_at"], 0.5, 90.0)
        trajectory = self.trajectory(question, answer, error)
        spent = sum(step["generate_seconds"] + step["tool_seconds"] for step in trajectory["steps"])
        row |= {"stage": Stage.AGENT, "attempts": 1, "agent_started_at": started}
        row |= {"finished_at": started + timedelta(seconds=spent), "trajectory": trajectory}

    def trajectory(self, question: Question, answer: str, error: str) -> dict[str, Any]:
        rng = self.rng
        zooms = 8 if error == "step_limit" else rng.randint(0, 2)
        steps = [self.zoom(index, question) for index in range(zooms)]
        if error == "tool_call_invalid":
            text = '<think>Zoom in.</think>\n<tool_call>{"name": "image_zoom_in_tool"}</tool_call>'
            steps.append(self.step(len(steps), text, observation=f"ended: {AGENT_FAILURES[error]}"))
        elif error == UNREADABLE:
            steps.append(self.step(len(steps), "<think>I see it now.</think>\n<answer></answer>"))
        elif not error:
            reason = f"The {question.text.split()[-1].rstrip('?')} is clear now."
            steps.append(
                self.step(len(steps), f"<think>{reason}</think>\n<answer>{answer}</answer>")
            )
        message = AGENT_FAILURES.get(error)
        return {
            "steps": steps,
            "answer": answer or None,
            "error_code": error or None,
            "error": message,
        }

    def zoom(self, index: int, question: Question) -> dict[str, Any]:
        rng = self.rng
        width, height = IMAGE_SIZE
        left, top = rng.randrange(0, width - 100), rng.randrange(0, height - 100)
        box = [left, top, left + rng.randrange(40, 100), top + rng.randrange(40, 100)]
        label = question.text.split()[-1].rstrip("?")
        call = {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": box, "label": label}}
        text = f"<think>The {label} is small; zoom in.</think>\n"
        shown = f"{(box[2] - box[0]) * 4}x{(box[3] - box[1]) * 4}"  # the crop, resized up
        return self.step(
            index,
            f"{text}<tool_call>{json.dumps(call)}</tool_call>",
            tool_call=call,
            box_model=[float(edge) for edge in box],
            box_original=box,
            observation=f"zoomed into ({', '.join(map(str, box))}), shown at {shown}",
            tool_seconds=round(rng.uniform(0.005, 0.05), 4),
        )

    def step(self, index: int, text: str, **tool: Any) -> dict[str, Any]:
        """An ``AgentStep`` as ``Trajectory.to_dict`` writes it."""
        generation = {"index": index, "text": text, "finish_reason": "stop"}
        generation["new_tokens"] = self.rng.randint(20, 120)
        generation["generate_seconds"] = round(self.rng.uniform(0.3, 2.5), 3)
        return STEP | generation | tool

    def audit(self, row: dict[str, Any], question: Question) -> None:
        """~5% of accepted answers audited by the agent, which mostly agrees."""
        rng = self.rng
        if rng.random() >= 0.05:
            return
        agrees = rng.random() < 0.9
        other = question.wrong if row["final_answer"] == question.right else question.right
        row |= {"audit_status": "done", "audit_agrees": agrees}
        row["audit_answer"] = row["final_answer"] if agrees else other
        row["audited_at"] = self.after(row["finished_at"], 5.0, 120.0)

    def review(self, row: dict[str, Any], question: Question) -> None:
        """~1% of finished answers reviewed (confirmed or corrected)."""
        if self.rng.random() >= 0.01:
            return
        row["reviewed_answer"] = question.right
        row["reviewer"] = self.rng.choice(("alice", "bob"))
        row["reviewed_at"] = self.after(row["finished_at"], 60.0, 3600.0)

    def after(self, moment: datetime, low: float, high: float) -> datetime:
        return moment + timedelta(seconds=self.rng.uniform(low, high))
