"""Mutation testing of the modules that carry our promises (``make mutate``).

    python -m tests.mutation promises          # each documented promise's own mutant
    python -m tests.mutation modules [NAME...]  # cosmic-ray over the promise modules
    python -m tests.mutation report [NAME...]   # the counts so far, and what survived

Both change files of the tree while they run and put them back after each mutant; a
module with changes not yet committed is refused (a mutant left by a killed run is
then undone with ``git checkout`` of that file alone). cosmic-ray's sessions are kept
in ``.mutation/`` (not committed), so a run stopped halfway goes on where it stopped.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tests.mutation.equivalent import EQUIVALENT
from tests.mutation.modules import EXCLUDED_OPERATORS, MODULES, Module
from tests.mutation.promises import PROMISES

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / ".mutation"
PYTEST = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
# pytest's exit codes that mean the row is wrong, not that the mutant lived or died
NOT_RUN = {4: "a test named does not exist", 5: "no test was collected"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("promises", help="run each documented promise's mutant")
    for name, text in (
        ("modules", "run cosmic-ray"),
        ("report", "count and list survivors"),
        ("recheck", "run each survivor of the last run again, against today's tests"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("names", nargs="*", help="modules (default: all)")
    args = parser.parse_args(argv)
    if args.command == "promises":
        return run_promises()
    chosen = [m for m in MODULES if not args.names or m.name in args.names]
    if args.command == "modules":
        for module in chosen:
            run_module(module)
    if args.command == "recheck":
        return max((recheck(module) for module in chosen), default=0)
    return report(chosen)


# -- the promises ------------------------------------------------------------------------
def run_promises() -> int:
    """Each promise's change must make one of its tests fail."""
    survived = 0
    for number, promise in enumerate(PROMISES, 1):
        path = REPO / promise.path
        _refuse_if_changed(promise.path)
        original = path.read_text()
        if original.count(promise.old) != 1:
            print(
                f"{number:2d} BROKEN ROW  {promise.promise}: the text to change is not there once"
            )
            survived += 1
            continue
        mutant = original.replace(promise.old, promise.new)
        if path.suffix == ".py":
            try:  # (a mutant that does not compile proves nothing)
                compile(mutant, str(path), "exec")
            except SyntaxError as exc:
                print(
                    f"{number:2d} BROKEN ROW  {promise.promise}: the mutant is not Python ({exc})"
                )
                survived += 1
                continue
        started = time.monotonic()
        try:
            path.write_text(mutant)
            done = subprocess.run([*PYTEST, *promise.tests], cwd=REPO, capture_output=True)
        finally:
            path.write_text(original)
        verdict = NOT_RUN.get(done.returncode, "killed" if done.returncode else "SURVIVED")
        survived += verdict != "killed"
        seconds = time.monotonic() - started
        print(f"{number:2d} {verdict:8s} {seconds:5.1f} s  {promise.promise}")
    print(f"{len(PROMISES) - survived} of {len(PROMISES)} promises' mutants killed")
    return 1 if survived else 0


# -- cosmic-ray over the modules -----------------------------------------------------------
def run_module(module: Module) -> None:
    _refuse_if_changed(module.path)
    WORK.mkdir(exist_ok=True)
    config, session = WORK / f"{module.name}.toml", WORK / f"{module.name}.sqlite"
    config.write_text(_config(module))
    if not session.exists():
        _cosmic(["cosmic-ray", "init", str(config), str(session)])
        _cosmic(["cr-filter-operators", str(session), str(config)])
        _cosmic(["cr-filter-pragma", str(session)])
    print(f"{module.name}: mutating {module.path} ...", flush=True)
    started = time.monotonic()
    try:
        _cosmic(["cosmic-ray", "exec", str(config), str(session)])
    finally:  # (whatever stopped it: the file as committed)
        subprocess.run(["git", "checkout", "--", module.path], cwd=REPO, check=True)
    print(f"{module.name}: {time.monotonic() - started:.0f} s", flush=True)


def _config(module: Module) -> str:
    command = " ".join([*PYTEST[1:], *module.tests])
    excluded = ", ".join(json.dumps(pattern) for pattern in EXCLUDED_OPERATORS)
    return (
        "[cosmic-ray]\n"
        f'module-path = "{module.path}"\n'
        f"timeout = {module.timeout_s}\n"
        "excluded-modules = []\n"
        f'test-command = "{sys.executable} {command}"\n\n'
        '[cosmic-ray.distributor]\nname = "local"\n\n'
        "[cosmic-ray.filters.operators-filter]\n"
        f'exclude-operators = [{excluded}, "core/VariableInserter", "core/VariableReplacer"]\n'
    )


def _cosmic(command: list[str]) -> None:
    executable = Path(sys.executable).with_name(command[0])
    subprocess.run([str(executable), *command[1:]], cwd=REPO, check=True)


