"""Calibration runs keep what replaying a gate needs, and a replayed gate decides exactly
as the live one did."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from sqlalchemy import select

from common.backends import Models
from common.config import GateSettings, Settings
from common.evaluation.calibration import replay
from common.pipeline.gate import score_answers
from common.pipeline.runner import EmbeddedRunner
from common.pipeline.submit import submit_corpus
from common.scores import TokenScores, decode, encode
from common.sources.corpus import read_source
from common.store.db import open_store
from common.store.tables import BatchItem, Job
from tests.helpers.images import write_images


def test_the_record_is_exact_float32():
    rng = random.Random(3)
    rows = [sorted((rng.uniform(-20, 30) for _ in range(128)), reverse=True) for _ in range(3)]
    import torch

    exact = torch.tensor(rows, dtype=torch.float32).tolist()  # what a backend hands over
    scores = TokenScores(exact, torch.tensor([31.5, 30.25, 29.0]).tolist())
    again = decode(encode(scores))
    assert again == scores
    gate = GateSettings(top_k=64, threshold=0.5)
    assert score_answers([again], gate) == score_answers([scores], gate)


def run(tmp_path: Path, name: str, models: Models, **settings) -> dict[str, Job]:
    config = Settings(
        small_model="tiny",
        large_model="tiny",
        screener="none",
        fast_batch_size=4,
        agent_max_steps=1,
        agent_max_new_tokens=8,
        **settings,
    )
    sessions = open_store(f"sqlite:///{tmp_path / name}.db")
    rows = read_source(tmp_path / "corpus", "What is it?")
    batch = submit_corpus(sessions, rows, source="c", name=name, settings=config).batch_id
    EmbeddedRunner(sessions, models, config).run(batch, poll_s=0.05)
    with sessions() as session:
        query = select(BatchItem.item_id, Job).join(Job, Job.id == BatchItem.job_id)
        jobs = {item_id: job for item_id, job in session.execute(query)}
    sessions.close()
    return jobs


def test_a_replayed_gate_decides_exactly_as_the_live_run(tmp_path, tiny_large, tiny_small):
    write_images(tmp_path / "corpus", 6, size=(96, 80))
    models = Models(tiny_large, tiny_small)
    calibration = run(tmp_path, "calibration", models, calibrate=True)
    assert all(job.replay and job.defer_reason == "calibration" for job in calibration.values())
    assert all(job.answered_by in ("large", None) for job in calibration.values())
    ids = sorted(calibration)
    confidences = sorted(job.confidence or 0.0 for job in calibration.values())
    tau = (confidences[2] + confidences[3]) / 2  # half above, half below, far from both
    live = run(tmp_path, "live", models, gate_threshold=tau)

    replayed = replay(
        [calibration[i].replay or "" for i in ids],
        GateSettings(mode="min", top_k=64, threshold=tau),
    )

    accepted_live = [live[i].answered_by == "small" for i in ids]
    assert [r.accepted for r in replayed] == accepted_live and 0 < sum(accepted_live) < 6
    # the gate replayed from the record is the gate the calibration run computed, exactly;
    # the live run's own logits agree to float rounding (two threads share the CPU)
    assert [r.confidence for r in replayed] == [calibration[i].confidence for i in ids]
    assert [r.confidence for r in replayed] == pytest.approx(
        [live[i].confidence for i in ids], rel=1e-6
    )
    with pytest.raises(ValueError, match="more logits"):
        replay(
            [calibration[ids[0]].replay or ""], GateSettings(mode="min", top_k=256, threshold=tau)
        )
