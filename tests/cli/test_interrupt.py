"""Ctrl-C during ``speceyes annotate`` on the in-process models: a real SIGINT in each
stage ends the run with exit code 130, no abort (a thread left inside torch when Python
exits would end it with SIGABRT), and every unfinished job waiting for the next run."""

from __future__ import annotations

import base64
import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.helpers.images import png, write_images
from tests.helpers.serving import SPECEYES, served
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.faults


def _rows(db: Path, query: str) -> list[tuple]:
    try:
        with sqlite3.connect(db) as connection:
            return connection.execute(query).fetchall()
    except sqlite3.OperationalError:  # not created yet
        return []


def _running_in(db: Path, stage: str) -> bool:
    return bool(_rows(db, f"select 1 from jobs where status = 'running' and stage = '{stage}'"))


class Annotate:
    """``speceyes annotate`` on the tiny random checkpoints, in a subprocess whose
    stderr is read into a file (so a test can wait for a line in it)."""

    def __init__(self, tmp_path: Path, cache_dir: Path, images: int, *flags: str) -> None:
        write_images(tmp_path / "c", images)
        self.db = tmp_path / "s.db"
        self.stderr_path = tmp_path / "stderr.txt"
        env = {**os.environ, "SPECEYES_CACHE_DIR": str(cache_dir), "PYTHONUNBUFFERED": "1"}
        command = [
            *SPECEYES,
            "annotate",
            str(tmp_path / "c"),
            "-q",
            "Is there a dog?",
            "--small",
            "tiny",
            "--large",
            "tiny",
            "--db",
            f"sqlite:///{self.db}",
            "--no-progress",
            *flags,
        ]
        with self.stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr
            )

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def __enter__(self) -> Annotate:
        return self

    def __exit__(self, *exc: object) -> None:
        """A run the test gave up on is killed, never left computing."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()

    def interrupt(self) -> tuple[int, str, str]:
        """SIGINT; the exit code, stdout and stderr once it has ended."""
        self.process.send_signal(signal.SIGINT)
        stdout, _ = self.process.communicate(timeout=60)
        return self.process.returncode, stdout.decode(errors="replace"), self.stderr()


@pytest.mark.parametrize(
    ("stage", "images", "flags"),
    [
        ("loading", 4, []),
        ("fast", 48, ["--batch-size", "16"]),
        ("agent", 6, ["--agent-workers", "2"]),  # two trajectories in one batched generate
    ],
)
def test_ctrl_c_exits_130_in_each_stage(tmp_path: Path, tiny_cache_dir, stage, images, flags):
    with Annotate(tmp_path, tiny_cache_dir, images, *flags) as run:
        if stage == "loading":
            reached = lambda: "loading the large model" in run.stderr()  # noqa: E731
        else:
            reached = lambda: _running_in(run.db, stage)  # noqa: E731
        wait_until(
            lambda: reached() or run.process.poll() is not None,
            deadline_s=120,
            every_s=0.02,
            what=lambda: f"the {stage} stage; stderr: {run.stderr()[-2000:]}",
        )
        assert run.process.poll() is None, run.stderr()[-2000:]
        code, stdout, stderr = run.interrupt()
        assert code == 130, f"stdout:\n{stdout[-2000:]}\nstderr:\n{stderr[-3000:]}"
        assert "terminate called" not in stderr and "Traceback" not in stderr, stderr[-3000:]
        statuses = dict(_rows(run.db, "select status, count(*) from jobs group by status"))
        assert "running" not in statuses  # every job claimed at the time was put back
        if stage != "loading":
            assert "run the same command to resume" in stdout
            assert statuses.get("queued", 0) + statuses.get("deferred", 0) > 0
            # an interrupt is not the jobs' doing: no attempt counted against those put back
            attempts = "select max(attempts) from jobs where status in ('queued', 'deferred')"
            assert _rows(run.db, attempts) in ([(0,)], [(None,)])


def test_ctrl_c_on_serve_while_a_trajectory_runs_shuts_down_in_order(
    tmp_path: Path, tiny_cache_dir
):
    """`speceyes serve` (embedded runner) stopped while a trajectory is inside torch: the
    server shuts down, its stage threads end their step and hand the job back, no abort."""
    db = tmp_path / "s.db"
    env = {
        **os.environ,
        "SPECEYES_CACHE_DIR": str(tiny_cache_dir),
        "SPECEYES_UPLOAD_DIR": str(tmp_path / "up"),
        "SPECEYES_DATABASE_URL": f"sqlite:///{db}",
    }
    with served(tmp_path, env, "--small", "tiny", "--large", "tiny") as server:
        jobs = [
            {"question": f"Q{i}?", "image_base64": base64.b64encode(png()).decode()}
            for i in range(3)
        ]
        answer = httpx.post(
            f"{server.base}/v1/batches", json={"jobs": jobs}, headers={"X-API-Key": server.key}
        )
        assert answer.status_code == 202
        wait_until(
            lambda: _running_in(db, "agent"), deadline_s=120, every_s=0.02, what="a trajectory"
        )
        server.process.send_signal(signal.SIGINT)
        server.process.wait(timeout=60)
    stderr = server.stderr()
    assert server.process.returncode == 0, stderr[-3000:]
    assert "terminate called" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert not _rows(db, "select 1 from jobs where status = 'running'")


def test_sigterm_stops_serve_as_cleanly_as_ctrl_c(tmp_path: Path):
    """A service manager's stop (SIGTERM): the same orderly shutdown, exit 0, and the
    SQLite store closed (no -wal or -shm file left beside it)."""
    db = tmp_path / "s.db"
    env = {**os.environ, "SPECEYES_UPLOAD_DIR": str(tmp_path / "up")}
    flags = ["--backend", "scripted", "--db", f"sqlite:///{db}"]
    with served(tmp_path, env, *flags) as server:
        job = {"question": "Q?", "image_base64": base64.b64encode(png()).decode()}
        answer = httpx.post(f"{server.base}/v1/jobs", json=job, headers={"X-API-Key": server.key})
        assert answer.status_code == 202, answer.text
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0, server.stderr()[-3000:]
    assert db.exists() and sorted(p.name for p in tmp_path.glob("s.db*")) == ["s.db"]
