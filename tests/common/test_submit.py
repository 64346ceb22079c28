"""Submitting a corpus (``common.submit``) on PostgreSQL, where submissions can race."""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import func, select

from common.config import Settings
from common.corpus import read_source
from common.store.db import open_store
from common.store.tables import Batch, BatchItem, Job
from common.submit import run_config, submit_corpus
from tests.helpers.images import write_images


def test_the_same_corpus_submitted_by_six_runs_at_once_makes_one_batch(
    tmp_path: Path, postgres_url: str
):
    """Two `annotate` runs of one corpus started together (a retry, a second terminal):
    each is one transaction creating rows under unique keys, so all but the first are
    refused by the database; each then runs once more and finds what the first made."""
    write_images(tmp_path / "corpus", 40)
    rows = read_source(tmp_path / "corpus", "What colour?")
    settings = Settings(backend="scripted")
    sessions = open_store(postgres_url)
    start = threading.Barrier(6)
    found: list[str] = []
    errors: list[BaseException] = []

    def submit() -> None:
        start.wait()
        try:
            found.append(
                submit_corpus(sessions, rows, source="corpus", name="c", settings=settings).batch_id
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    with sessions() as session:
        counts = [
            session.scalar(select(func.count()).select_from(table))
            for table in (Batch, BatchItem, Job)
        ]
    sessions.close()
    assert errors == []
    assert len(found) == 6 and len(set(found)) == 1
    assert counts == [1, 40, 40]


def test_the_job_key_names_the_exif_turn_and_the_method_only_where_they_are_not_the_default():
    """Keys of jobs under the defaults stay what they were; turning EXIF off or running
    SpecReason answers differently, so it is another job."""
    default = run_config(Settings())
    assert "exif_rotate" not in default and "method" not in default
    unturned = run_config(Settings(images={"exif_rotate": False}))
    assert unturned["exif_rotate"] is False
    specreason = run_config(Settings(funnel={"method": "specreason"}))
    assert (specreason["method"], specreason["specreason_threshold"]) == ("specreason", 7.0)
