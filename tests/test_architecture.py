"""The code's shape: no import cycle among our modules, function-level imports included.

(The layering, common below api, workers and cli, is import-linter's: `make lint` runs
it with the contracts in pyproject.toml, and this file checks that they are there.)
A cycle hidden in a function-level import is still a cycle: two modules that can only be
understood, tested and changed together. ``TYPE_CHECKING`` imports do not count (they
never run).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "api", "workers", "cli", "lab")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _runtime_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement but those under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from the package upwards
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            graph[name] |= {target for target in targets if target in modules and target != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_among_our_modules():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_layering_is_a_contract_make_lint_checks():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = config["contracts"]
    forbidden = {
        c["source_modules"][0]: set(c["forbidden_modules"])
        for c in contracts
        if "source_modules" in c
    }
    assert {"api", "workers", "cli", "lab"} <= forbidden["common"]
    assert {"workers", "cli"} <= forbidden["api"]
    assert {"common.pipeline.dispatch", "common.pipeline.submit"} <= forbidden["common.evaluation"]
    assert "common.pipeline" in forbidden["common.sources"]
    assert "common.config" in forbidden["common.sandbox.guest"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    named = {name.strip() for layer in layers for name in layer.split("|")}
    packages = {p.name for p in (ROOT / "common").iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in (ROOT / "common").glob("*.py")} - {"__init__"}
    assert {f"common.{name}" for name in packages | modules} == named  # (every one placed)
    assert layers.index("common.evaluation") < layers.index("common.pipeline")  # (above it)
    assert layers.index("common.pipeline") < layers.index("common.sources")  # (below it)
    assert "lint-imports" in (ROOT / "Makefile").read_text()


# what common/ keeps at its root: the core types (docs/architecture.md)
MOST_ROOT_MODULES = 10
MOST_LINES = 420
# model-facing strings, kept as data in one place per protocol (not split by size)
PROTOCOL_STRINGS = {"common/protocols/reference.py", "common/protocols/thyme.py"}


def test_common_keeps_its_root_small_and_its_modules_readable():
    root = sorted(p.name for p in (ROOT / "common").glob("*.py") if p.name != "__init__.py")
    assert len(root) <= MOST_ROOT_MODULES, root
    long = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for path in (ROOT / "common").rglob("*.py")
        if len(path.read_text().splitlines()) > MOST_LINES
    }
    assert set(long) <= PROTOCOL_STRINGS, long


# The function-level imports there are, each for a reason the module states: the code
# run inside the sandbox imports what it may only after it is sealed, and only the
# in-process backend loads torch and transformers (and only building the tiny checkpoints
# does, when a model is named). Anything else is imported at the top
# (a command's cost is paid by loading its module only when it runs: cli.main).
LATE_IMPORTS_ALLOWED = {
    "common/backends/__init__.py": {"common.backends.transformers_backend"},
    # the tiny checkpoints are built with torch; submitting a corpus names models only
    "common/models/registry.py": {"common.models.tiny"},
    "common/sandbox/guest/harness.py": None,  # (any: the guest's own start-up order)
    "common/sandbox/guest/rewrite.py": None,
}


def _late_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import | ast.ImportFrom) and inside:
                names = [a.name for a in child.names] if isinstance(child, ast.Import) else []
                found.update(names or [child.module or "."])
            visit(child, inside or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(tree, False)
    return found


def test_imports_are_at_the_top_but_where_a_reason_is_written_down():
    late = {}
    for path in sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py")):
        name = str(path.relative_to(ROOT))
        found = _late_imports(path)
        allowed = LATE_IMPORTS_ALLOWED.get(name, set())
        if found and allowed is not None and not found <= allowed:
            late[name] = sorted(found - allowed)
    assert late == {}


def test_tests_share_helpers_never_each_other():
    """What tests share lives in tests/helpers; a test file or a conftest is imported by
    pytest alone."""
    borrowed = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if "outside" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
                last = node.module.rsplit(".", 1)[-1]
                if last.startswith("test_") or last == "conftest":
                    borrowed[str(path.relative_to(ROOT))] = node.module
    assert borrowed == {}
