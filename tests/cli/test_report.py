"""``speceyes report``: the paper's table from a funnel batch and its baseline."""

from __future__ import annotations

import re
from pathlib import Path

from cli.main import main
from tests.helpers.benchmarks import write_pope


def test_the_report_puts_accuracy_and_speedup_per_split(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("SPECEYES_UPLOAD_DIR", str(tmp_path / "uploads"))
    monkeypatch.setenv("SPECEYES_SCRIPTED__AGENT_STEP_S", "0.02")
    source = tmp_path / "POPE"
    write_pope(source / "Full" / "random-00000-of-00001.parquet")
    db = f"sqlite:///{tmp_path / 's.db'}"
    common = ["--backend", "scripted", "--db", db, "--no-progress"]
    assert main(["annotate", str(source), *common, "--name", "funnel"]) == 0
    assert main(["annotate", str(source), *common, "--name", "base", "--baseline"]) == 0
    capsys.readouterr()

    assert main(["report", "funnel", "--baseline", "base", "--db", db, "--markdown"]) == 0

    printed = capsys.readouterr().out
    assert "| | pope/random | avg |" in printed.replace("|  |", "| |")
    # scripted answers are "A": wrong for every yes/no row, under the reference's rules
    assert "| agent alone | 0.00 | 0.00 |" in printed
    funnel = next(line for line in printed.splitlines() if line.startswith("| funnel |"))
    assert re.fullmatch(r"\| funnel \| 0\.00/\d+\.\d\d \| 0\.00/\d+\.\d\d \|", funnel)
    assert "| funnel | 1.00/1.00 |" in printed  # beta / alpha: all tool-free, all accepted
