"""The ``api`` fixture: make apps over fresh PostgreSQL databases (closed afterwards)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.api import Api


@pytest.fixture
def api(tmp_path: Path, postgres_url: str):
    made: list[Api] = []

    def make(**settings) -> Api:
        made.append(Api(tmp_path / str(len(made)), postgres_url, **settings))
        return made[-1]

    yield make
    for one in made:
        one.close()
