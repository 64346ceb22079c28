"""``speceyes annotate`` on whole corpora: bad input, resume, kill, interrupt, export."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tqdm import tqdm

import cli.follow
from cli.main import main
from tests.helpers.images import png, write_images
from tests.helpers.sandbox import bubblewrap_or_skip
from tests.helpers.serving import SPECEYES
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
SCRIPTED = ["--backend", "scripted"]


def annotate(*args: str) -> int:
    return main(["annotate", *args, "--no-progress"])


def db_rows(db: Path, query: str) -> list[tuple]:
    with sqlite3.connect(db) as connection:
        return connection.execute(query).fetchall()


def test_a_mixed_folder_fails_its_bad_files_alone(tmp_path: Path, capsys):
    folder = tmp_path / "corpus"
    write_images(folder / "nested", 3)
    (folder / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (folder / "empty.png").write_bytes(b"")
    (folder / "text.png").write_text("I am a text file")
    (folder / "notes.txt").write_text("not an image extension: ignored")
    out = tmp_path / "out.jsonl"
    db = tmp_path / "s.db"
    code = annotate(
        str(folder), "-q", "What?", *SCRIPTED, "--db", f"sqlite:///{db}", "--out", str(out)
    )
    printed = capsys.readouterr().out
    assert code == 1  # some jobs failed
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert len(rows) == 6
    assert [rows[f"nested/img00{i}.png"]["status"] for i in range(3)] == ["done"] * 3
    for bad in ("corrupt.jpg", "empty.png", "text.png"):
        assert rows[bad]["status"] == "failed" and rows[bad]["error_code"] == "image_error"
    assert "empty (0 bytes)" in rows["empty.png"]["error"]
    assert "failed       3: image_error 3" in printed
    assert "(speceyes jobs list corpus --status failed: each one's file and reason)" in printed


def test_a_manifest_with_broken_rows_annotates_the_rest(tmp_path: Path, capsys):
    write_images(tmp_path / "imgs", 2)
    lines = [
        json.dumps(
            {"id": "good-1", "image": "imgs/img000.png", "question": "Q1?", "options": ["a", "b"]}
        ),
        "{not json",
        json.dumps({"id": "no-question", "image": "imgs/img001.png"}),
        json.dumps({"id": "missing-image", "image": "imgs/nope.png", "question": "Q?"}),
        json.dumps(
            {"id": "bad-options", "image": "imgs/img001.png", "question": "Q?", "options": "a,b"}
        ),
        "",
        json.dumps({"id": "good-2", "image": "imgs/img001.png", "question": "Q2?"}),
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    code = annotate(
        str(manifest), *SCRIPTED, "--db", f"sqlite:///{tmp_path / 's.db'}", "--out", str(out)
    )
    err = capsys.readouterr().err
    assert code == 1
    for line, reason in [
        (2, "not valid JSON"),
        (3, "missing question"),
        (4, "image not found"),
        (5, "options must be a list"),
    ]:
        assert f"m.jsonl line {line}: {reason}" in err
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["good-1"]["status"] == rows["good-2"]["status"] == "done"
    assert rows["missing-image"]["error_code"] == "image_missing"
    assert rows["no-question"]["error_code"] == "invalid_input"
    assert sum(row["status"] == "failed" for row in rows.values()) == 4


def test_a_csv_manifest_reads_options_as_json(tmp_path: Path):
    write_images(tmp_path, 1)
    manifest = tmp_path / "m.csv"
    manifest.write_text(
        "id,image,question,options\n"
        'r1,img000.png,Colour?,"[""red"", ""blue""]"\n'
        "r2,img000.png,Colour?,red|blue\n"
    )
    out = tmp_path / "out.jsonl"
    assert (
        annotate(
            str(manifest), *SCRIPTED, "--db", f"sqlite:///{tmp_path / 's.db'}", "--out", str(out)
        )
        == 1
    )
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["r1"]["options"] == ["red", "blue"] and rows["r1"]["status"] == "done"
    assert rows["r2"]["error_code"] == "invalid_input"


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (lambda p: None, ["-q", "Q?"], "SOURCE not found"),
        (lambda p: p.mkdir(), ["-q", "Q?"], "no images in"),
        (lambda p: write_images(p, 1), [], "needs --question"),
        (lambda p: p.write_text("x"), [], "must be a folder of images, a manifest"),
    ],
    ids=["missing", "empty-folder", "no-question", "unknown-type"],
)
def test_unusable_sources_are_one_clear_line(tmp_path: Path, capsys, make, args, message):
    source = tmp_path / "source"
    make(source)
    assert annotate(str(source), *args, *SCRIPTED, "--db", f"sqlite:///{tmp_path / 's.db'}") == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_one_image_as_the_source_points_to_ask(tmp_path: Path, capsys):
    write_images(tmp_path, 1)
    (image,) = tmp_path.glob("*.png")
    assert (
        annotate(str(image), "-q", "Q?", *SCRIPTED, "--db", f"sqlite:///{tmp_path / 's.db'}") == 2
    )
    err = capsys.readouterr().err.strip()
    assert f"speceyes ask {image} -q QUESTION" in err and "\n" not in err


def test_running_the_same_command_again_resumes_without_redoing(tmp_path: Path, capsys):
    write_images(tmp_path / "c", 4)
    db = tmp_path / "s.db"
    args = [str(tmp_path / "c"), "-q", "Q?", *SCRIPTED, "--db", f"sqlite:///{db}"]
    assert annotate(*args) == 0
    before = db_rows(db, "select id, finished_at, attempts from jobs order by id")
    assert annotate(*args) == 0
    assert db_rows(db, "select id, finished_at, attempts from jobs order by id") == before
    assert "resumed: 4 rows, 0 new jobs" in capsys.readouterr().out
    assert annotate(*args[:-2], "--threshold", "0.9", "--db", f"sqlite:///{db}") == 0
    assert len(db_rows(db, "select id from jobs")) == 8  # other gate settings: other jobs


@pytest.fixture
def run_in_background(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Starts `speceyes annotate` on the scripted models in the background; what a test
    gave up on is killed at its end, never left computing."""
    started: list[subprocess.Popen] = []

    def start(db: Path, agent_step_s: float, out: Path | None = None) -> subprocess.Popen:
        started.append(_annotate_in_background(tmp_path, db, agent_step_s, out))
        return started[-1]

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _annotate_in_background(
    tmp_path: Path, db: Path, agent_step_s: float, out: Path | None
) -> subprocess.Popen:
    env = {
        **os.environ,
        "SPECEYES_SCRIPTED__TOOL_FREE": "0.0",
        "SPECEYES_SCRIPTED__AGENT_STEP_S": str(agent_step_s),
    }
    command = [
        *SPECEYES,
        "annotate",
        str(tmp_path / "c"),
        "-q",
        "Q?",
        *SCRIPTED,
        "--db",
        f"sqlite:///{db}",
        "--no-progress",
        *(["--out", str(out)] if out is not None else []),
    ]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def done_count(db: Path) -> int:
    return count_of(db, "status = 'done'")


