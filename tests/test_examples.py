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
from pathlib import Path

import fsspec
import pyarrow.parquet as pq
import pytest

from tests.helpers.corpora import object_store, write_parquet, write_saved_dataset, write_shards
from tests.helpers.images import write_images
from tests.helpers.ports import reserved_port

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# Blocks not run here, with why: they are what CI and the clean-clone check run.
NOT_RUN = {"make demo", "make test"}

pytestmark = pytest.mark.integration


def code_blocks(page: Path) -> list[tuple[str, str]]:
    """Each fenced block of a Markdown page: (its language, its text)."""
    found = re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(), flags=re.M | re.S)
    return [(language, text) for language, text in found]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SPECEYES_")}
    return {
        **env,
        "PATH": f"{BIN}{os.pathsep}{env['PATH']}",  # the venv, as `source .venv/bin/activate`
        "SPECEYES_LARGE_MODEL": "synth",  # the README's advice without a hub
        "SPECEYES_SMALL_MODEL": "synth",
        "SPECEYES_DATABASE_URL": f"sqlite:///{tmp_path / 'speceyes.db'}",
        "SPECEYES_UPLOAD_DIR": str(tmp_path / "uploads"),
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


def test_the_readmes_examples_run_as_written(tmp_path: Path):
    blocks = [text for _, text in code_blocks(ROOT / "README.md") if text.strip() not in NOT_RUN]
    assert len(blocks) == 1, "a new README block: run it here, or say in NOT_RUN why not"
    _corpus(tmp_path)
    commands = [line for line in blocks[0].splitlines() if line and not line.startswith("#")]
    assert len(commands) == 9
    # s3:// is an S3-compatible server on 127.0.0.1 (moto: no real S3 here), AWS_* set
    with object_store() as store:
        store.upload(tmp_path / "shards", "corpora/shards")
        _run_all(commands, tmp_path)
        written = sorted(fsspec.filesystem("s3").ls("corpora/labels"))
    assert [name.rsplit("/", 1)[-1] for name in written] == ["part-00000.parquet"]
    assert (tmp_path / "answers.jsonl").is_file() and (tmp_path / "answers.parquet").is_file()
    assert sorted(p.name for p in (tmp_path / "labelled").iterdir()) == ["00000.tar", "00001.tar"]
    assert (tmp_path / "results" / "part-00000.parquet").is_file()
    assert len((tmp_path / "pets.jsonl").read_text().splitlines()) == 3


def _run_all(commands: list[str], tmp_path: Path) -> None:
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=300,
        )
        # 0: every job done; 1: some failed (a synth model on photos of nothing it knows)
        assert done.returncode in (0, 1), (command, done.stderr[-3000:])
        assert "Traceback" not in done.stderr, (command, done.stderr[-3000:])
        assert "batch " in done.stdout and "jobs " in done.stdout, (command, done.stdout)


def test_the_apis_examples_run_as_written(tmp_path: Path):
    """The curl session (a key, the server, one job), then the Python client's batch,
    in one shell as a user would run them; only the port is this test's own."""
    (shell, python) = [
        text
        for language, text in code_blocks(ROOT / "docs" / "api.md")
        if language in ("sh", "python")
    ]
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
                "kill %1",  # the server the example started
            ]
        )
        (tmp_path / "samples").symlink_to(ROOT / "samples")
        output, errors = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        with output.open("w") as out, errors.open("w") as err:
            # its own session: the server the example starts in the background is stopped
            # with it, whatever happens
            shell_run = subprocess.Popen(
                ["bash", "-c", script],
                cwd=tmp_path,
                env=_env(tmp_path),
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            try:
                code: int | None = shell_run.wait(timeout=240)
            except subprocess.TimeoutExpired:
                code = None  # still running: its output says where it stands
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(shell_run.pid, signal.SIGKILL)
        said = f"stdout:\n{output.read_text()[-3000:]}\nstderr:\n{errors.read_text()[-3000:]}"
        assert code == 0, said
        job = json.loads((tmp_path / "job.json").read_text())
        assert job["created"] is True
        lines = output.read_text().splitlines()
        assert any(f'"id":"{job["id"]}"' in line for line in lines), lines
        answered = [line.split() for line in lines if line.startswith(("a ", "b "))]
        assert [words[0] for words in answered] == ["a", "b"], lines
        assert all(words[2] in ("small", "large") for words in answered), lines
