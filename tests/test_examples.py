"""The documentation's examples, run as written: every shell and Python block of the
README (but the two `make` commands, which CI and a clean clone check) and of the HTTP
API's page, against the files they name, with the synth models (no hub here)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import fsspec
import httpx
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select
from standardwebhooks import Webhook

from common.config import WebhookSettings
from common.pipeline.notify import Notifier
from common.store import webhooks
from common.store.db import open_store
from common.store.tables import WebhookDelivery
from lab.ports import reserved_port
from tests.helpers.corpora import object_store, write_parquet, write_saved_dataset, write_shards
from tests.helpers.images import write_images
from tests.helpers.serving import served
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# Blocks not run here, with why: they are what CI and the clean-clone check run.
NOT_RUN = {"make demo", "make test"}

pytestmark = pytest.mark.integration


def code_blocks(page: Path) -> list[tuple[str, str]]:
    """Each fenced block of a Markdown page: (its language, its text)."""
    found = re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(), flags=re.M | re.S)
    return [(language, text) for language, text in found]


def without_a_hub() -> dict[str, str]:
    """The README's advice for a machine without a model hub: its ``export`` line."""
    found = re.search(r"`export ((?:SPECEYES_\w+=\S+ ?)+)`", (ROOT / "README.md").read_text())
    assert found, "the README tells a user without a hub what to export"
    return dict(pair.split("=", 1) for pair in found.group(1).split())


def test_without_a_hub_the_readme_serves_the_synth_models_as_the_demo_does():
    advice = without_a_hub()
    assert advice["SPECEYES_LARGE_MODEL"] == advice["SPECEYES_SMALL_MODEL"] == "synth"
    demo = re.search(r"^DEMO_THRESHOLD := ([\d.]+)", (ROOT / "Makefile").read_text(), re.M)
    assert demo and advice.get("SPECEYES_GATE_THRESHOLD") == demo.group(1)