def count_of(db: Path, where: str) -> int:
    """The jobs of a run's store that match ``where``; 0 before the store is made (its
    file may exist before its tables do)."""
    try:
        return db_rows(db, f"select count(*) from jobs where {where}")[0][0]
    except sqlite3.OperationalError:
        return 0


@pytest.mark.faults
def test_a_killed_run_resumes_with_no_job_lost_and_none_done_twice(
    tmp_path: Path, monkeypatch, run_in_background
):
    write_images(tmp_path / "c", 12)
    db = tmp_path / "s.db"
    process = run_in_background(db, agent_step_s=0.25)
    wait_until(lambda: done_count(db) >= 3, deadline_s=60, what="3 jobs done")
    process.kill()  # SIGKILL: no chance to clean up
    process.wait()
    finished = db_rows(db, "select id, final_answer, finished_at from jobs where status = 'done'")
    assert 3 <= len(finished) < 12
    monkeypatch.setenv("SPECEYES_SCRIPTED__TOOL_FREE", "0.0")  # as before, at no cost
    assert annotate(str(tmp_path / "c"), "-q", "Q?", *SCRIPTED, "--db", f"sqlite:///{db}") == 0
    assert db_rows(db, "select count(*), count(distinct id) from jobs where status = 'done'") == [
        (12, 12)
    ]
    assert db_rows(db, "select count(*) from batch_items") == [(12,)]
    again = dict(
        (row[0], row[1:]) for row in db_rows(db, "select id, final_answer, finished_at from jobs")
    )
    for job_id, answer, finished_at in finished:  # finished before the kill: untouched
        assert again[job_id] == (answer, finished_at)


