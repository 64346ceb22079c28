"""The promises our documents make are tied to tests that exist, and no template can
print text unescaped without a reason written here.

- Every test a guarantee names (a ``test_*.py`` file, a ``test_*`` function, in SECURITY.md,
  README.md and docs/) exists: a guarantee whose test was renamed or deleted is a claim.
- Every row of docs/sandbox.md's guarantee table names at least one test.
- Every promise of ``tests.mutation.promises`` names tests that exist and a change that
  applies (``make mutate`` then checks each change makes its tests fail).
- ``| safe``, ``Markup(``, ``autoescape false`` appear nowhere but where ``ALLOWED_UNESCAPED``
  says why (there is nowhere yet).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.hostile_programs import PROGRAMS as HOSTILE
from tests.mutation.modules import MODULES
from tests.mutation.promises import PROMISES

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "SECURITY.md", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAMED_FILE = re.compile(r"\b(test_[a-z0-9_]+\.py)\b")
NAMED_TEST = re.compile(r"(?<![\w.])(?:::)?(test_[a-z0-9_]+)\b(?!\.py)")
SHORTHAND = re.compile(r"\b[HPUGV] [`\"]")
QUOTED_PROGRAMS = re.compile(r'\b[PUG] ((?:"[^"]+"(?:, )?)+)')
UNESCAPED = re.compile(r"\|\s*safe\b|\bMarkup\(|autoescape\s+false", re.IGNORECASE)
ALLOWED_UNESCAPED: dict[str, str] = {}  # file (relative) -> why it may


def _tests_by_name() -> tuple[set[str], set[str]]:
    files = {path.name for path in (ROOT / "tests").rglob("test_*.py")}
    functions = set()
    for path in (ROOT / "tests").rglob("*.py"):
        functions.update(
            re.findall(r"^\s*(?:async )?def (test_[a-z0-9_]+)", path.read_text(), re.M)
        )
    return files, functions


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_test_a_document_names_exists(document: Path):
    files, functions = _tests_by_name()
    text = document.read_text()
    missing = sorted(set(NAMED_FILE.findall(text)) - files)
    missing += sorted(set(NAMED_TEST.findall(text)) - functions)
    assert not missing, f"{document.name} names tests that do not exist: {missing}"


def test_every_row_of_the_sandboxs_guarantees_names_a_test():
    """Each row names a test (or a test file's shorthand, H P U G V, as the page explains),
    and every program it names by its name in quotes is one the tests run."""
    text = (ROOT / "docs" / "sandbox.md").read_text()
    table = text.split("## Guarantees and their tests", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) > 20
    for row in rows[1:]:  # (the first is the header)
        assert NAMED_FILE.search(row) or NAMED_TEST.search(row) or SHORTHAND.search(row), row
    unprivileged = (ROOT / "tests" / "common" / "sandbox" / "test_unprivileged.py").read_text()
    programs = {program.name for program in HOSTILE}
    programs |= set(re.findall(r'^    "([a-z0-9]+)": ', unprivileged, re.M))  # (its script's)
    named = {
        name for group in QUOTED_PROGRAMS.findall(table) for name in re.findall(r'"([^"]+)"', group)
    }
    assert named and not named - programs, sorted(named - programs)


def test_every_promise_names_tests_that_exist_and_a_change_that_applies():
    _, functions = _tests_by_name()
    for promise in PROMISES:
        assert (ROOT / promise.path).read_text().count(promise.old) == 1, promise.promise
        for node in promise.tests:
            path, _, name = node.partition("::")
            assert (ROOT / path).is_file() and name in functions, node


def test_every_module_under_mutation_exists_with_the_tests_it_names():
    _, functions = _tests_by_name()
    for module in MODULES:
        assert (ROOT / module.path).is_file(), module
        for node in module.tests:
            path, _, name = node.partition("::")
            assert (ROOT / path).is_file() and (not name or name in functions), node


def test_nothing_is_printed_unescaped_without_a_reason():
    found = []
    for path in [
        *ROOT.glob("api/**/*.html"),
        *ROOT.glob("api/**/*.py"),
        *ROOT.glob("common/**/*.py"),
    ]:
        relative = str(path.relative_to(ROOT))
        if relative not in ALLOWED_UNESCAPED and UNESCAPED.search(path.read_text()):
            found.append(relative)
    assert not found, f"unescaped output without a reason in ALLOWED_UNESCAPED: {found}"


def test_the_unescaped_check_finds_what_it_looks_for():
    for text in ("{{ x | safe }}", "{{x|safe}}", "Markup(text)", "{% autoescape false %}"):
        assert UNESCAPED.search(text), text
    assert not UNESCAPED.search("{{ x }} safely | saferow")