def _env(tmp_path: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SPECEYES_")}
    return {
        **env,
        "PATH": f"{BIN}{os.pathsep}{env['PATH']}",  # the venv, as `source .venv/bin/activate`
        **without_a_hub(),  # the README's advice, as it is written
        "SPECEYES_DATABASE_URL": f"sqlite:///{tmp_path / 'speceyes.db'}",
        "SPECEYES_UPLOAD_DIR": str(tmp_path / "uploads"),
        # the agent's trajectories kept short: the synth models, on photos of nothing
        # they know, run every step to its token limit (56 s for 2 photos on a quiet
        # machine, over 280 s at three times its load); what is tested is the commands
        "SPECEYES_AGENT_MAX_STEPS": "2",
        "SPECEYES_AGENT_MAX_NEW_TOKENS": "48",
    }


def _corpus(folder: Path) -> None:
    """What the README's commands name: photos/, corpus.jsonl, the benchmarks in data/."""
    write_images(folder / "photos", 2)
    synth = folder / "synth"
    subprocess.run(
        [BIN / "speceyes", "synth", "generate", str(synth), "--items", "4"],
        check=True,
        capture_output=True,
    )
    (folder / "data" / "HR-Bench").mkdir(parents=True)
    shutil.move(synth / "vstar", folder / "data" / "vstar")
    shutil.move(synth / "POPE", folder / "data" / "POPE")
    shutil.move(synth / "hr_bench_synth.tsv", folder / "data" / "HR-Bench" / "hr_bench_8k.tsv")
    shutil.move(synth / "images", folder / "images")
    rows = [json.loads(line) for line in (synth / "manifest.jsonl").read_text().splitlines()]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    # corpora where they live: shards, a save_to_disk folder, a table (its own column names)
    write_shards(folder / "shards", shards=2, per_shard=2)
    saved = write_saved_dataset(folder / "pets-dataset", 3)
    saved.rename(folder / "saved")
    import datasets  # (a dev dependency: the test writes the format)

    renamed = datasets.load_from_disk(str(folder / "saved")).rename_column("question", "prompt")
    renamed.save_to_disk(str(folder / "pets-dataset"))
    write_parquet(folder / "pets-table.parquet", 3)
    table = pq.read_table(folder / "pets-table.parquet").rename_columns(
        ["id", "picture", "question", "options", "answer"]
    )
    pq.write_table(table.drop_columns(["question"]), folder / "pets.parquet")


def readme_commands() -> list[str]:
    """The README's one block of commands a user types, one a line, comments left out."""
    blocks = [text for _, text in code_blocks(ROOT / "README.md") if text.strip() not in NOT_RUN]
    if len(blocks) != 1:
        return []  # (test_the_readme_has_one_block_of_examples says so)
    return [line for line in blocks[0].splitlines() if line and not line.startswith("#")]


COMMANDS = readme_commands()
# what each command that writes something must have written, by what its --out names
WRITTEN = {
    "answers.jsonl": lambda folder: (folder / "answers.jsonl").is_file(),
    "answers.parquet": lambda folder: (folder / "answers.parquet").is_file(),
    "labelled/": lambda folder: (
        sorted(p.name for p in (folder / "labelled").iterdir()) == ["00000.tar", "00001.tar"]
    ),
    "results/": lambda folder: (folder / "results" / "part-00000.parquet").is_file(),
    "pets.jsonl": lambda folder: len((folder / "pets.jsonl").read_text().splitlines()) == 3,
    "s3://corpora/labels/": lambda _: (
        sorted(name.rsplit("/", 1)[-1] for name in fsspec.filesystem("s3").ls("corpora/labels"))
        == ["_speceyes.json", "part-00000.parquet"]
    ),
}


def test_the_readme_has_one_block_of_examples_each_run_here():
    blocks = [text for _, text in code_blocks(ROOT / "README.md") if text.strip() not in NOT_RUN]
    assert len(blocks) == 1, "a new README block: run it here, or say in NOT_RUN why not"
    assert len(COMMANDS) == 9
    outs = [command.split("--out ")[1].split()[0] for command in COMMANDS if "--out " in command]
    assert sorted(outs) == sorted(WRITTEN)  # each output is checked


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the README's commands name, in one folder (built once per test process)."""
    folder = tmp_path_factory.mktemp("readme")
    _corpus(folder)
    return folder


@pytest.mark.parametrize(
    "command", COMMANDS, ids=[" ".join(command.split()[:3])[:60] for command in COMMANDS]
)
def test_a_readme_example_runs_as_written(command: str, corpus: Path):
    """Each command of the README's block, in its own test (each within the timeout, and
    spread over the parallel workers), against the files it names."""
    # s3:// is an S3-compatible server on 127.0.0.1 (moto: no real S3 here), AWS_* set
    remote = object_store() if "s3://" in command else contextlib.nullcontext()
    with remote as store:
        if store is not None:
            store.upload(corpus / "shards", "corpora/shards")
        _run(command, corpus)
        out = command.split("--out ")[1].split()[0] if "--out " in command else None
        if out is not None:
            assert WRITTEN[out](corpus), (command, out)


def _run(command: str, folder: Path) -> None:
    code, stdout, stderr = _shell(command, folder, _env(folder), timeout_s=280)
    # 0: every job done; 1: some failed (a synth model on photos of nothing it knows)
    assert code in (0, 1), (command, stderr[-3000:])
    assert "Traceback" not in stderr, (command, stderr[-3000:])
    assert "batch " in stdout and "jobs " in stdout, (command, stdout)


def _shell(script: str, folder: Path, env: dict[str, str], timeout_s: float) -> tuple:
    """``script`` run by bash in ``folder``, in a session of its own: whatever it starts in
    the background is stopped with it, whatever happens. Its exit status (None: still
    running after ``timeout_s``), then what it printed on stdout and on stderr."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        run = subprocess.Popen(
            ["bash", "-c", script],
            cwd=folder,
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        try:
            code: int | None = run.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None  # (what it printed says where it stood)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
        out.seek(0)
        err.seek(0)
        return code, out.read(), err.read()


def test_the_apis_examples_run_as_written(tmp_path: Path):
    """The curl session (a key, the server, one job), then the Python client's batch and
    the OpenAI SDK's chat, in one shell as a user would run them; only the port is this
    test's own."""
    blocks = code_blocks(ROOT / "docs" / "api.md")
    shell = next(text for language, text in blocks if language == "sh")
    python, _, openai_sdk = [text for language, text in blocks if language == "python"][:3]
    with reserved_port() as port:  # held until the server is gone
        script = "\n".join(
            [
                "set -ex",  # (a failure shows each command; the key is a throwaway)
                shell.replace("127.0.0.1:8000", f"127.0.0.1:{port}").replace(
                    "speceyes serve ", f"speceyes serve --port {port} "
                ),
                "export KEY",
                "python3 - <<'PYTHON'",
                python.replace("127.0.0.1:8000", f"127.0.0.1:{port}"),
                "PYTHON",
                "python3 - <<'PYTHON'",  # (the OpenAI SDK's chat)
                openai_sdk.replace("127.0.0.1:8000", f"127.0.0.1:{port}"),
                "PYTHON",
                "kill %1",  # the server the example started
            ]
        )
        (tmp_path / "samples").symlink_to(ROOT / "samples")
        code, stdout, stderr = _shell(script, tmp_path, _env(tmp_path), timeout_s=240)
        said = f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
        assert code == 0, said
        lines = stdout.splitlines()
        job = json.loads(next(line for line in lines if '"created"' in line))
        assert job["created"] is True
        # it leaves nothing where it is run (the store and uploads are this test's)
        left = {path.name for path in tmp_path.iterdir() if not path.name.startswith("speceyes.db")}
        assert left <= {"samples", "stdout.txt", "stderr.txt", "uploads"}, left
        assert any(f'"id":"{job["id"]}"' in line for line in lines), lines
        answered = [line.split() for line in lines if line.startswith(("a ", "b "))]
        assert [words[0] for words in answered] == ["a", "b"], lines
        assert all(words[2] in ("small", "large") for words in answered), lines
        # the OpenAI SDK's chat: the models, then the funnel's answer and how it came
        assert "['speceyes-deepeyes', 'specreason-deepeyes']" in lines, lines
        assert any(line.startswith("{'job_id': ") for line in lines), lines


def test_the_webhook_receiver_of_the_api_docs_verifies_and_deduplicates(tmp_path: Path):
    """The receiver as written, on its own port, fed by our sender: an event delivered
    twice (the same webhook-id) is handled once, and a forged one is refused with 400."""
    receiver_code = [
        text for language, text in code_blocks(ROOT / "docs" / "api.md") if language == "python"
    ][1]
    sessions = open_store(f"sqlite:///{tmp_path / 's.db'}")
    with sessions.begin() as session:
        secret = webhooks.callback_secret(session, None)
    with reserved_port() as port:  # (held until the receiver listens on it)
        receiver = subprocess.Popen(
            [sys.executable, "-c", receiver_code.replace("9000", str(port))],
            env={**os.environ, "WEBHOOK_SECRET": secret},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        url = f"http://127.0.0.1:{port}/hooks"
        try:
            wait_until(lambda: _answers(url), deadline_s=30, what="the receiver to listen")
        except BaseException:
            receiver.kill()
            raise
    try:
        with sessions.begin() as session:
            event = webhooks.emit(
                session, "job.finished", None, "j" * 32, {"id": "j" * 32}, callback_url=url
            )
            assert event is not None
            webhooks.emit(
                session, "job.finished", None, "k" * 32, {"id": "k" * 32}, callback_url=url
            )
            again = session.scalars(
                select(WebhookDelivery).where(WebhookDelivery.event_id == event.id)
            ).one()
            session.add(WebhookDelivery(**{**_columns(again), "id": "f" * 32}))  # (sent twice)
        sender = Notifier(sessions, WebhookSettings(allow_hosts=["127.0.0.1"]))
        try:
            assert sender.tick() == 3
        finally:
            sender.stop()
        forged = Webhook(webhooks.new_secret())
        headers = {"webhook-id": "x", "webhook-timestamp": str(int(time.time()))}
        headers["webhook-signature"] = forged.sign("x", datetime.now(UTC), b"{}")
        assert httpx.post(url, content=b"{}", headers=headers).status_code == 400
        with sessions() as session:
            states = session.scalars(select(WebhookDelivery.state)).all()
        assert states == ["delivered"] * 3
    finally:
        receiver.terminate()
        out, _ = receiver.communicate(timeout=30)
        sessions.close()
    assert sorted(out.split("\n")[:-1]) == [f"job.finished {'j' * 32}", f"job.finished {'k' * 32}"]


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)
    except httpx.HTTPError:
        return False
    return True


def _columns(row: WebhookDelivery) -> dict:
    return {column.key: getattr(row, column.key) for column in WebhookDelivery.__table__.columns}


def test_the_one_machine_distributed_example_runs_as_written(
    tmp_path: Path, postgres_url: str, redis_client
):
    """docs/operations.md's block, as written, but for the store (this test's database)
    and the key prefix (this test's own, on the shared Redis)."""
    page = (ROOT / "docs" / "operations.md").read_text()
    section = page.split("## One machine, without Docker", 1)[1]
    (block,) = [text for language, text in code_blocks_of(section) if language == "sh"][:1]
    database = postgres_url.rsplit("/", 1)[1]
    prefix = f"speceyes-test-{os.getpid()}-{tmp_path.name}:"
    script = (
        block.replace("postgresql+psycopg://127.0.0.1/speceyes", postgres_url)
        .replace("CREATE DATABASE speceyes", f"CREATE DATABASE {database}")
        .replace("SPECEYES_BROKER_KEY_PREFIX=speceyes:", f"SPECEYES_BROKER_KEY_PREFIX={prefix}")
    )
    assert script.count(postgres_url) == 1 and prefix in script
    (tmp_path / "samples").symlink_to(ROOT / "samples")
    env = {key: value for key, value in os.environ.items() if not key.startswith("SPECEYES_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    try:
        code, stdout, stderr = _shell(f"set -e\n{script}", tmp_path, env, timeout_s=280)
    finally:  # (what the queues left under this test's prefix)
        for key in redis_client.scan_iter(f"{prefix}*"):
            redis_client.delete(key)
    said = f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
    assert code == 0, said
    assert "sent 16 jobs to the fast queue" in stdout, said
    rows = [json.loads(line) for line in (tmp_path / "distributed.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and all(row["status"] == "done" for row in rows), said
    assert "stopped 3 worker(s)" in stdout, said


def code_blocks_of(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)


def test_the_openai_batch_script_annotates_the_sample_corpus_as_written(tmp_path: Path):
    """docs/examples/openai_batch.py, unchanged: only the SDK's two environment variables
    point it at a `speceyes serve` (the scripted backend: the script is under test, not
    the models; the API's example above runs the synth models)."""
    env = {**_env(tmp_path), "SPECEYES_UPLOAD_DIR": str(tmp_path / "uploads")}
    flags = ["--backend", "scripted", "--db", f"sqlite:///{tmp_path / 's.db'}"]
    with served(tmp_path, env, *flags) as server:
        sdk = {**env, "OPENAI_BASE_URL": f"{server.base}/openai/v1", "OPENAI_API_KEY": server.key}
        script = ROOT / "docs" / "examples" / "openai_batch.py"
        done = subprocess.run(
            [
                sys.executable,
                str(script),
                str(ROOT / "samples" / "manifest.jsonl"),
                "speceyes-deepeyes",
            ],
            env=sdk,
            capture_output=True,
            text=True,
            timeout=240,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    rows = [
        json.loads(line)["id"]
        for line in (ROOT / "samples" / "manifest.jsonl").read_text().splitlines()
    ]
    # each row once: answered, or failed with why (a synth agent may find no answer)
    said = [line.split()[1] for line in lines if line.startswith(("answer ", "failed "))]
    assert sorted(said) == sorted(rows), done.stdout
    answered = sum(line.startswith("answer ") for line in lines)
    assert answered >= len(rows) // 2, done.stdout
    assert f"batch completed {answered} of {len(rows)} answered" in lines, done.stdout
