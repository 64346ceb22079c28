"""``annotate --estimate N`` checked against the full run it speaks of, on SpecEyes-Synth
with the shipped synth models: deterministic (the models decode greedily, the rows are
drawn by a seed). Its times, and the "saved" figure against an agent-alone run, are a
machine's: ``speceyes bench accounting`` prints them (docs/benchmarks.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import func, select

from cli.estimate import draw
from cli.main import main
from common.contracts import SourceRow
from common.store.analytics import STRICT_COUNTS
from common.store.db import open_store
from common.store.reads import require_batch
from common.store.tables import BatchItem

SPLITS = {"vstar": "vstar", "hr_bench_synth.tsv": "hr_bench_synth.tsv", "POPE": "POPE"}
MODELS = ["--small", "synth", "--large", "synth", "--threshold", "0.9", "--no-progress"]
SHARE = re.compile(r"answered by the small model\s+([\d.]+)% \(([\d.]+)% to ([\d.]+)%\)")
WALL = re.compile(r"wall time on this deployment\s+\S+ s \(([\d.]+) s .* to ([\d.]+) s at")
DONE = re.compile(r"small model \d+ \(([\d.]+)% of jobs\)")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    assert main(["synth", "generate", str(out), "--items", "100", "--seed", "7"]) == 0
    return out


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_an_estimate_predicts_the_full_runs_accepted_share(
    corpus: Path, tmp_path: Path, split: str, capsys
) -> None:
    source = str(corpus / split)
    sampled = f"sqlite:///{tmp_path / 'estimate.db'}"
    capsys.readouterr()
    main(["annotate", source, *MODELS, "--db", sampled, "--estimate", "40", "--seed", "3"])
    printed = capsys.readouterr().out
    share = SHARE.search(printed)
    assert share is not None and WALL.search(printed) is not None, printed
    assert f"by {STRICT_COUNTS}" in printed  # how its accuracy counts a failed row
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
    assert float(share.group(2)) <= accepted <= float(share.group(3)), printed


def test_the_corpus_run_after_an_estimate_is_a_batch_of_its_own_and_reuses_its_jobs(
    corpus: Path, tmp_path: Path, capsys
) -> None:
    """A batch is named by its source, first question and settings: an estimate whose
    sample drew the corpus's first row must still not become the corpus's batch."""
    rows = [SourceRow(position, str(position), "Q?") for position in range(100)]
    seed = next(seed for seed in range(100) if draw(iter(rows), 10, seed).rows[0].position == 0)
    db = f"sqlite:///{tmp_path / 's.db'}"
    source = str(corpus / "manifest.jsonl")
    main(["annotate", source, *MODELS, "--db", db, "--estimate", "10", "--seed", str(seed)])
    main(["annotate", source, *MODELS, "--db", db])
    printed = capsys.readouterr().out
    assert "100 rows, 90 new jobs" in printed  # the sample's 10 found done
    sessions = open_store(db, create=False)
    with sessions() as session:
        sample = require_batch(session, "manifest.jsonl.estimate")
        whole = require_batch(session, "manifest.jsonl")
        assert sample.id != whole.id and "estimate" not in whole.config
        first = select(BatchItem.position).where(BatchItem.batch_id == sample.id)
        assert 0 in set(session.scalars(first))
        assert session.scalar(select(func.count()).where(BatchItem.batch_id == whole.id)) == 100
    sessions.close()
