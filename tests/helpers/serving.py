"""``speceyes serve`` in a subprocess, as an operator runs it, for the tests of the whole
server (signals, logs)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from lab.ports import reserved_port
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
SPECEYES = [sys.executable, "-m", "cli.main"]


@dataclass
class Served:
    process: subprocess.Popen
    base: str  # http://127.0.0.1:PORT
    key: str  # a key of the server's store
    stderr_path: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


@contextmanager
def served(tmp_path: Path, env: dict[str, str], *flags: str) -> Iterator[Served]:
    """A key made in the store ``env`` (or ``flags``' --db) names, then ``speceyes serve
    FLAGS`` on a port held for it, once it answers; killed afterwards if still running."""
    db = [flags[flags.index("--db") + 1]] if "--db" in flags else []
    made = subprocess.run(
        [*SPECEYES, "keys", "create", "test", *(["--db", *db] if db else [])],
        env=env,
        capture_output=True,
        check=True,
    )
    key = made.stdout.decode().splitlines()[0]
    with reserved_port() as port:  # held until the server is gone
        stderr_path = tmp_path / "serve-stderr.txt"
        with stderr_path.open("wb") as stderr:
            process = subprocess.Popen(
                [*SPECEYES, "serve", *flags, "--port", str(port)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        server = Served(process, f"http://127.0.0.1:{port}", key, stderr_path)
        try:
            wait_until(
                lambda: _answers(server.base) or process.poll() is not None,
                deadline_s=60,
                what="the server to answer",
            )
            assert process.poll() is None, server.stderr()[-3000:]
            yield server
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz").status_code == 200
    except httpx.HTTPError:
        return False
