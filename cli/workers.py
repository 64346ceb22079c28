"""``speceyes workers``: a fleet of workers on this machine, kept running until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from cli.options import add_settings, require_shared_store, settings_from_args
from common.errors import ConfigurationError

DESCRIPTION = """\
Start --fast N fast workers and --slow M slow workers (`speceyes worker fast|slow`) on
this machine, against the broker and the job store the settings name (SPECEYES_BROKER_URL
or --broker, SPECEYES_DATABASE_URL or --db: PostgreSQL), with every other setting from
the environment as it is (models, threshold, key prefix). A worker that exits is started
again (after a second, doubling to a minute while it keeps failing). Ctrl-C or SIGTERM
stops them all with a warm shutdown (their running work is finished and recorded), then
this command exits.

The distributed pipeline on one machine, without Docker (docs/operations.md):

  export SPECEYES_DATABASE_URL=postgresql+psycopg://127.0.0.1/speceyes
  export SPECEYES_BROKER_URL=redis://127.0.0.1:6379/0 SPECEYES_BROKER_KEY_PREFIX=speceyes:
  speceyes db upgrade
  speceyes workers --fast 1 --slow 2 &
  speceyes annotate samples/manifest.jsonl --out answers.jsonl
"""
STOP_WAIT_S = 60.0  # a warm shutdown finishes a trajectory: then they are killed
RESTART_AFTER_S = (1.0, 60.0)  # the first wait before a restart, and the longest


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--fast", type=int, default=1, metavar="N", help="fast workers (1)")
    parser.add_argument("--slow", type=int, default=1, metavar="M", help="slow workers (1)")
    add_settings(parser, "broker.url", "database_url")
    parser.set_defaults(run=run)


@dataclass
class _Worker:
    name: str
    pool: str
    process: subprocess.Popen[bytes] | None = None
    failures: int = 0
    restart_at: float = field(default=0.0)

    def start(self, environment: dict[str, str]) -> None:
        command = [sys.executable, "-m", "cli.main", "worker", self.pool, "--name", self.name]
        self.process = subprocess.Popen(command, env=environment)
        print(f"started {self.name} (pid {self.process.pid})", flush=True)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if not settings.broker.url:
        raise ConfigurationError(
            "workers need a broker: --broker redis://HOST:6379/0 or SPECEYES_BROKER_URL"
        )
    require_shared_store(settings)
    if args.fast < 0 or args.slow < 0 or args.fast + args.slow == 0:
        raise ConfigurationError("--fast and --slow: how many of each, at least one in all")
    environment = {
        **os.environ,
        "SPECEYES_BROKER_URL": settings.broker.url,
        "SPECEYES_DATABASE_URL": settings.database_url,
    }
    host = os.uname().nodename
    fleet = [_Worker(f"fast-{i + 1}@{host}", "fast") for i in range(args.fast)]
    fleet += [_Worker(f"slow-{i + 1}@{host}", "slow") for i in range(args.slow)]
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    for worker in fleet:
        worker.start(environment)
    print("Ctrl-C stops them all", flush=True)
    try:
        while not stopping:
            _keep_running(fleet, environment)
            time.sleep(0.2)  # (a supervisor's tick: nothing to wait on but time)
    except KeyboardInterrupt:
        pass
    return _stop_all(fleet)


def _keep_running(fleet: list[_Worker], environment: dict[str, str]) -> None:
    """Start again the workers that exited, each after its backoff."""
    now = time.monotonic()
    for worker in fleet:
        process = worker.process
        if process is None or process.poll() is None:
            if process is None and now >= worker.restart_at:
                worker.start(environment)
            continue
        worker.failures = worker.failures + 1 if process.returncode else 0
        low, high = RESTART_AFTER_S
        wait_s = min(high, low * 2 ** max(0, worker.failures - 1))
        print(
            f"{worker.name} exited ({process.returncode}); starting it again in {wait_s:.0f} s",
            flush=True,
        )
        worker.process, worker.restart_at = None, now + wait_s


def _stop_all(fleet: list[_Worker]) -> int:
    """A warm shutdown of each (SIGTERM), then SIGKILL for those still running."""
    running = [w.process for w in fleet if w.process is not None and w.process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    print(f"stopped {len(running)} worker(s)", flush=True)
    return 0
