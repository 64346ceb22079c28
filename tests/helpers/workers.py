"""``speceyes worker POOL`` as a subprocess, for the distributed pipeline's tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.helpers.waiting import wait_until


class WorkerProcess:
    """``speceyes worker POOL`` in a subprocess with the given SPECEYES_* environment."""

    def __init__(self, pool: str, env: dict[str, str], log_path, *extra: str) -> None:
        self.log_path = log_path
        self.log = open(log_path, "ab")  # noqa: SIM115 -- closed in stop()
        command = [sys.executable, "-m", "cli.main", "worker", pool, "--loglevel", "INFO", *extra]
        self.process = subprocess.Popen(
            command, env={**os.environ, **env}, stdout=self.log, stderr=subprocess.STDOUT
        )

    def ready(self) -> bool:
        return b"ready." in self.log_path.read_bytes()

    def wait_ready(self, deadline_s: float = 60.0) -> None:
        wait_until(
            lambda: self.ready() or self.process.poll() is not None,
            deadline_s=deadline_s,
            what="the worker to start",
        )
        assert self.process.poll() is None, self.log_path.read_text()[-3000:]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.wait_stopped()

    def wait_stopped(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.wait(timeout=20)
            except Exception:
                self.process.kill()
                self.process.wait()
        self.log.close()
