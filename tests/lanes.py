"""The README's test command (``make test``): both lanes of the suite, always both, and
one last line that counts them.

1. **parallel**: everything but the sandbox's tests and the soak, in pytest-xdist
   workers (one a core by default: the machines we run on have two, shared);
2. **sandbox**: the code sandbox's tests, one at a time (they check the whole machine
   for leftovers), run even when the first lane failed, so that a failure there never
   hides the sandbox's half.

    python -m tests.lanes [--workers N] [PYTEST ARGS...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

LANES = (
    ("parallel", ["-m", "not sandbox and not soak"], True),
    ("sandbox", ["-m", "sandbox"], False),
)
# pytest's last line: "== 3 failed, 760 passed, 2 skipped in 421.49s (0:07:01) =="
SUMMARY = re.compile(r"=+ (.*?) in ([\d.]+)s")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)")


@dataclass
class Lane:
    name: str
    code: int
    counts: dict[str, int]
    seconds: float

    def line(self) -> str:
        said = ", ".join(f"{n} {k}" for k, n in self.counts.items() if k != "deselected")
        return f"{self.name} lane: {said or 'nothing ran'} in {_minutes(self.seconds)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lanes", description=__doc__)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args, pytest_args = parser.parse_known_args(argv)
    lanes = []
    started = time.monotonic()
    for name, marker, parallel in LANES:
        extra = ["-n", str(args.workers)] if parallel and args.workers > 1 else []
        lanes.append(_run(name, [*marker, *extra, *pytest_args]))
    failed = any(lane.code not in (0, 5) for lane in lanes)  # (5: nothing selected)
    totals: dict[str, int] = {}
    for lane in lanes:
        for kind, number in lane.counts.items():
            totals[kind] = totals.get(kind, 0) + number
    print()
    for lane in lanes:
        print(lane.line())
    verdict = "FAILED" if failed else "passed"
    both = ", ".join(f"{n} {k}" for k, n in totals.items() if k != "deselected")
    print(f"make test {verdict}: both lanes, {both} in {_minutes(time.monotonic() - started)}")
    return 1 if failed else 0


def _run(name: str, arguments: list[str]) -> Lane:
    print(f"-- {name} lane: pytest {' '.join(arguments)}", flush=True)
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", *arguments], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    last = ""
    for line in process.stdout:  # shown as it comes, the last summary kept
        sys.stdout.write(line)
        sys.stdout.flush()
        if SUMMARY.search(line):
            last = line
    code = process.wait()
    counts: dict[str, int] = {}
    for number, kind in COUNT.findall(last):
        counts[kind.rstrip("s") if kind.startswith("error") else kind] = int(number)
    return Lane(name, code, counts, time.monotonic() - started)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


if __name__ == "__main__":
    sys.exit(main())
