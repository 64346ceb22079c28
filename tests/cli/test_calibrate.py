"""``speceyes calibrate`` on a labelled batch, and ``--calibration FILE`` taking its pick."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cli.main import build_parser, main
from cli.options import settings_from_args
from common.config import GateSettings
from common.contracts import Accepted, DeferReason, Deferred, Stage
from common.store import claims, new_jobs, submission
from common.store.analytics import STRICT_COUNTS
from common.store.db import open_store
from tests.helpers.images import write_images


def labelled_batch(db: str, rows: list[tuple[float, bool]]) -> str:
    """A batch whose small answers had these (confidence, right) pairs."""
    sessions = open_store(db)
    items = [
        new_jobs.NewItem(
            i, f"r{i}", "Q?", None, f"/img/{i}.png", image_hash=f"h{i}", expected="yes"
        )
        for i in range(len(rows))
    ]
    with sessions.begin() as session:
        batch, _ = submission.get_or_create_batch(
            session, key="k", name="cal", source="s", config={}
        )
        submission.submit_items(session, batch, items, "cfg")
        tickets = {t.image_hash: t.job_id for t in claims.claim(session, Stage.FAST, 10_000)}
        outcomes = []
        for i, (confidence, right) in enumerate(rows):
            answer, job_id = "yes" if right else "no", tickets[f"h{i}"]
            outcomes.append(
                Accepted(job_id, answer, confidence, [], None)
                if confidence > 0.98
                else Deferred(job_id, DeferReason.LOW_CONFIDENCE, None, answer, confidence)
            )
        claims.record_fast(session, outcomes, GateSettings())
        batch_id = batch.id
    sessions.close()
    return batch_id


def test_calibrate_picks_a_certified_tau_and_annotate_takes_it(tmp_path: Path, capsys):
    db = f"sqlite:///{tmp_path / 's.db'}"
    rows = [(0.995, True)] * 300 + [(0.96, True)] * 199 + [(0.96, False)] + [(0.8, False)] * 60
    labelled_batch(db, rows)
    out = tmp_path / "gate.json"
    assert main(["calibrate", "cal", "--db", db, "--max-error", "0.02", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "certified" in printed and "stops the walk" in printed
    record = json.loads(out.read_text())
    # 1 wrong in 500 accepted certifies every tau that accepts no 0.8 row (accept iff
    # confidence > tau: tau 0.8 still leaves them out); 0.79 takes 60 wrong ones and stops
    assert record["gate"] == {"mode": "min", "top_k": 64, "threshold": 0.8}
    assert (record["accepted"], record["wrong"]) == (500, 1)
    argv = ["annotate", "x", "--calibration", str(out)]
    args = build_parser(argv).parse_args(argv)
    assert settings_from_args(args).funnel.gate == GateSettings(mode="min", top_k=64, threshold=0.8)
    argv += ["--threshold", "0.9"]
    args = build_parser(argv).parse_args(argv)
    assert settings_from_args(args).funnel.gate.threshold == 0.9  # an explicit flag wins


def test_calibrate_says_plainly_when_no_tau_meets_the_target(tmp_path: Path, capsys):
    db = f"sqlite:///{tmp_path / 's.db'}"
    labelled_batch(db, [(0.999, True)] * 100 + [(0.999, False)] * 10)
    assert main(["calibrate", "cal", "--db", db, "--max-error", "0.02"]) == 1
    assert "no tau keeps the error" in capsys.readouterr().out


def test_a_calibration_run_is_swept_without_a_model(tmp_path: Path, capsys):
    paths = write_images(tmp_path / "c", 6)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "".join(
            json.dumps({"image": str(p), "question": "Q?", "answer": "A" if i % 3 else "B"}) + "\n"
            for i, p in enumerate(paths)
        )
    )
    db = f"sqlite:///{tmp_path / 's.db'}"
    assert (
        main(
            [
                "annotate",
                str(manifest),
                "--backend",
                "scripted",
                "--calibrate",
                "--db",
                db,
                "--no-progress",
                "--name",
                "cal",
            ]
        )
        == 0
    )
    out = tmp_path / "sweep.json"
    capsys.readouterr()
    assert main(["calibrate", "cal", "--json", str(out), "--db", db]) == 0
    rows = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert len(rows) == 4 * 4 * 5 and "6 jobs replayed" in printed
    assert f"accuracy by {STRICT_COUNTS}" in printed  # how a failed row counts
    assert all(row["speedup"] > 0 for row in rows)  # from the run's measured costs
    # the scripted small model and agent both say "A": every accepted answer agrees
    assert {row["agreement"] for row in rows if row["accepted"]} == {1.0}
    # the scripted agent and small model both answer "A": 4 of 6 right whatever the gate
    assert {round(row["accuracy"], 4) for row in rows} == {round(4 / 6, 4)}


def test_one_calibration_run_at_depth_2_reads_depths_0_1_and_2(tmp_path: Path, capsys, monkeypatch):
    """The small model answers "A" at once and "B" after a zoom; four of six rows are
    "B": each depth's accuracy, from one run, in calibrate's sweep and in the report."""
    paths = write_images(tmp_path / "c", 6)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "".join(
            json.dumps({"image": str(p), "question": "Q?", "answer": "A" if i < 2 else "B"}) + "\n"
            for i, p in enumerate(paths)
        )
    )
    call = {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 40, 40]}}
    zoom = f"<think>closer</think><tool_call>{json.dumps(call)}</tool_call>"
    scripts = tmp_path / "scripts.json"
    scripts.write_text(json.dumps({"*": {"zoom_steps": [zoom, "<answer>B</answer>"]}}))
    monkeypatch.setenv("SPECEYES_SCRIPTED__SCRIPTS_FILE", str(scripts))
    db = f"sqlite:///{tmp_path / 's.db'}"
    argv = ["annotate", str(manifest), "--backend", "scripted", "--calibrate", "--db", db]
    argv += ["--speculation-depth", "2", "--no-progress", "--name", "cal"]
    assert main(argv) == 0
    out = tmp_path / "sweep.json"
    capsys.readouterr()
    assert main(["calibrate", "cal", "--json", str(out), "--db", db]) == 0
    printed = capsys.readouterr().out
    assert "speculation in depth, replayed to D=2" in printed
    assert f"accuracy by {STRICT_COUNTS}" in printed[printed.index("speculation in depth") :]
    depths = json.loads(out.read_text())["depths"]
    assert len(depths) == 5 * 5  # D=0, 1 and 2 (each scope) at each tau of the sweep
    accuracy = {(row["depth"], row["scope"]): round(row["accuracy"], 4) for row in depths}
    assert accuracy == {
        (0, "tool_free"): round(2 / 6, 4),
        (1, "tool_free"): round(4 / 6, 4),
        (1, "all"): round(4 / 6, 4),
        (2, "tool_free"): round(4 / 6, 4),
        (2, "all"): round(4 / 6, 4),
    }
    assert main(["report", "cal", "--db", db]) == 0
    printed = capsys.readouterr().out
    table = printed[printed.index("speculation in depth") : printed.index("beta / alpha / acc")]
    assert f"accuracy by {STRICT_COUNTS}" in printed
    cells = [re.split(r"\s{2,}", line.strip()) for line in table.splitlines() if "/" in line]
    rows = {cell[0]: cell[1] for cell in cells if len(cell) > 1}
    assert rows["agent alone"] == "33.33/1.00"
    assert rows["D=0"].startswith("33.33/") and rows["D=1 (all)"].startswith("66.67/")
