"""Hostile corpora and file arguments: one bad row fails alone, read-only commands create
nothing, an output that cannot be written is refused before any work."""

from __future__ import annotations

import json
import time
from pathlib import Path

from cli.main import main
from tests.helpers.images import write_images

SCRIPTED = ["--backend", "scripted"]


def annotate(*args: str) -> int:
    return main(["annotate", *args, "--no-progress"])


def test_rows_over_the_limits_or_with_unstorable_text_fail_alone_on_postgresql(
    tmp_path: Path, postgres_url: str
):
    write_images(tmp_path / "imgs", 2)
    image = "imgs/img000.png"
    rows = [
        {"id": "huge-question", "image": image, "question": "Why? " * 200_000},  # ~1 MB
        {
            "id": "many-options",
            "image": image,
            "question": "Q?",
            "options": [f"option {i}" for i in range(10_000)],
        },
        {"id": "nul-question", "image": image, "question": "What\x00colour?"},
        {"id": "nul\x00id", "image": image, "question": "Q?"},
        {"id": "surrogate", "image": image, "question": "Q\ud800?"},
        {"id": "nul-answer", "image": image, "question": "Q?", "answer": "A\x00"},
        {"id": "good", "image": "imgs/img001.png", "question": "Q?", "options": ["a", "b"]},
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out.jsonl"
    started = time.monotonic()
    code = annotate(str(manifest), *SCRIPTED, "--db", postgres_url, "--out", str(out))
    assert time.monotonic() - started < 60  # nothing stalls on the huge row
    assert code == 1  # some jobs failed; the run itself ended normally
    found = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert found["good"]["status"] == "done"
    expected = {
        "huge-question": "max_question_chars",
        "many-options": "max_options",
        "nul-question": "invalid_text",
        "nul\ufffdid": "invalid_text",
        "surrogate": "invalid_text",
        "nul-answer": "invalid_text",
    }
    for row_id, code_ in expected.items():
        assert (found[row_id]["status"], found[row_id]["error_code"]) == ("failed", code_), row_id
    assert len(found["huge-question"]["question"]) == 2000  # kept, cut to the limit
    assert "NUL" in found["nul-question"]["error"]


def test_a_batch_name_over_the_column_is_refused_before_any_work(tmp_path: Path, capsys):
    write_images(tmp_path / "c", 1)
    db = tmp_path / "s.db"
    code = annotate(
        str(tmp_path / "c"), "-q", "Q?", *SCRIPTED, "--db", f"sqlite:///{db}", "--name", "n" * 201
    )
    assert code == 2 and "max_name_chars" in capsys.readouterr().err
    code = annotate(str(tmp_path / "c"), "-q", "Q\x00?", *SCRIPTED, "--db", f"sqlite:///{db}")
    assert code == 2 and "NUL" in capsys.readouterr().err


def test_read_only_commands_create_no_database_or_folder(tmp_path: Path, capsys):
    missing = tmp_path / "nonexistent" / "dir" / "x.db"
    out = str(tmp_path / "o.jsonl")
    for command in (
        ["jobs", "show", "ab" * 16],
        ["export", "b", "--out", out],
        ["report", "b"],
        ["calibrate", "b"],
        ["keys", "list"],
    ):
        assert main([*command, "--db", f"sqlite:///{missing}"]) == 2, command
        assert "no job store at" in capsys.readouterr().err
    assert not (tmp_path / "nonexistent").exists()


def test_export_to_a_folder_is_refused_and_leaves_no_partial_file(tmp_path: Path, capsys):
    write_images(tmp_path / "c", 2)
    db = f"sqlite:///{tmp_path / 's.db'}"
    assert annotate(str(tmp_path / "c"), "-q", "Q?", *SCRIPTED, "--db", db, "--name", "b") == 0
    folder = tmp_path / "out.jsonl"
    folder.mkdir()
    capsys.readouterr()
    assert main(["export", "b", "--out", str(folder), "--db", db]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert [path.name for path in tmp_path.iterdir() if "partial" in path.name] == []


def test_a_failed_export_removes_its_partial_file(tmp_path: Path):
    from common.store import export

    def broken_rows():
        yield {"id": "a"}
        raise OSError("disk full")

    target = tmp_path / "r.jsonl"
    try:
        export.write_rows(broken_rows(), target)
    except OSError:
        pass
    else:
        raise AssertionError("the error was swallowed")
    assert list(tmp_path.iterdir()) == []
