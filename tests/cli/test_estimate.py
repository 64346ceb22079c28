"""``annotate --estimate N`` and the batch's "saved" figure, checked against the runs
they speak of, on SpecEyes-Synth with the shipped synth models (deterministic: the
models decode greedily and the rows are drawn by a seed; only the times vary)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import func, select

from cli.main import main
from common.store.db import open_store
from common.store.overview import overview
from common.store.reads import require_batch
from common.store.tables import BatchItem

SPLITS = {"vstar": "vstar", "hr_bench_synth.tsv": "hr_bench_synth.tsv", "POPE": "POPE"}
MODELS = ["--small", "synth", "--large", "synth", "--threshold", "0.9", "--no-progress"]
SHARE = re.compile(r"answered by the small model\s+([\d.]+)% \(([\d.]+)% to ([\d.]+)%\)")
WALL = re.compile(r"wall time on this deployment\s+\S+ s \(([\d.]+) s .* to ([\d.]+) s at")
DONE = re.compile(r"small model \d+ \(([\d.]+)% of jobs\)")
TOOK = re.compile(r"this run\s+\d+ jobs in ([\d.]+) s")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    assert main(["synth", "generate", str(out), "--items", "100", "--seed", "7"]) == 0
    return out


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_an_estimate_predicts_the_full_runs_accepted_share_and_wall_time(
    corpus: Path, tmp_path: Path, split: str, capsys
) -> None:
    source = str(corpus / split)
    sampled = f"sqlite:///{tmp_path / 'estimate.db'}"
    capsys.readouterr()
    main(["annotate", source, *MODELS, "--db", sampled, "--estimate", "40", "--seed", "3"])
    printed = capsys.readouterr().out
    share = SHARE.search(printed)
    wall = WALL.search(printed)
    assert share is not None and wall is not None, printed
    # it kept the sample's jobs only, in a batch that says it is an estimate
    sessions = open_store(sampled, create=False)
    with sessions() as session:
        batch = require_batch(session, f"{SPLITS[split]}.estimate")
        rows = select(func.count()).where(BatchItem.batch_id == batch.id)
        assert session.scalar(rows) == 40
        assert batch.config["estimate"]["sample"] == 40 and batch.config["estimate"]["rows"] > 40
    sessions.close()

    whole = f"sqlite:///{tmp_path / 'whole.db'}"  # (its own store: nothing reused)
    main(["annotate", source, *MODELS, "--db", whole])
    printed = capsys.readouterr().out
    accepted = float(DONE.search(printed).group(1))  # type: ignore[union-attr]
    took = float(TOOK.search(printed).group(1))  # type: ignore[union-attr]
    assert float(share.group(2)) <= accepted <= float(share.group(3)), printed
    # (wall times on a shared machine vary run to run: WALL_NOISE allows for it)
    assert float(wall.group(1)) <= took <= float(wall.group(2)), printed


@pytest.mark.xfail(
    strict=True,
    reason="issue 50, open: on synth the funnel saves nothing (its fast stage costs about "
    "what the agent spends on the accepted rows), the estimate's basis (the answering "
    "turn after a zoom) leans high, and its interval leaves out the run-to-run spread of "
    "the deferred jobs' agent time (7%)",
)
def test_what_the_funnel_saved_agrees_with_an_agent_alone_run_of_the_same_rows(
    corpus: Path, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    source = str(corpus / "manifest.jsonl")
    main(["annotate", source, *MODELS, "--db", db, "--name", "funnel"])
    main(["annotate", source, *MODELS, "--db", db, "--name", "alone", "--baseline"])
    sessions = open_store(db, create=False)
    with sessions() as session:
        funnel = overview(session, require_batch(session, "funnel").id).usage
        alone = overview(session, require_batch(session, "alone").id).usage
    sessions.close()
    saved = funnel.saved()
    assert saved is not None and alone.accepted == 0
    measured = alone.spent.total_s - funnel.spent.total_s
    assert saved.low <= measured <= saved.high, (measured, saved)
