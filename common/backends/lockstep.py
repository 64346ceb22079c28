"""Many trajectories, one batched ``generate``: the in-process model as a shared engine.

One agentic trajectory cannot be batched, but the steps of several can: N threads each
run a trajectory (the embedded runner's agent workers, a slow worker's ``--concurrency``),
and their ``generate`` calls meet here. A step runs as soon as every trajectory in flight
is waiting for one (or after ``max_wait_s``, so that one busy in a tool does not hold
the others), as ONE left-padded ``generate`` over all the waiting conversations, each
rendered as it would be alone (its own continuation), each cut at its own stop string.
Under greedy decoding the trajectories are those the model gives one by one.

Calls that cannot share a ``generate`` (other stop strings, token budgets or ends) run in
separate groups, one after the other. Screening and speculation pass through.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from common.backends.base import Generation
from common.chat import Conversation


@dataclass
class _Request:
    conversation: Conversation
    stop: tuple[str, ...]
    max_new_tokens: int
    ignore_eos: bool = False
    result: Generation | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Lockstep:
    """Wraps a ``TransformersModel``; every other attribute is the model's own."""

    def __init__(self, model: Any, *, max_batch: int = 8, max_wait_s: float = 0.1) -> None:
        self.model = model
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.batch_sizes: list[int] = []  # what each generate ran over (for benches, tests)
        self._lock = threading.Condition()
        self._waiting: list[_Request] = []
        self._active = 0
        self._running = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    @contextmanager
    def trajectory(self) -> Iterator[None]:
        """Counts a trajectory in flight while it runs (the steps to wait for)."""
        with self._lock:
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                self._lock.notify_all()

    def generate(
        self,
        conversation: Conversation,
        *,
        stop: Sequence[str],
        max_new_tokens: int,
        ignore_eos: bool = False,
    ) -> Generation:
        request = _Request(conversation, tuple(stop), max_new_tokens, ignore_eos)
        arrived = time.monotonic()
        with self._lock:
            self._waiting.append(request)
            self._lock.notify_all()
            while not request.done.is_set():
                ready = len(self._waiting) >= max(1, self._active)
                late = time.monotonic() - arrived >= self.max_wait_s
                if not self._running and self._waiting and (ready or late):
                    self._run_batch()  # leads one step for everyone waiting
                    continue
                self._lock.wait(timeout=self.max_wait_s / 4)
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def _run_batch(self) -> None:
        """Called with the lock held: take one group of waiting requests, run them with
        the lock released, hand out the results."""
        first = self._waiting[0]
        same = (first.stop, first.max_new_tokens, first.ignore_eos)
        group = [r for r in self._waiting if (r.stop, r.max_new_tokens, r.ignore_eos) == same]
        group = group[: self.max_batch]
        for request in group:
            self._waiting.remove(request)
        self._running = True
        self._lock.release()
        try:
            self._generate(group)
        finally:
            self._lock.acquire()
            self._running = False
            self._lock.notify_all()

    def _generate(self, group: list[_Request]) -> None:
        model = self.model
        started = time.perf_counter()
        try:
            rows = model._generate(
                [r.conversation.messages for r in group],
                max_new_tokens=group[0].max_new_tokens,
                stop=group[0].stop,
                end_ids=[] if group[0].ignore_eos else model.turn_end_ids,
                rendered=[
                    model.render(r.conversation.messages, r.conversation.continue_cut)
                    for r in group
                ],
            )
        except Exception as exc:
            if len(group) == 1:
                group[0].error = exc
                group[0].done.set()
                return
            for request in group:  # one bad conversation fails alone, not its batch
                self._generate([request])
            return
        self.batch_sizes.append(len(group))
        share = (time.perf_counter() - started) / len(group)  # (each its part of the call)
        for request, row in zip(group, rows, strict=True):
            request.result = Generation(
                row.text,
                row.finish_reason,
                len(row.token_ids),
                prompt_tokens=row.prompt_tokens,
                seconds=share,
            )
            request.done.set()
