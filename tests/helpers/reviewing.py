"""Batches whose jobs are already decided, row by row as a test says: what the review
pages, the results listing and the review queue are tested on."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from PIL import Image

from common.store.tables import Batch, BatchItem, Job

GATE = {"mode": "min", "top_k": None, "threshold": 0.9}

# A DeepEyes trajectory with one zoom: its box on the original image, then an answer.
ZOOM_BOX = [8, 6, 40, 30]


def zoom_trajectory(answer: str, text: str = "<think>look closer</think>") -> dict[str, Any]:
    return {
        "steps": [
            {
                "index": 0,
                "text": text,
                "finish_reason": "stop",
                "new_tokens": 12,
                "generate_seconds": 0.2,
                "tool_call": {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": ZOOM_BOX}},
                "box_model": ZOOM_BOX,
                "box_original": ZOOM_BOX,
                "observation": "zoomed",
            },
            {
                "index": 1,
                "text": f"<answer>{answer}</answer>",
                "finish_reason": "stop",
                "new_tokens": 4,
                "generate_seconds": 0.1,
            },
        ],
        "answer": answer,
        "error_code": None,
        "error": None,
    }


def picture(folder: Path, name: str = "picture.png", size: tuple[int, int] = (64, 48)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    Image.new("RGB", size, (40, 120, 200)).save(path)
    return path


def decided_batch(
    sessions: Any,
    rows: list[dict[str, Any]],
    image: Path,
    *,
    tenant: str | None = None,
    name: str = "decided",
) -> tuple[str, list[str]]:
    """A batch of one job per row, each finished as its dict says: Job columns (status
    "done" unless given, answered_by, final_answer, confidence, ...) and the row's
    ``expected``/``split``. Returns (batch id, job ids in row order)."""
    start = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    batch_id = uuid.uuid4().hex
    job_ids = []
    with sessions.begin() as session:
        session.add(
            Batch(id=batch_id, key=batch_id, name=name, source="tests", config={}, tenant=tenant)
        )
        session.flush()
        for position, spec in enumerate(rows):
            spec = dict(spec)
            expected = spec.pop("expected", None)
            split = spec.pop("split", None)
            job_id = uuid.uuid4().hex
            fields: dict[str, Any] = {
                "status": "done",
                "question": f"question {position}?",
                "image_path": str(image),
                "created_at": start,
                "fast_started_at": start + timedelta(seconds=1),
                "finished_at": start + timedelta(seconds=2 + position),
                "tenant": tenant,
                **spec,
            }
            if fields.get("confidence") is not None:
                fields.setdefault("small_answer", fields.get("final_answer"))
                fields.setdefault("gate", GATE)
                fields.setdefault("gated_at", start + timedelta(seconds=1.5))
            session.add(Job(id=job_id, idempotency_key=job_id, **fields))
            session.flush()
            session.add(
                BatchItem(
                    batch_id=batch_id,
                    position=position,
                    item_id=f"row-{position}",
                    expected=expected,
                    split=split,
                    job_id=job_id,
                )
            )
            job_ids.append(job_id)
    return batch_id, job_ids
