"""Test helpers that control what a real (tiny) model says."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class ForceText:
    """A logits processor that makes generate() write the given texts, one per call.

    Each new generate() call (seen as an input that did not grow by one token) takes the
    next text; after its tokens come EOS. Only the *processed* scores are forced: the raw
    logits a backend records stay the model's own.
    """

    def __init__(self, tokenizer, texts: Sequence[str], eos_id: int) -> None:
        self.targets = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
        self.eos_id = eos_id
        self.call = -1
        self.prompt_length = 0
        self.last_length = -1

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        if length != self.last_length + 1:  # a new generate() call
            self.call += 1
            self.prompt_length = length
        self.last_length = length
        target = self.targets[min(self.call, len(self.targets) - 1)]
        position = length - self.prompt_length
        token = target[position] if position < len(target) else self.eos_id
        forced = torch.full_like(scores, float("-inf"))
        forced[:, token] = 0.0
        return forced


def wait_until(predicate, *, deadline_s: float, every_s: float = 0.1, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail after ``deadline_s``."""
    import time

    end = time.monotonic() + deadline_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline_s} s waiting for {what}")
        time.sleep(every_s)


class WorkerProcess:
    """``speceyes worker POOL`` in a subprocess with the given SPECEYES_* environment."""

    def __init__(self, pool: str, env: dict[str, str], log_path, *extra: str) -> None:
        import os
        import subprocess
        import sys

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
        import signal

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
