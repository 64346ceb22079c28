"""The ``deployment`` fixture: make isolated distributed deployments
(``tests.helpers.deployment``), closed afterwards."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.deployment import Deployment


@pytest.fixture
def deployment(broker_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """make(**settings): a deployment whose SPECEYES_<NAME> variables include these."""
    for key in [key for key in os.environ if key.startswith("SPECEYES_")]:
        monkeypatch.delenv(key)
    made: list[Deployment] = []

    def make(**settings: str) -> Deployment:
        env = {**broker_env, **{f"SPECEYES_{k.upper()}": v for k, v in settings.items()}}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        made.append(Deployment(env, tmp_path))
        return made[-1]

    yield make
    for one in made:
        one.close()
