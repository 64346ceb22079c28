"""The OpenAI batches' completion windows, kept in every API process: a thread that
expires, every few seconds, the batches whose window closed with requests unfinished
(``common.store.openai_batches.expire_due``). Where workers run, their reconciler does
it too; an expiry taken twice changes nothing (rows are locked, and a batch expires once).
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from common.store import openai_batches

log = logging.getLogger(__name__)


class WindowKeeper:
    def __init__(self, sessions: sessionmaker[Session], interval_s: float = 2.0) -> None:
        self.sessions = sessions
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="openai-windows", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def tick(self) -> list[str]:
        """One pass: the ids of the batches expired now."""
        with self.sessions.begin() as session:
            return openai_batches.expire_due(session)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                expired = self.tick()
            except SQLAlchemyError as exc:  # (the store is away: the next pass)
                log.warning("completion windows not checked: %s", exc)
                continue
            if expired:
                log.info("%d OpenAI batch(es) expired: %s", len(expired), ", ".join(expired))
