"""Finding one's work again: the batches, a batch's failed jobs, a name given loosely."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from cli.main import main
from common.store.db import open_store
from common.store.keys import check_key
from tests.helpers.images import write_images

ROOT = Path(__file__).resolve().parents[2]


def _manifest(tmp_path: Path) -> Path:
    write_images(tmp_path / "imgs", 2)
    (tmp_path / "imgs" / "broken.png").write_bytes(b"not an image")
    rows = [{"id": f"row-{i}", "image": f"imgs/img00{i}.png", "question": "Q?"} for i in (0, 1)]
    rows.append({"id": "row-bad", "image": "imgs/broken.png", "question": "Q?"})
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return manifest


def test_batches_lists_each_batch_with_its_counts(tmp_path: Path, capsys):
    db = ["--db", f"sqlite:///{tmp_path / 's.db'}"]
    assert main(["batches", *db]) == 2
    assert "no job store at" in capsys.readouterr().err
    manifest = _manifest(tmp_path)
    assert main(["annotate", str(manifest), "--backend", "scripted", "--no-progress", *db]) == 1
    capsys.readouterr()
    assert main(["batches", *db]) == 0
    header, line = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["NAME", "ID", "CREATED"]
    assert line.split()[0] == "manifest.jsonl" and line.split()[-4:] == ["3", "2", "1", "0"]
    assert main(["batches", "--json", *db]) == 0
    (record,) = map(json.loads, capsys.readouterr().out.splitlines())
    assert record["name"] == "manifest.jsonl" and record["jobs"] == 3
    assert record["by_status"] == {"done": 2, "failed": 1}


def test_jobs_list_names_the_failed_files_and_why(tmp_path: Path, capsys):
    db = ["--db", f"sqlite:///{tmp_path / 's.db'}"]
    manifest = _manifest(tmp_path)
    main(["annotate", str(manifest), "--backend", "scripted", "--no-progress", *db])
    capsys.readouterr()
    assert main(["jobs", "list", "manifest.jsonl", "--status", "failed", *db]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("row-bad ") and "failed  image_error:" in line
    assert main(["jobs", "list", "manifest", "--json", *db]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["id"] for row in rows] == ["row-0", "row-1", "row-bad"]
    assert rows[2]["error_code"] == "image_error" and rows[0]["status"] == "done"
    assert main(["jobs", "list", "manifest", "--status", "deferred", *db]) == 0
    assert capsys.readouterr().out.startswith("no deferred jobs in batch")


def test_jobs_list_without_a_batch_lists_the_newest_jobs_as_the_api_does(tmp_path, capsys):
    db = ["--db", f"sqlite:///{tmp_path / 's.db'}"]
    manifest = _manifest(tmp_path)
    main(["annotate", str(manifest), "--backend", "scripted", "--no-progress", *db])
    capsys.readouterr()
    assert main(["jobs", "list", "--json", *db]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 3 and rows == sorted(rows, key=lambda row: row["job_id"], reverse=True)
    assert main(["jobs", "list", "--status", "failed", "--limit", "5", *db]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert "failed  image_error:" in line
    assert main(["jobs", "list", "--limit", "1", "--json", *db]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_a_batch_is_found_with_or_without_its_suffix_and_a_typo_gets_suggestions(
    tmp_path: Path, capsys
):
    db = ["--db", f"sqlite:///{tmp_path / 's.db'}"]
    manifest = _manifest(tmp_path)
    main(["annotate", str(manifest), "--backend", "scripted", "--no-progress", *db])
    write_images(tmp_path / "photos", 1)
    main(["annotate", str(tmp_path / "photos"), "-q", "Q?", "--backend", "scripted", *db])
    capsys.readouterr()
    for name in ("manifest", "manifest.jsonl", str(manifest)):  # as annotate was given it
        assert main(["export", name, "--out", str(tmp_path / "out.jsonl"), *db]) == 0
        assert "(manifest.jsonl)" in capsys.readouterr().out
    assert main(["export", "photos.jsonl", "--out", str(tmp_path / "p.jsonl"), *db]) == 0
    # a path names its own corpus, never another of the same file name
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.jsonl").write_text(manifest.read_text().replace("imgs/", "../imgs/"))
    assert (
        main(["export", str(other / "manifest.jsonl"), "--out", str(tmp_path / "o.jsonl"), *db])
        == 2
    )
    assert "no batch" in capsys.readouterr().err
    assert main(["export", "manifst", "--out", str(tmp_path / "x.jsonl"), *db]) == 2
    error = capsys.readouterr().err
    assert "no batch 'manifst' in this job store; did you mean 'manifest.jsonl'?" in error
    assert "speceyes batches lists them" in error
    assert main(["report", "nothing-like-it", *db]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_jobs_list_names_its_statuses_plainly(tmp_path: Path, capsys):
    with pytest.raises(SystemExit):
        main(["jobs", "list", "b", "--status", "bogus"])
    error = capsys.readouterr().err
    assert "(choose from 'queued', 'deferred', 'running', 'done', 'failed', 'cancelled')" in error


def test_keys_need_a_name_and_a_second_key_of_a_name_is_pointed_out(tmp_path: Path, capsys):
    db = ["--db", f"sqlite:///{tmp_path / 's.db'}"]
    assert main(["keys", "create", " ", *db]) == 2
    assert "a key needs a name" in capsys.readouterr().err
    assert main(["keys", "create", "svc", *db]) == 0
    first = capsys.readouterr()
    assert first.out.startswith("sk-speceyes-") and len(first.out.splitlines()) == 1
    assert "shown once" in first.err and "note:" not in first.err
    assert main(["keys", "create", "svc", *db]) == 0
    assert "note: 1 other active key(s) named 'svc'" in capsys.readouterr().err


def test_a_key_sets_its_tenants_daily_quotas_and_the_list_shows_them(tmp_path: Path, capsys):
    db = ["--db", f"sqlite:///{tmp_path / 's.db'}"]
    for bad in (["--jobs-per-day", "-1"], ["--compute-s-per-day", "nan"]):
        assert main(["keys", "create", "svc", *bad, *db]) == 2
        assert "is a quota: 0 or more" in capsys.readouterr().err
    quotas = ["--jobs-per-day", "500", "--compute-s-per-day", "3600"]
    assert main(["keys", "create", "svc", *quotas, *db]) == 0
    assert main(["keys", "list", *db]) == 0
    assert capsys.readouterr().out.rstrip().endswith("quota 500 jobs a day, 3600 s a day")


def test_a_key_made_again_with_replace_leaves_only_the_last_one_working(tmp_path: Path, capsys):
    """What `make browse` does on each run: the earlier demo key is revoked, not piled up."""
    db = ["--db", f"sqlite:///{tmp_path / 's.db'}"]
    for _ in range(3):
        assert main(["keys", "create", "demo-reviewer", "--admin", "--replace", *db]) == 0
    assert "revoked 1 earlier key(s) named 'demo-reviewer'" in capsys.readouterr().err
    assert main(["keys", "list", *db]) == 0
    listed = capsys.readouterr().out.splitlines()
    states = [word for line in listed for word in line.split() if word in ("active", "revoked")]
    assert sorted(states) == ["active", "revoked", "revoked"]


def test_make_browse_serves_the_demo_as_it_ran_with_one_key():
    recipe = (ROOT / "Makefile").read_text().split("\nbrowse:", 1)[1].split("\n\n", 1)[0]
    assert "keys create demo-reviewer --admin --replace" in recipe
    assert "--threshold $(DEMO_THRESHOLD)" in recipe


class _LeavesAfterOneLine(io.StringIO):
    """A stdout whose reader leaves after the first line (`| head -1`, unbuffered)."""

    def write(self, text: str) -> int:
        if "\n" in self.getvalue():
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)

    def fileno(self) -> int:
        return os.open(os.devnull, os.O_WRONLY)


def test_a_key_read_by_a_reader_that_leaves_after_one_line_is_saved(tmp_path: Path, monkeypatch):
    """`KEY=$(speceyes keys create NAME | head -1)`: the reader may leave after the secret;
    the key must be in the store all the same (it was printed inside the transaction, and
    the next line's broken pipe rolled it back)."""
    db = f"sqlite:///{tmp_path / 's.db'}"
    stdout = _LeavesAfterOneLine()
    monkeypatch.setattr(sys, "stdout", stdout)
    main(["keys", "create", "svc", "--db", db])
    secret = stdout.getvalue().strip()
    assert secret.startswith("sk-speceyes-")
    with open_store(db, create=False)() as session:
        assert check_key(session, secret) is not None


def test_a_batch_name_with_terminal_escapes_is_printed_escaped(tmp_path: Path, capsys):
    write_images(tmp_path / "c", 1)
    db = ["--db", f"sqlite:///{tmp_path / 's.db'}"]
    name = "x\x1b[2Jy"
    main(
        ["annotate", str(tmp_path / "c"), "-q", "Q?", "--backend", "scripted", "--name", name, *db]
    )
    capsys.readouterr()
    assert main(["export", name, "--out", str(tmp_path / "o.jsonl"), *db]) == 0
    assert main(["jobs", "list", name, "--status", "failed", *db]) == 0
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and printed.count("x\\x1b[2Jy") == 2


def test_a_manifest_row_whose_image_is_missing_keeps_its_known_answer(tmp_path: Path, capsys):
    """It is scored, as wrong, instead of leaving the accuracy as if it were not there."""
    write_images(tmp_path / "imgs", 1)
    rows = [
        {"id": "here", "image": "imgs/img000.png", "question": "Q?", "answer": "A"},
        {"id": "gone", "image": "imgs/nope.png", "question": "Q?", "answer": "A"},
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    db = ["--db", f"sqlite:///{tmp_path / 's.db'}"]
    main(["annotate", str(manifest), "--backend", "scripted", "--no-progress", *db])
    assert "(1 of 2 rows with a known answer; a failed row is wrong)" in capsys.readouterr().out
