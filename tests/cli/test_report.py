"""``speceyes report``: the paper's table from a funnel batch and its baseline."""

from __future__ import annotations

import json
import re
from pathlib import Path

from sqlalchemy import select

from cli.main import main
from common.contracts import DeferReason, JobStatus
from common.store.db import open_store
from common.store.tables import Batch, Job
from tests.helpers.benchmarks import write_pope
from tests.helpers.images import write_images


def test_the_report_puts_accuracy_and_speedup_per_split(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("SPECEYES_UPLOAD_DIR", str(tmp_path / "uploads"))
    monkeypatch.setenv("SPECEYES_SCRIPTED__AGENT_STEP_S", "0.02")
    source = tmp_path / "POPE"
    write_pope(source / "Full" / "random-00000-of-00001.parquet")
    db = f"sqlite:///{tmp_path / 's.db'}"
    common = ["--backend", "scripted", "--db", db, "--no-progress"]
    assert main(["annotate", str(source), *common, "--name", "funnel"]) == 0
    assert main(["annotate", str(source), *common, "--name", "base", "--baseline"]) == 0
    assert main(["annotate", str(source), *common, "--name", "sr", "--method", "specreason"]) == 0
    capsys.readouterr()

    assert main(["report", "funnel", "sr", "--baseline", "base", "--db", db, "--markdown"]) == 0

    printed = capsys.readouterr().out
    assert "| | pope/random | avg |" in printed.replace("|  |", "| |")
    # scripted answers are "A": wrong for every yes/no row, under the reference's rules
    assert "| agent alone | 0.00 | 0.00 |" in printed
    # how each line counts failed rows: none failed here
    assert "by the reference's rules and judge: 0 failed scored on the text it would" in printed
    lines = printed.splitlines()
    for name in ("SpecEyes", "SpecReason"):  # three rows: each with accuracy / speedup
        row = next(line for line in lines if line.startswith(f"| {name} |"))
        assert re.fullmatch(rf"\| {name} \| 0\.00/\d+\.\d\d \| 0\.00/\d+\.\d\d \|", row)
    assert "| SpecEyes | 1.00/1.00 |" in printed  # beta / alpha: all tool-free, all accepted
    assert "| SpecReason | - |" in printed  # (no funnel)
    # the small model's share: every answer (SpecEyes), every kept step (SpecReason: the
    # scripted large model scores each proposal 9)
    share = lines[lines.index(next(line for line in lines if "small model's share" in line)) :]
    assert "| SpecEyes | 100.00 | 100.00 |" in share and "| SpecReason | 100.00 | 100.00 |" in share
    assert "| agent alone | 0.00 | 0.00 |" in share
    # tokens per item, as the reference counts them: none kept for SpecEyes' small answers
    tokens = share[share.index(next(line for line in share if "tokens per item" in line)) :]
    assert "| SpecEyes | - | - |" in tokens
    assert re.search(r"\| SpecReason \| \d+\.\d\d \| \d+\.\d\d \|", "\n".join(tokens))

    # a line carries the method its batches ran, whatever it is labelled: the funnel's
    # line labelled as SpecReason's still has its beta / alpha, SpecReason's none
    assert main(["report", "funnel", "sr", "--label", "SpecReason", "--db", db, "--markdown"]) == 0
    printed = capsys.readouterr().out
    funnel = printed[printed.index("beta / alpha") : printed.index("small model's share")]
    rows = [line for line in funnel.splitlines() if line.startswith("| SpecReason |")]
    assert rows == ["| SpecReason | 1.00/1.00 |  |", "| SpecReason | - |  |"], funnel


def test_specreason_jobs_skip_phases_one_to_three_and_record_each_decision(tmp_path: Path):
    source = tmp_path / "POPE"
    write_pope(source / "Full" / "random-00000-of-00001.parquet")
    db = f"sqlite:///{tmp_path / 's.db'}"
    common = ["--backend", "scripted", "--db", db, "--no-progress"]
    assert main(["annotate", str(source), *common, "--method", "specreason"]) == 0

    with open_store(db, create=False)() as session:
        jobs = session.scalars(select(Job)).all()
    assert jobs and all(job.status == JobStatus.DONE for job in jobs)
    for job in jobs:
        assert job.defer_reason == DeferReason.SPECREASON
        assert job.fast_started_at is None and job.screen_needs_tools is None  # no phase I-III
        (step,) = job.trace_steps
        assert (step["proposer"], step["score"], step["accepted"]) == ("small", 9, True)


def test_specreason_is_no_baseline_or_calibration_run(tmp_path: Path, capsys):
    db = f"sqlite:///{tmp_path / 's.db'}"
    code = main(["annotate", str(tmp_path), "--method", "specreason", "--baseline", "--db", db])
    assert code != 0
    assert "method 'specreason' runs no funnel" in capsys.readouterr().err


def test_a_batch_with_known_answers_that_is_no_benchmark_is_reported(tmp_path: Path, capsys):
    """As `make demo`'s batch: a manifest with an "answer" column. Its rows are one column
    named after it, scored by our rules, and the report says so."""
    write_images(tmp_path / "imgs", 4)
    rows = [
        {"image": f"imgs/img00{i}.png", "question": "Q?", "options": ["a", "b"], "answer": answer}
        for i, answer in enumerate(["a", "a", "b", "A"])
    ]
    (tmp_path / "imgs" / "broken.png").write_bytes(b"not an image")
    rows.append(
        {"image": "imgs/broken.png", "question": "Q?", "options": ["a", "b"], "answer": "a"}
    )
    manifest = tmp_path / "answers.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    db = f"sqlite:///{tmp_path / 's.db'}"
    main(["annotate", str(manifest), "--backend", "scripted", "--db", db, "--no-progress"])
    capsys.readouterr()
    assert main(["report", "answers", "--db", db]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("accuracy % (our rules: no benchmark rows)\n")
    header, funnel = printed.splitlines()[1:3]
    assert header.split() == ["answers.jsonl", "avg"]
    # scripted answers A: 3 of 5 right, the failed row wrong (our rules), as annotate says
    assert funnel.split() == ["SpecEyes", "60.00", "60.00"]
    assert (
        "SpecEyes     answers.jsonl: 5 rows with a known answer (1 failed), by our rules "
        "(no benchmark: the reference has no rules for these)"
    ) in printed


def test_a_batch_without_known_answers_reports_what_needs_none(tmp_path: Path, capsys):
    """A folder of photos and one question: nothing to score, but beta, alpha, the
    accepted share and the stages' seconds need no labels."""
    write_images(tmp_path / "photos", 4)
    db = f"sqlite:///{tmp_path / 's.db'}"
    flags = ["--backend", "scripted", "--db", db, "--no-progress"]
    main(["annotate", str(tmp_path / "photos"), "-q", "Is there a dog?", *flags])
    capsys.readouterr()
    assert main(["report", "photos", "--db", db]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("no rows with a known answer to score: the funnel")
    header, row = printed.splitlines()[2:4]
    assert header.split()[:3] == ["batch", "jobs", "finished"]
    name, jobs, finished, beta, alpha, accepted, fast_s, _ = row.split()
    assert (name, jobs, finished) == ("photos", "4", "4")
    assert 0 <= float(beta) <= 1 and 0 <= float(alpha) <= 1 and float(fast_s) > 0
    assert 0 <= float(accepted) <= 100


def test_non_benchmark_columns_never_collide_and_the_user_keys_them(
    tmp_path: Path, capsys, monkeypatch
):
    """Two API batches share the default name "api": each keeps a column of its own. A
    baseline of another name lands in the funnel's column when --column keys both, so a
    corpus of no benchmark gets its speedup."""
    monkeypatch.setenv("SPECEYES_SCRIPTED__AGENT_STEP_S", "0.01")
    write_images(tmp_path / "imgs", 4)
    for name, answer in (("a", "A"), ("b", "B")):
        rows = [
            {"image": f"imgs/img00{i}.png", "question": f"{name}?", "answer": answer}
            for i in range(4)
        ]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    db = f"sqlite:///{tmp_path / 's.db'}"
    flags = ["--backend", "scripted", "--db", db, "--no-progress"]
    for name in ("a", "b"):
        assert main(["annotate", str(tmp_path / f"{name}.jsonl"), "--name", "api", *flags]) == 0
    assert (
        main(["annotate", str(tmp_path / "a.jsonl"), "--name", "alone", "--baseline", *flags]) == 0
    )
    sessions = open_store(db, create=False)
    with sessions() as session:
        first, second = (
            session.scalar(
                select(Batch.id).where(Batch.source.endswith(f"{name}.jsonl"), Batch.name == "api")
            )
            for name in ("a", "b")
        )
    sessions.close()
    capsys.readouterr()

    assert main(["report", first, second, "--db", db]) == 0
    header = capsys.readouterr().out.splitlines()[1].split()
    assert sorted(header[:2]) == sorted([f"api:{first[-8:]}", f"api:{second[-8:]}"])

    keyed = ["--column", f"{first}=photos", "--column", "alone=photos"]
    assert main(["report", first, "--baseline", "alone", *keyed, "--db", db]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["photos", "avg"]
    funnel = next(line for line in lines if line.startswith("SpecEyes"))
    assert re.search(r"SpecEyes\s+\d+\.\d\d/\d+\.\d\d", funnel), lines  # accuracy / speedup

    assert main(["report", first, "--column", "photos", "--db", db]) == 2  # (no BATCH=)
