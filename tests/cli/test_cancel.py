"""``speceyes cancel``, ``resume`` and ``retry`` on the embedded default (issue 46): a
running ``annotate`` is cancelled from another terminal, keeps what finished, and the
batch is taken up again without redoing it."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

from cli.main import main
from tests.helpers.images import write_images
from tests.helpers.serving import SPECEYES
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
SCRIPTED = ["--backend", "scripted"]


def _statuses(db: Path) -> dict[str, int]:
    try:
        with sqlite3.connect(db) as connection:
            rows = connection.execute("select status, count(*) from jobs group by status")
            return dict(rows.fetchall())
    except sqlite3.OperationalError:  # (the file may exist before its tables do)
        return {}


def test_a_running_annotate_is_cancelled_from_elsewhere_then_resumed(tmp_path: Path, capsys):
    write_images(tmp_path / "c", 6)
    db = tmp_path / "s.db"
    store = ["--db", f"sqlite:///{db}"]
    env = {
        **os.environ,
        "SPECEYES_SCRIPTED__TOOL_FREE": "0.0",  # every job goes to the agent: one at a time
        "SPECEYES_SCRIPTED__AGENT_STEP_S": "2.5",  # (15 s of work: time to cancel)
    }
    command = [*SPECEYES, "annotate", str(tmp_path / "c"), "-q", "Q?"]
    running = subprocess.Popen(
        [*command, *SCRIPTED, *store, "--no-progress"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: _statuses(db).get("done", 0) >= 1, deadline_s=120, what="one answer")
        assert main(["cancel", "c", *store]) == 0
        said = capsys.readouterr().out
        assert "cancelled" in said and "finished before and kept" in said
        out, err = running.communicate(timeout=60)
    finally:
        if running.poll() is None:
            running.kill()
            running.communicate()
    assert running.returncode == 1, (out, err, said)  # not every job answered
    assert "cancelled    " in out and "speceyes resume c" in out
    counts = _statuses(db)
    assert counts.get("cancelled", 0) >= 1 and counts["done"] >= 1
    assert counts["done"] + counts["cancelled"] == 6
    assert main(["cancel", "c", *store]) == 0  # again: nothing changes
    assert _statuses(db) == counts
    assert main(["resume", "c", *SCRIPTED, *store, "--no-progress"]) == 0
    assert _statuses(db) == {"done": 6}
    assert main(["retry", "c", *SCRIPTED, *store, "--no-progress"]) == 2
    assert "no failed or cancelled job" in capsys.readouterr().err


def test_cancel_names_what_it_cannot_find(tmp_path: Path, capsys):
    write_images(tmp_path / "c", 1)
    db = tmp_path / "s.db"
    store = ["--db", f"sqlite:///{db}"]
    assert (
        main(["annotate", str(tmp_path / "c"), "-q", "Q?", *SCRIPTED, *store, "--no-progress"]) == 0
    )
    capsys.readouterr()
    assert main(["cancel", "d", *store]) == 2
    assert "no batch 'd'" in capsys.readouterr().err
    assert main(["cancel", "c", *store]) == 0  # finished: nothing to cancel, all kept
    assert "0 cancelled, 0 stopping at the end of their step, 1 finished before" in (
        capsys.readouterr().out
    )
