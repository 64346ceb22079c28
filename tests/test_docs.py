"""The documentation's links resolve, and the docs site builds with --strict.

Every relative link (and ``#anchor``) in every Markdown file of the repository (tracked,
or new and not ignored) must name a file that exists, and an anchor a heading of its
target. ``make docs`` (``mkdocs build --strict``) checks the same inside ``docs/``; this
also covers README.md, SECURITY.md, CONTRIBUTING.md and any other Markdown outside it,
and the ``make`` targets the docs tell a reader to run.
"""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_DIRS = {".git", ".venv", "site", "build", "dist", "node_modules", ".pytest_cache"}

FENCE = re.compile(r"^\s{0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HTML_LINK = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"", re.IGNORECASE)
HTML_ANCHOR = re.compile(r"<a\s[^>]*?(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")
MAKE_IN_SPAN = re.compile(r"`make ([A-Za-z0-9_-]+)[^`]*`")
MAKE_IN_CODE = re.compile(r"^\s*make ([A-Za-z0-9_-]+)")
MAKE_TARGET = re.compile(r"^([A-Za-z0-9_-]+(?:\s+[A-Za-z0-9_-]+)*)\s*:(?!=)", re.MULTILINE)


def markdown_files(root: Path = ROOT) -> list[Path]:
    """The repository's Markdown files: git's (tracked, or untracked and not ignored)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "*.md"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        paths = {root / name for name in listed.split("\0") if name}
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        paths = {
            path
            for path in root.rglob("*.md")
            if not SKIPPED_DIRS.intersection(path.relative_to(root).parts)
        }
    return sorted(path for path in paths if path.is_file())


def prose_lines(text: str) -> list[tuple[int, str, bool]]:
    """(line number, line, inside a fenced code block) for each line."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            lines.append((number, line, True))
            continue
        lines.append((number, line, fenced))
    return lines


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link and image outside code."""
    found = []
    for number, line, fenced in prose_lines(text):
        if fenced:
            continue
        line = CODE_SPAN.sub("", line)
        for pattern in (INLINE_LINK, REFERENCE, HTML_LINK):
            found.extend((number, match.group(1)) for match in pattern.finditer(line))
    return found


def heading_text(raw: str) -> str:
    """A heading as it reads once rendered: no code marks, emphasis, links or HTML."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "")
    return re.sub(r"(\*\*|__|\*|\b_|_\b)", "", text)


def github_slug(text: str) -> str:
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def mkdocs_slug(text: str) -> str:
    """Python-Markdown's toc slugify, which mkdocs uses."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    """Every anchor a reader may link to in ``path``, as GitHub or mkdocs would make it."""
    found: set[str] = set()
    seen: dict[tuple[str, str], int] = {}
    for _, line, fenced in prose_lines(path.read_text(encoding="utf-8")):
        if fenced:
            continue
        found.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        text = heading_text(match.group(2))
        for style, slug, joiner in (("gh", github_slug(text), "-"), ("mk", mkdocs_slug(text), "_")):
            count = seen.get((style, slug), 0)
            seen[(style, slug)] = count + 1
            found.add(slug if count == 0 else f"{slug}{joiner}{count}")
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with ``path``'s relative links, one line each (empty: nothing)."""
    problems = []
    for number, target in links(path.read_text(encoding="utf-8")):
        if not target or SCHEME.match(target):
            continue
        where = f"{path.relative_to(root)}:{number}: {target}"
        link, _, anchor = target.partition("#")
        link = unquote(link.split("?", 1)[0])
        if link.startswith("/"):
            resolved = (root / link.lstrip("/")).resolve()
        else:
            resolved = (path.parent / link).resolve() if link else path
        if not resolved.is_relative_to(root.resolve()):
            problems.append(f"{where}: points outside the repository")
        elif not resolved.exists():
            problems.append(f"{where}: no such file")
        elif anchor and resolved.suffix == ".md" and unquote(anchor) not in anchors(resolved):
            problems.append(f"{where}: {resolved.name} has no heading #{anchor}")
    return problems


FILES = markdown_files()


def test_the_repository_has_its_documentation():
    names = {str(path.relative_to(ROOT)) for path in FILES}
    assert {"README.md", "SECURITY.md", "CONTRIBUTING.md", "docs/index.md"} <= names


@pytest.mark.parametrize("path", FILES, ids=[str(path.relative_to(ROOT)) for path in FILES])
def test_every_relative_link_resolves(path: Path):
    assert broken_links(path) == []


def test_every_make_target_the_docs_name_exists():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = {name for match in MAKE_TARGET.finditer(makefile) for name in match[1].split()}
    missing = []
    for path in FILES:
        for number, line, fenced in prose_lines(path.read_text(encoding="utf-8")):
            named = MAKE_IN_CODE.findall(line) if fenced else MAKE_IN_SPAN.findall(line)
            missing.extend(
                f"{path.relative_to(ROOT)}:{number}: make {name}"
                for name in named
                if name not in targets
            )
    assert missing == []


def test_the_checker_finds_broken_links_and_anchors(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## Faults: and `recovery`\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "[ok](docs/page.md) [ok](docs/page.md#faults-and-recovery) [ok](#top)\n"
        "[gone](docs/gone.md) [no anchor](docs/page.md#nope) ![img](docs/missing.png)\n"
        "`[code](docs/gone.md)` [web](https://example.org/x.md) [out](../../etc/passwd)\n"
        "```\n[fenced](docs/gone.md)\n```\n# Top\n"
    )
    problems = broken_links(readme, root=tmp_path)
    assert [problem.split(": ")[1] for problem in problems] == [
        "docs/gone.md",
        "docs/page.md#nope",
        "docs/missing.png",
        "../../etc/passwd",
    ]


def test_the_docs_site_builds_strictly(tmp_path: Path):
    pytest.importorskip("mkdocs")
    config, site = str(ROOT / "mkdocs.yml"), str(tmp_path / "site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f", config, "-d", site],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