@pytest.mark.faults
def test_ctrl_c_puts_unfinished_jobs_back(tmp_path: Path, run_in_background):
    write_images(tmp_path / "c", 12)
    db = tmp_path / "s.db"
    process = run_in_background(db, agent_step_s=0.25)
    wait_until(lambda: done_count(db) >= 2, deadline_s=60, what="2 jobs done")
    process.send_signal(signal.SIGINT)
    stdout, _ = process.communicate(timeout=60)
    assert process.returncode == 130
    assert b"run the same command to resume" in stdout
    statuses = dict(db_rows(db, "select status, count(*) from jobs group by status"))
    assert "running" not in statuses and statuses["done"] < 12
    assert statuses.get("deferred", 0) + statuses.get("queued", 0) + statuses["done"] == 12


@pytest.mark.faults
def test_ctrl_c_mid_step_ends_at_once_and_says_what_it_wrote(tmp_path: Path, run_in_background):
    """Ctrl-C while the agent is inside a 20 s step: the step ends at once (as a real
    model's generation does at its next token), no thread is reported "still running"
    (the wait was cut short before and said so in the same second), and --out says that
    the rows it wrote are not all finished."""
    write_images(tmp_path / "c", 3)
    db = tmp_path / "s.db"
    process = run_in_background(db, agent_step_s=20, out=tmp_path / "out.jsonl")
    wait_until(
        lambda: count_of(db, "status = 'running' and stage = 'agent'") == 1,
        deadline_s=60,
        what="the agent's step",
    )
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130 and time.monotonic() - started < 15
    assert b"still running" not in stderr, stderr[-2000:]
    assert b"3 job(s) of them not finished" in stdout, stdout


