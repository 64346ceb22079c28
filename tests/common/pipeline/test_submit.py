"""Submitting a corpus (``common.pipeline.submit``) on PostgreSQL, where submissions can race."""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path

import pytest
from sqlalchemy import func, select

from common.config import Settings
from common.contracts import SourceRow
from common.errors import InvalidInput
from common.pipeline.submit import ReadAhead, run_config, submit_corpus
from common.sources.corpus import read_source
from common.store.db import open_store
from common.store.tables import Batch, BatchItem, Job
from tests.helpers.images import write_images


def test_the_same_corpus_submitted_by_six_runs_at_once_makes_one_batch(
    tmp_path: Path, postgres_url: str
):
    """Six `annotate` runs of one corpus started together (a retry, a second terminal),
    each writing it in chunks: one run at a time adds the batch's rows (a lease), the
    others wait, then find every row made."""
    write_images(tmp_path / "corpus", 40)
    rows = read_source(tmp_path / "corpus", "What colour?")
    settings = Settings(backend="scripted", submit_rows=7)
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


def test_a_run_resumed_between_chunks_matches_each_held_row_once(tmp_path: Path, sessions):
    """Rows sharing an id (two questions about one image) in different chunks: a run
    stopped after its first chunk, resumed, ends as one uninterrupted run would."""
    write_images(tmp_path / "corpus", 3)
    image = str(tmp_path / "corpus" / "img000.png")
    other = [str(path) for path in sorted((tmp_path / "corpus").glob("*.png"))[1:]]

    def row(position: int, item_id: str, question: str, path: str) -> SourceRow:
        return SourceRow(position, item_id, question, None, path)

    rows = [
        row(0, "X", "What colour?", image),
        row(1, "Y", "What colour?", other[0]),
        row(2, "X", "Is it big?", image),
        row(3, "Z", "What colour?", other[1]),
    ]
    settings = Settings(backend="scripted", submit_rows=2)
    submit = partial(submit_corpus, sessions, source="c", name="c", settings=settings)
    assert submit(rows[:2]).items_added == 2  # the first run stops after its first chunk
    resumed = submit(rows)
    assert (resumed.batch_created, resumed.items_added) == (False, 2)
    with sessions() as session:
        found = session.execute(
            select(BatchItem.position, BatchItem.item_id, Job.question)
            .join(Job, Job.id == BatchItem.job_id)
            .order_by(BatchItem.position)
        ).all()
    assert [tuple(r) for r in found] == [
        (0, "X", "What colour?"),
        (1, "Y", "What colour?"),
        (2, "X", "Is it big?"),
        (3, "Z", "What colour?"),
    ]
    assert submit(rows).items_added == 0  # and again: nothing new


def test_what_the_reading_thread_raises_is_raised_by_the_writer_after_the_chunks_before():
    def rows():
        for position in range(5):
            yield SourceRow(position, str(position), "Q?")
        raise InvalidInput("the shard ends here")

    got: list[object] = []
    read = ReadAhead(rows(), lambda row: row.position, size=2)  # type: ignore[arg-type, return-value]
    with pytest.raises(InvalidInput, match="the shard ends here"), read as chunks:
        for chunk in chunks:
            got.extend(chunk)
    assert got == [0, 1, 2, 3]  # the whole chunks read before (the fifth row's is lost)
    assert chunks.first_question == ("Q?", None)
