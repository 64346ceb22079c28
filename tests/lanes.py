"""The README's test command (``make test``): both lanes of the suite, always both, at
once, and one last line that counts them.

1. **parallel**: everything but the sandbox's tests and the soak, in pytest-xdist
   workers (one a core by default: the machines we run on have two, shared);
2. **sandbox**: the code sandbox's tests, one at a time (they check the whole machine
   for leftovers of the sandbox's uid, which the first lane never makes).

The two run side by side (the sandbox's tests wait on guests more than they compute);
the first lane's output is shown as it comes, the second's after it. A failure in one
never stops the other. ``--serial`` runs them one after the other instead.

    python -m tests.lanes [--workers N] [--serial] [PYTEST ARGS...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

LANES = (
    ("parallel", ["-m", "not sandbox and not soak"], True),
    ("sandbox", ["-m", "sandbox"], False),
)
SLOWEST = "--durations=12"  # each lane lists its slowest tests: where the time goes
# pytest's last line: "== 3 failed, 760 passed, 2 skipped in 421.49s (0:07:01) =="
SUMMARY = re.compile(r"=+ (.*?) in ([\d.]+)s")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)")


@dataclass
class Lane:
    """One lane's pytest, its output read by a thread: shown as it comes once the lane
    is ``shown``, kept until then."""

    name: str
    arguments: list[str]
    process: subprocess.Popen[str] | None = None
    kept: list[str] = field(default_factory=list)
    shown: bool = False
    summary: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    code: int = 0
    started: float = 0.0
    ended: float = 0.0
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _reader: threading.Thread | None = None

    def start(self) -> None:
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pytest", *self.arguments],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            if SUMMARY.search(line):
                self.summary = line
            with self._lock:
                if self.shown:
                    _say(line)
                else:
                    self.kept.append(line)
        self.ended = time.monotonic()  # (its own end: the other lane may still be shown)

    def show(self) -> None:
        """From now on its output goes to stdout, what it kept first."""
        with self._lock:
            _say(f"-- {self.name} lane: pytest {' '.join(self.arguments)}\n")
            for line in self.kept:
                _say(line)
            self.kept.clear()
            self.shown = True

    def wait(self) -> None:
        assert self.process is not None and self._reader is not None
        self.code = self.process.wait()
        self._reader.join()
        self.seconds = self.ended - self.started
        for number, kind in COUNT.findall(self.summary):
            self.counts[kind.rstrip("s") if kind.startswith("error") else kind] = int(number)

    def line(self) -> str:
        said = ", ".join(f"{n} {k}" for k, n in self.counts.items() if k != "deselected")
        return f"{self.name} lane: {said or 'nothing ran'} in {_minutes(self.seconds)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.lanes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 2, help="the first lane's (default: cores)"
    )
    parser.add_argument("--serial", action="store_true", help="one lane after the other")
    args, pytest_args = parser.parse_known_args(argv)
    lanes = []
    for name, marker, parallel in LANES:
        extra = ["-n", str(args.workers)] if parallel and args.workers > 1 else []
        lanes.append(Lane(name, [*marker, *extra, SLOWEST, *pytest_args]))
    started = time.monotonic()
    if args.serial:
        for lane in lanes:
            lane.start()
            lane.show()
            lane.wait()
    else:
        for lane in lanes:
            lane.start()
        for lane in lanes:  # the first shown as it runs, the second once the first ends
            lane.show()
            lane.wait()
    print()
    for lane in lanes:
        print(lane.line())
    print(verdict(lanes, time.monotonic() - started))
    return 0 if passed(lanes) else 1


def passed(lanes: list[Lane]) -> bool:
    return all(lane.code in (0, 5) for lane in lanes)  # (5: nothing selected)


def verdict(lanes: list[Lane], seconds: float) -> str:
    """The last line: whether both passed, and what they ran together."""
    totals: dict[str, int] = {}
    for lane in lanes:
        for kind, number in lane.counts.items():
            totals[kind] = totals.get(kind, 0) + number
    both = ", ".join(f"{n} {k}" for k, n in totals.items() if k != "deselected")
    said = "passed" if passed(lanes) else "FAILED"
    return f"make test {said}: both lanes, {both or 'nothing ran'} in {_minutes(seconds)}"


def _say(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


if __name__ == "__main__":
    sys.exit(main())