def test_export_and_jobs_show(tmp_path: Path, capsys):
    write_images(tmp_path / "c", 3)
    db = f"sqlite:///{tmp_path / 's.db'}"
    assert annotate(str(tmp_path / "c"), "-q", "Q?", *SCRIPTED, "--db", db, "--name", "mine") == 0
    capsys.readouterr()
    assert main(["export", "mine", "--out", str(tmp_path / "r.parquet"), "--db", db]) == 0
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "r.parquet").to_pylist()
    capsys.readouterr()
    assert [row["id"] for row in table] == ["img000.png", "img001.png", "img002.png"]
    assert {row["answered_by"] for row in table} == {"small"}
    assert main(["jobs", "show", table[0]["job_id"], "--db", db, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "done" and shown["question"] == "Q?"
    assert main(["jobs", "show", "nope", "--db", db]) == 2
    assert main(["export", "nope", "--out", str(tmp_path / "x.jsonl"), "--db", db]) == 2
    assert main(["export", "mine", "--out", str(tmp_path / "x.txt"), "--db", db]) == 2


def test_a_model_that_cannot_be_found_is_one_line(tmp_path: Path, capsys, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no hub here
    write_images(tmp_path / "c", 1)
    db = tmp_path / "s.db"
    code = annotate(
        str(tmp_path / "c"),
        "-q",
        "Q?",
        "--small",
        "no-such-org/model",
        "--large",
        "tiny",
        "--db",
        f"sqlite:///{db}",
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].startswith(
        "speceyes: configuration error: model 'no-such-org/model' (small) is neither a local "
        "folder nor in the Hugging Face cache, and HF_HUB_OFFLINE is set. Without a hub: "
        "--small synth --large synth --threshold 0.9"
    )
    assert not db.exists()  # refused before its first job: no empty store left behind


def test_the_default_models_offline_fail_fast_before_any_job(tmp_path: Path):
    """As a new user meets it: the default (hub) models, no hub reachable. The refusal
    comes before the batch exists, in seconds, and says how to run without a hub. Its
    time is compared with the command's own start (`annotate --help` imports the same
    modules) in the same moment, so a loaded machine does not make it fail."""
    write_images(tmp_path / "c", 3)
    db = tmp_path / "s.db"
    env = {key: value for key, value in os.environ.items() if not key.startswith("SPECEYES_")}
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty hub cache
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # no hub, here or on a machine with a network
    speceyes = [*SPECEYES, "annotate"]

    def timed(*args: str) -> tuple[subprocess.CompletedProcess, float]:
        started = time.monotonic()
        done = subprocess.run(
            [*speceyes, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        return done, time.monotonic() - started

    _, start_s = timed("--help")
    result, seconds = timed(str(tmp_path / "c"), "-q", "Dog?", "--db", f"sqlite:///{db}")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "model 'ChenShawn/DeepEyes-7B' (large) is neither a local folder" in result.stderr
    assert "--small synth --large synth" in result.stderr
    # (27 s of transformers' retries before): the check is a cache look and one 5 s probe
    assert seconds - start_s < 10, f"refused after {seconds:.1f} s (starting: {start_s:.1f} s)"
    assert not db.exists()  # no batch, no job, no empty store


def test_new_weights_in_the_same_checkpoint_folder_make_new_jobs(tmp_path: Path, capsys):
    write_images(tmp_path / "c", 2)
    checkpoint = tmp_path / "small-model"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"old weights")
    db = tmp_path / "s.db"
    args = [str(tmp_path / "c"), "-q", "Q?", *SCRIPTED, "--small", str(checkpoint)]
    assert annotate(*args, "--db", f"sqlite:///{db}") == 0
    assert annotate(*args, "--db", f"sqlite:///{db}") == 0
    assert len(db_rows(db, "select id from jobs")) == 2  # same weights: the same jobs
    (checkpoint / "model.safetensors").write_bytes(b"new weights")  # re-trained in place
    assert annotate(*args, "--db", f"sqlite:///{db}") == 0
    assert len(db_rows(db, "select id from jobs")) == 4  # not the old weights' answers


@pytest.mark.sandbox
def test_deepeyes_and_thyme_batches_keep_each_jobs_agent(tmp_path: Path, capsys):
    bubblewrap_or_skip()
    write_images(tmp_path / "c", 3)
    db = tmp_path / "s.db"
    common = [str(tmp_path / "c"), "-q", "Q?", *SCRIPTED, "--baseline", "--db", f"sqlite:///{db}"]
    assert annotate(*common, "--agent", "deepeyes", "--name", "de") == 0
    assert annotate(*common, "--agent", "thyme", "--name", "th") == 0
    configs = dict(db_rows(db, "select name, config from batches"))
    assert json.loads(configs["de"])["agent"] == "deepeyes"
    assert json.loads(configs["th"])["agent"] == "thyme"
    assert json.loads(configs["th"])["gate"]["threshold"] == 0.95  # Thyme's reference tau
    jobs = db_rows(
        db,
        "select b.name, j.id, j.status, j.trajectory from jobs j "
        "join batch_items i on i.job_id = j.id join batches b on b.id = i.batch_id",
    )
    assert len({job_id for _, job_id, _, _ in jobs}) == 6  # the agent is part of the key
    for name, _, status, trajectory in jobs:
        steps = json.loads(trajectory)["steps"]
        assert status == "done"
        if name == "th":  # it cropped in the sandbox, then answered
            assert steps[0]["code"] and steps[0]["images"][0]["width"] > 0
        else:
            assert all(step.get("code") is None for step in steps)
    thyme_job = next(job_id for name, job_id, _, _ in jobs if name == "th")
    capsys.readouterr()
    assert main(["jobs", "show", thyme_job, "--db", f"sqlite:///{db}"]) == 0
    shown = capsys.readouterr().out
    assert "code ran in the sandbox" in shown and "image " in shown


@pytest.mark.sandbox
def test_thyme_refuses_to_start_without_its_sandbox(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("SPECEYES_SANDBOX_BWRAP", "no-such-bwrap")
    write_images(tmp_path / "c", 1)
    db = tmp_path / "s.db"
    code = annotate(
        str(tmp_path / "c"), "-q", "Q?", *SCRIPTED, "--agent", "thyme", "--db", f"sqlite:///{db}"
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "needs bubblewrap" in err and "SPECEYES_ALLOW_UNSANDBOXED_CODE" in err


@pytest.mark.sandbox
def test_a_corpus_replays_chosen_thyme_code_through_annotate(tmp_path: Path, capsys, monkeypatch):
    """How an operator or an auditor replays an attack: one scripted trajectory for every
    job ("*"), through annotate, the funnel and the sandbox."""

    bubblewrap_or_skip()
    escapes = (
        "<think>\x1b[2J\x1b[31mwiped</think><code>\n```python\nprint('\\x1b[2Jgone')\n```\n</code>"
    )
    fork = "<code>\n```python\nimport os\nos.fork()\n```\n</code>"
    scripts = tmp_path / "scripts.json"
    script = {"needs_tools": True, "agent_steps": [escapes, fork, "<answer>A</answer>"]}
    scripts.write_text(json.dumps({"*": script}))
    monkeypatch.setenv("SPECEYES_SCRIPTED__SCRIPTS_FILE", str(scripts))
    write_images(tmp_path / "c", 3)
    db = tmp_path / "s.db"
    code = annotate(
        str(tmp_path / "c"), "-q", "Q?", *SCRIPTED, "--agent", "thyme", "--db", f"sqlite:///{db}"
    )
    assert code == 0, capsys.readouterr().err
    rows = db_rows(db, "SELECT id, answered_by, final_answer, trajectory FROM jobs")
    assert [(by, answer) for _, by, answer, _ in rows] == [("large", "A")] * 3
    for _, _, _, trajectory in rows:
        printing, forking, _ = json.loads(trajectory)["steps"]
        assert printing["code_output"] == "[2Jgone"  # the escape removed at the boundary
        assert forking["code"] == "import os\nos.fork()"
        assert "Operation not permitted" in forking["observation"]
    capsys.readouterr()
    assert main(["jobs", "show", rows[0][0], "--db", f"sqlite:///{db}"]) == 0
    shown = capsys.readouterr().out
    # the model's own text is kept as written, and shown escaped, never sent to a terminal
    assert "\x1b" not in shown and "\\x1b[2J\\x1b[31mwiped" in shown
    assert "code ran in the sandbox" in shown and "CPU s" in shown


@pytest.mark.sandbox
def test_thyme_runs_the_tiny_checkpoints_end_to_end(tmp_path: Path, tiny_cache_dir, monkeypatch):
    bubblewrap_or_skip()
    monkeypatch.setenv("SPECEYES_CACHE_DIR", str(tiny_cache_dir))
    monkeypatch.setenv("SPECEYES_AGENT_MAX_NEW_TOKENS", "8")
    write_images(tmp_path / "c", 2, size=(96, 80))
    db = tmp_path / "s.db"
    out = tmp_path / "out.jsonl"
    args = ["--small", "tiny", "--large", "tiny", "--device", "cpu", "--baseline"]
    code = annotate(
        str(tmp_path / "c"),
        "-q",
        "Q?",
        *args,
        "--agent",
        "thyme",
        "--max-steps",
        "2",
        "--db",
        f"sqlite:///{db}",
        "--out",
        str(out),
    )
    assert code in (0, 1)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:  # random weights: stopping and routing, never the text
        assert row["answered_by"] == "large" or row["error_code"] == "no_answer", row
        assert 1 <= row["agent_steps"] <= 2


def test_the_audit_shows_in_the_summary_status_export_and_resume(tmp_path: Path, capsys):
    write_images(tmp_path / "c", 6)
    db = f"sqlite:///{tmp_path / 's.db'}"
    args = [str(tmp_path / "c"), "-q", "Q?", *SCRIPTED, "--db", db, "--name", "aud"]
    assert annotate(*args, "--audit-rate", "1.0") == 0
    printed = capsys.readouterr().out
    assert "audit        6 of 6 audited answers agree with the agent" in printed
    assert main(["audit", "status", "aud", "--db", db]) == 0
    status = capsys.readouterr().out
    assert "6 of 6 audited" in status and "overall      6 of 6" in status
    out = tmp_path / "disagree.jsonl"
    assert main(["export", "aud", "--out", str(out), "--audit-disagreements", "--db", db]) == 0
    assert out.read_text() == ""  # the scripted agent agrees with every accepted answer
    assert main(["export", "aud", "--out", str(tmp_path / "all.jsonl"), "--db", db]) == 0
    rows = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert {(row["audit_agrees"], row["audit_answer"]) for row in rows} == {(True, "A")}
    capsys.readouterr()
    assert main(["audit", "resume", "--db", db]) == 0
    assert "nothing to resume" in capsys.readouterr().out


def test_a_resumed_folder_answers_anew_for_an_image_replaced_or_mended(tmp_path: Path, capsys):
    """Resume keeps a row's answer while its bytes stay the same; replaced bytes (or a
    broken file mended) make a new job for that row, never the old answer."""
    folder = tmp_path / "c"
    write_images(folder, 2)
    (folder / "broken.png").write_bytes(b"not an image")
    db = tmp_path / "s.db"
    args = [str(folder), "-q", "Q?", *SCRIPTED, "--db", f"sqlite:///{db}"]
    assert annotate(*args) == 1
    before = dict(db_rows(db, "select item_id, job_id from batch_items"))
    assert annotate(*args) == 1  # nothing changed: nothing new
    assert "0 new jobs" in capsys.readouterr().out
    (folder / "img000.png").write_bytes(png((40, 30), (0, 200, 0)))  # other pixels
    (folder / "broken.png").write_bytes(png((20, 20)))  # mended
    assert annotate(*args) == 0
    assert "3 rows, 2 new jobs" in capsys.readouterr().out
    after = dict(db_rows(db, "select item_id, job_id from batch_items"))
    assert after["img001.png"] == before["img001.png"]
    assert after["img000.png"] != before["img000.png"]
    assert after["broken.png"] != before["broken.png"]
    statuses = db_rows(db, "select j.status from batch_items b join jobs j on j.id = b.job_id")
    assert sorted(statuses) == [("done",)] * 3


def test_rows_that_share_an_id_keep_a_job_each_and_a_file_gone_for_a_while_keeps_its_answer(
    tmp_path: Path, capsys
):
    """Two questions about one image (the rows' ids are its path) are two jobs, on every
    run; a row whose file is missing on a resume keeps the answer it had."""
    write_images(tmp_path / "imgs", 2)
    rows = [
        {"image": "imgs/img000.png", "question": "What colour is it?"},
        {"image": "imgs/img000.png", "question": "Is there a circle?"},
        {"image": "imgs/img001.png", "question": "Q?"},
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    db = tmp_path / "s.db"
    args = [str(manifest), *SCRIPTED, "--db", f"sqlite:///{db}"]
    assert annotate(*args) == 0
    asked = (
        "select b.position, j.question, j.status from batch_items b join jobs j on j.id = b.job_id"
    )
    first = sorted(db_rows(db, asked))
    assert [question for _, question, _ in first] == [r["question"] for r in rows]
    assert annotate(*args) == 0 and sorted(db_rows(db, asked)) == first
    (tmp_path / "imgs" / "img001.png").rename(tmp_path / "away.png")
    annotate(*args)
    assert sorted(db_rows(db, asked)) == first  # still done, with its answer


def test_a_refused_run_keeps_a_store_that_was_there_and_every_run_names_its_store(
    tmp_path: Path, capsys
):
    write_images(tmp_path / "c", 2)
    db = tmp_path / "s.db"
    assert annotate(str(tmp_path / "c"), "-q", "Q?", *SCRIPTED, "--db", f"sqlite:///{db}") == 0
    assert f"speceyes: job store {db.resolve()} (SQLite)" in capsys.readouterr().err
    refused = annotate(
        str(tmp_path / "c"),
        "-q",
        "Q?",
        "--small",
        str(tmp_path / "nowhere"),
        "--db",
        f"sqlite:///{db}",
    )
    assert refused == 2 and db_rows(db, "select count(*) from jobs") == [(2,)]  # kept


def test_a_broker_with_a_sqlite_store_is_refused_before_anything_is_sent(tmp_path: Path, capsys):
    write_images(tmp_path / "c", 1)
    db = tmp_path / "s.db"
    broker = "redis://127.0.0.1:1/0"  # (nothing listens there: a send would say so)
    code = annotate(str(tmp_path / "c"), "-q", "Q?", "--broker", broker, "--db", f"sqlite:///{db}")
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "needs a job store every worker shares, not the SQLite file" in err
    assert not db.exists()
    assert main(["worker", "fast", "--broker", broker, "--db", f"sqlite:///{db}"]) == 2
    assert main(["serve", "--broker", broker, "--db", f"sqlite:///{db}"]) == 2
    assert not db.exists()


def test_the_bar_counts_as_the_summary_does_and_says_what_a_stall_waits_for(
    tmp_path: Path, capsys, monkeypatch
):
    """The bar's words come from the same counts as its number (they lagged one update
    behind): every state it shows agrees with itself, its last is the summary's, and
    nothing finishing for a while is said, with what the jobs are doing (an agent step
    of 1.5 s: a stall of 0.5 s)."""
    shown: list[tuple[int, str]] = []

    class Recorded(tqdm):  # what each refresh shows: the number and the words
        def refresh(self, *args, **kwargs):
            if self.desc == "annotating":
                shown.append((self.n, self.postfix or ""))
            return super().refresh(*args, **kwargs)

    monkeypatch.setattr(cli.follow, "tqdm", Recorded)
    monkeypatch.setattr(cli.follow, "STALL_S", 0.5)
    monkeypatch.setenv("SPECEYES_SCRIPTED__TOOL_FREE", "0.0")
    monkeypatch.setenv("SPECEYES_SCRIPTED__AGENT_STEP_S", "1.5")
    write_images(tmp_path / "c", 3)
    db = f"sqlite:///{tmp_path / 's.db'}"
    assert main(["annotate", str(tmp_path / "c"), "-q", "Q?", *SCRIPTED, "--db", db]) == 0
    captured = capsys.readouterr()
    assert "nothing finished for 0.5 s: 1 running, 0 waiting for the fast stage, " in captured.err
    for number, words in shown[1:]:  # each state: agent + small + failed is the number
        answered = re.findall(r"(?:small|agent|failed) (\d+)", words)
        assert sum(map(int, answered)) == number, (number, words)
    assert shown[-1] == (3, "small 0 | agent 3 | failed 0 | running 0 | waiting 0")
    assert "done         3: small model 0 (0.0% of jobs), agent 3" in captured.out


def test_speculation_in_depth_keeps_each_jobs_zooms_and_defers_with_its_reason(
    tmp_path: Path, capsys, monkeypatch
):
    """``--speculation-depth 2`` through annotate (embedded, SQLite): an answer after a
    zoom is accepted with its steps kept; a job still zooming after two is deferred to the
    agent (depth_exhausted), its steps kept too."""
    call = {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [4, 4, 20, 20]}}
    zoom = f"<think>closer</think><tool_call>{json.dumps(call)}</tool_call>"
    scripts = tmp_path / "scripts.json"
    scripts.write_text(json.dumps({"*": {"zoom_steps": [zoom, "<answer>B</answer>"]}}))
    monkeypatch.setenv("SPECEYES_SCRIPTED__SCRIPTS_FILE", str(scripts))
    write_images(tmp_path / "c", 2)
    db = tmp_path / "s.db"
    flags = ("-q", "Q?", *SCRIPTED, "--db", f"sqlite:///{db}", "--speculation-depth")
    assert annotate(str(tmp_path / "c"), *flags, "2") == 0, capsys.readouterr().err
    rows = db_rows(db, "SELECT answered_by, final_answer, defer_reason, zoom_steps FROM jobs")
    assert [row[:3] for row in rows] == [("small", "B", None)] * 2
    for row in rows:
        zoomed, answered = json.loads(row[3])
        assert zoomed["box_original"] is not None and answered["observation"] == "answered"

    scripts.write_text(json.dumps({"*": {"zoom_steps": [zoom]}}))  # zooms, never answers
    db = tmp_path / "again.db"
    flags = ("-q", "Q?", *SCRIPTED, "--db", f"sqlite:///{db}", "--speculation-depth")
    assert annotate(str(tmp_path / "c"), *flags, "2") == 0, capsys.readouterr().err
    rows = db_rows(db, "SELECT answered_by, defer_reason, error_message, zoom_steps FROM jobs")
    for by, reason, _, steps in rows:
        assert (by, reason) == ("large", "depth_exhausted") and len(json.loads(steps)) == 3