def report(modules: list[Module]) -> int:
    """The counts of each module's run (killed, survived, equivalent, timed out), the
    score over the mutants that are not equivalent, and each survivor."""
    totals: Counter[str] = Counter()
    lines = []
    for module in modules:
        session = WORK / f"{module.name}.sqlite"
        if not session.exists():
            continue
        counts, survivors = _outcomes(module, session)
        totals.update(counts)
        lines.append((module.name, counts))
        for survivor in survivors:
            print(f"  survived {module.name}: {survivor}")
    columns = ("killed", "survived", "equivalent", "timeout", "score")
    print(f"{'module':12s}", *(f"{column:>10s}" for column in columns))
    for name, counts in [*lines, ("all", totals)]:
        print(
            f"{name:12s}",
            *(f"{counts[column]:10d}" for column in columns[:-1]),
            f"{_score(counts):>10s}",
        )
    return 0


def _score(counts: Counter[str]) -> str:
    alive = counts["killed"] + counts["survived"] + counts["timeout"]
    return f"{100 * (counts['killed'] + counts['timeout']) / alive:.1f}%" if alive else "-"


def recheck(module: Module) -> int:
    """After a triage: each mutant that survived the module's last run, applied again (its
    diff, on the file as committed) under the tests as they are now. A survivor judged
    equivalent since is left out; one still alive is listed. 1 if any is."""
    session = WORK / f"{module.name}.sqlite"
    if not session.exists():
        return 0
    _refuse_if_changed(module.path)
    source = (REPO / module.path).read_text().splitlines()
    alive = 0
    for item, result in _dump(session):
        if result is None or result["worker_outcome"] != "normal":
            continue
        if result["test_outcome"] != "survived":
            continue
        row, operator, text = _mutated_line(item, result, source)
        if _equivalent(module.name, operator, text):
            continue
        applied = subprocess.run(
            ["git", "apply", "-p1", "-"],
            cwd=REPO,
            input=_as_git_diff(result["diff"], module.path),
            text=True,
            capture_output=True,
        )
        if applied.returncode:
            print(f"  no longer applies  line {row}: {text}")
            continue
        try:
            done = subprocess.run([*PYTEST, *module.tests], cwd=REPO, capture_output=True)
        finally:
            subprocess.run(["git", "checkout", "--", module.path], cwd=REPO, check=True)
        verdict = "killed" if done.returncode else "SURVIVED"
        alive += verdict == "SURVIVED"
        print(f"  {verdict:8s} line {row} {operator}: {text}", flush=True)
    print(f"{module.name}: {alive} survivor(s) still alive")
    return 1 if alive else 0


def _mutated_line(item: dict, result: dict, source: list[str]) -> tuple[int, str, str]:
    """Where a mutant is (its row), its operator, and the line as the mutant changed it
    (its diff's), not whatever stands at that row now."""
    mutation = item["mutations"][0]
    row = mutation["start_pos"][0]
    text = _changed_line(result["diff"]) or (source[row - 1].strip() if row <= len(source) else "")
    return row, mutation["operator_name"], text


def _changed_line(diff: str) -> str:
    """The first line a mutant's diff takes out, stripped ("" if none)."""
    for line in diff.splitlines():
        if line.startswith("-") and not line.startswith("---"):
            return line[1:].strip()
    return ""


def _as_git_diff(diff: str, path: str) -> str:
    """cosmic-ray's diff names the file by its path both sides; git apply wants a/ b/."""
    lines = diff.splitlines()
    body = [line for line in lines if not line.startswith(("---", "+++"))]
    return "\n".join([f"--- a/{path}", f"+++ b/{path}", *body]) + "\n"


def _dump(session: Path) -> list[tuple[dict, dict | None]]:
    dumped = subprocess.run(
        [str(Path(sys.executable).with_name("cosmic-ray")), "dump", str(session)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [tuple(json.loads(line)) for line in dumped.splitlines()]


def _outcomes(module: Module, session: Path) -> tuple[Counter[str], list[str]]:
    source = (REPO / module.path).read_text().splitlines()
    counts: Counter[str] = Counter()
    survivors = []
    for item, result in _dump(session):
        if result is None:
            counts["pending"] += 1
            continue
        if result["worker_outcome"] == "skipped":
            continue
        if result["worker_outcome"] != "normal":  # (abnormal: the test run itself broke)
            counts["killed"] += 1
            continue
        outcome = result["test_outcome"]
        if outcome == "killed":
            counts["timeout" if "timeout" in (result.get("output") or "") else "killed"] += 1
            continue
        row, operator, text = _mutated_line(item, result, source)
        if _equivalent(module.name, operator, text):
            counts["equivalent"] += 1
            continue
        counts["survived"] += 1
        survivors.append(f"line {row} {operator}: {text}")
    return counts, survivors


def _equivalent(module: str, operator: str, text: str) -> bool:
    return any(
        module == e.module and e.line in text and re.match(e.operator, operator) for e in EQUIVALENT
    )


def _refuse_if_changed(path: str) -> None:
    changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", path], cwd=REPO)
    if changed.returncode:
        sys.exit(f"{path} has changes not committed: commit them first (mutants change it)")


if __name__ == "__main__":
    sys.exit(main())
