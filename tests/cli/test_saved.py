"""A batch's "saved" figure against what an agent-alone run of the same SpecEyes-Synth
rows measured (the scripted backend: an agent step takes the seconds it is told, so
the figure is the accounting's, not a tiny model's noise). The same check with the
shipped synth models and their real times is ``speceyes bench accounting``."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.bench.accounting import measured_saving
from cli.main import main

FLAGS = ["--backend", "scripted", "--no-progress"]


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    assert main(["synth", "generate", str(out), "--items", "100", "--seed", "7"]) == 0
    return out / "vstar"  # 48 rows


@pytest.mark.parametrize(
    "audit_rate, basis",
    # (0.5: of ~23 accepted jobs, fewer than two audited once in 10^5 batches)
    [("0.5", "audits"), ("0", "tool_free_runs")],
)
def test_saved_holds_what_an_agent_alone_run_of_the_same_rows_measured(
    rows: Path, tmp_path: Path, monkeypatch, audit_rate: str, basis: str
):
    monkeypatch.setenv("SPECEYES_SCRIPTED__TOOL_FREE", "0.8")
    monkeypatch.setenv("SPECEYES_SCRIPTED__CONFIDENT", "0.6")
    monkeypatch.setenv("SPECEYES_SCRIPTED__AGENT_STEP_S", "0.05")
    monkeypatch.setenv("SPECEYES_SCRIPTED__FAST_JOB_S", "0.002")
    db = f"sqlite:///{tmp_path / 's.db'}"
    funnel = ["--db", db, "--name", "funnel", "--audit-rate", audit_rate]
    assert main(["annotate", str(rows), *FLAGS, *funnel]) == 0
    assert main(["annotate", str(rows), *FLAGS, "--db", db, "--name", "alone", "--baseline"]) == 0

    measured, saved = measured_saving(db)
    assert saved is not None and saved.basis == basis and saved.accepted > 0
    assert saved.low <= measured <= saved.high, (measured, saved)
    # the interval is no blanket: a run's pace (5%) and the sampling, not the whole figure
    assert saved.high - saved.low < 0.5 * saved.avoided_s
