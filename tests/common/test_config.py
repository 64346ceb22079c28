from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from common.config import Settings


def test_environment_variables_with_the_prefix_set_fields(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPECEYES_GATE_THRESHOLD", "0.97")
    monkeypatch.setenv("SPECEYES_SMALL_MODEL", "tiny")
    monkeypatch.setenv("SPECEYES_CACHE_DIR", "~/somewhere")
    settings = Settings()
    assert settings.gate.threshold == 0.97
    assert settings.small_model == "tiny"
    assert settings.cache_dir == Path("~/somewhere").expanduser()


def test_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPECEYES_GATE_MODE", "mean")
    assert Settings(gate_mode="bottom20").gate.mode == "bottom20"


@pytest.mark.parametrize(
    "bad", [{"gate_threshold": 1.5}, {"gate_mode": "max"}, {"gate_top_k": 1}, {"screener": "x"}]
)
def test_invalid_values_are_refused_at_start_up(bad):
    with pytest.raises(ValidationError):
        Settings(**bad)


def test_defaults_are_the_papers():
    settings = Settings()
    assert (settings.gate.mode, settings.gate.top_k, settings.gate.threshold) == ("min", 64, 0.98)
    assert settings.agent_max_steps == 6 and settings.screener == "large"
