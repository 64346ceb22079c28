"""An app over a fresh PostgreSQL database with a key, and requests the API tests make."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.app import create_app
from api.client import SpecEyesClient
from common.config import Settings
from common.pipeline.dispatch import StoreOnly
from common.store.db import open_store
from common.store.keys import create_key
from common.store.tables import Job
from workers.queues import CeleryDispatcher


class Api:
    """An app over a fresh PostgreSQL database, a key, and what it enqueued."""

    def __init__(self, tmp_path: Path, database_url: str, **settings) -> None:
        self.root = tmp_path / "root"
        self.root.mkdir(parents=True)
        settings = {"image_roots": [self.root], **settings}
        self.settings = Settings(
            database_url=database_url, upload_dir=tmp_path / "uploads", **settings
        )
        self.sessions = open_store(database_url)
        with self.sessions.begin() as session:
            self.key = create_key(session, "tests")[1]
        # what the API sent on: a broker when the test names one, else a recording stand-in
        self.dispatcher = (
            CeleryDispatcher(self.settings) if self.settings.broker.url else StoreOnly()
        )
        app = create_app(self.settings, sessions=self.sessions, dispatcher=self.dispatcher)
        self.http = TestClient(app)
        self.http.__enter__()
        self.http.headers["Authorization"] = f"Bearer {self.key}"
        self.client = SpecEyesClient(http=self.http)

    @property
    def enqueued(self) -> list[str]:
        return self.dispatcher.sent_fast

    def key_for(self, name: str, **options) -> dict[str, str]:
        """Headers with a new key (``tenant=``, ``admin=``) of this app's store."""
        with self.sessions.begin() as session:
            return {"Authorization": f"Bearer {create_key(session, name, **options)[1]}"}

    def jobs(self) -> int:
        with self.sessions() as session:
            return session.scalar(select(func.count()).select_from(Job)) or 0

    def close(self) -> None:
        self.http.__exit__(None, None, None)
        self.sessions.close()


def upload(api: Api, data: bytes, question: str = "What colour?", **form) -> object:
    return api.http.post(
        "/v1/jobs", data={"question": question, **form}, files={"image": ("a.png", data)}
    )


def refused(response, status: int, error: str) -> None:
    """``response`` is an error answer of ``status`` with ``error``, in the one shape."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error", "detail"} and body["error"] == error, body
