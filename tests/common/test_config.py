from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from common.config import AgentSettings, GateSettings, Settings, configuration_markdown, leaves


def test_environment_variables_with_the_prefix_set_fields(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPECEYES_GATE_THRESHOLD", "0.97")
    monkeypatch.setenv("SPECEYES_SMALL_MODEL", "tiny")
    monkeypatch.setenv("SPECEYES_CACHE_DIR", "~/somewhere")
    settings = Settings()
    assert settings.funnel.gate.threshold == 0.97
    assert settings.models.small.name == "tiny"
    assert settings.models.cache_dir == Path("~/somewhere").expanduser()


def test_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPECEYES_GATE_MODE", "mean")
    assert Settings(gate_mode="bottom20").funnel.gate.mode == "bottom20"


@pytest.mark.parametrize(
    "bad", [{"gate_threshold": 1.5}, {"gate_mode": "max"}, {"gate_top_k": 1}, {"screener": "x"}]
)
def test_invalid_values_are_refused_at_start_up(bad):
    with pytest.raises(ValidationError):
        Settings(**bad)


def test_defaults_are_the_papers():
    settings = Settings()
    gate = settings.funnel.gate
    assert (gate.mode, gate.top_k, gate.threshold) == ("min", 64, 0.98)
    assert settings.agent.max_steps == 6 and settings.funnel.screener == "large"


def test_every_setting_is_documented_and_has_one_name():
    found = list(leaves())
    assert all(leaf.field.description for leaf in found), [
        leaf.path for leaf in found if not leaf.field.description
    ]
    names = [leaf.env for leaf in found]
    assert len(names) == len(set(names))
    flags = [leaf.extra["flag"] for leaf in found if "flag" in leaf.extra]
    assert len(flags) == len(set(flags))


def test_docs_configuration_is_generated_from_the_fields():
    page = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
    assert page.read_text() == configuration_markdown(), (
        "docs/configuration.md is stale: .venv/bin/speceyes config --markdown "
        "> docs/configuration.md"
    )


@pytest.mark.parametrize(
    ("variable", "value", "path", "expected"),
    [  # the names the service has always read keep working
        ("SPECEYES_SANDBOX_WALL_S", "3", "agent.sandbox.wall_s", 3.0),
        ("SPECEYES_ALLOW_UNSANDBOXED_CODE", "true", "agent.sandbox.allow_unsandboxed_code", True),
        ("SPECEYES_AGENT", "thyme", "agent.kind", "thyme"),
        ("SPECEYES_AGENT_WORKERS", "4", "agent.workers", 4),
        ("SPECEYES_LARGE_SERVER_URL", "http://gpu:8000/v1", "models.large.server_url", None),
        ("SPECEYES_BROKER_URL", "redis://r:6379/0", "broker.url", "redis://r:6379/0"),
        ("SPECEYES_FAST_QUEUE", "q.fast", "broker.fast_queue", "q.fast"),
        ("SPECEYES_MAX_IMAGE_PIXELS", "123", "images.max_pixels", 123),
        ("SPECEYES_API_PORT", "9000", "api.port", 9000),
        ("SPECEYES_IMAGE_ROOTS", '["/data"]', "api.image_roots", [Path("/data")]),
        ("SPECEYES_MAX_ATTEMPTS", "5", "recovery.max_attempts", 5),
        ("SPECEYES_AUDIT_ON_DRIFT", "pause", "audit.on_drift", "pause"),
        ("SPECEYES_DATABASE_URL", "sqlite:///x.db", "database_url", "sqlite:///x.db"),
    ],
)
def test_each_variable_sets_its_setting(monkeypatch, variable, value, path, expected):
    monkeypatch.setenv(variable, value)
    found = Settings()
    for part in path.split("."):
        found = getattr(found, part)
    assert found == (value if expected is None else expected)


def test_settings_are_given_by_flat_name_or_path_and_replaced_alike():
    settings = Settings(gate_threshold=0.9, **{"funnel.screener": "small"})
    assert settings.funnel.gate.threshold == 0.9 and settings.funnel.screener == "small"
    changed = settings.replace(baseline=True, **{"agent.max_steps": 2})
    assert changed.funnel.baseline and changed.agent.max_steps == 2
    assert changed.funnel.gate.threshold == 0.9  # the rest as it was


@pytest.mark.parametrize("update", [{"baseline": True}, {"funnel": None, "max_steps": 2}])
def test_a_copy_by_a_name_that_is_not_a_field_is_refused(update):
    """pydantic's model_copy would set the stray name and change nothing the code reads."""
    with pytest.raises(TypeError, match=r"use Settings\.replace"):
        Settings().model_copy(update=update)
    with pytest.raises(TypeError, match="AgentSettings has no field kindd"):
        AgentSettings().model_copy(update={"kindd": "thyme"})


def test_settings_made_with_a_name_no_setting_has_are_refused():
    """A mistyped name would be ignored and its setting left at its default."""
    with pytest.raises(TypeError, match="Settings has no setting agent_kind"):
        Settings(agent_kind="thyme")
    assert Settings(agent="thyme", **{"funnel.screener": "small"}).agent.kind == "thyme"


def test_thyme_takes_the_references_values_unless_given(tmp_path):
    thyme = Settings(agent="thyme")
    assert (thyme.funnel.gate.threshold, thyme.agent.max_steps) == (0.95, 5)
    assert Settings(agent="thyme", gate_threshold=0.9).funnel.gate.threshold == 0.9
    calibration = tmp_path / "calibration.json"
    calibration.write_text('{"gate": {"mode": "mean", "top_k": 32, "threshold": 0.97}}')
    calibrated = Settings(agent="thyme", calibration_file=calibration, gate_mode="min")
    assert calibrated.funnel.gate == GateSettings(mode="min", top_k=32, threshold=0.97)


def test_folders_are_expanded_even_when_defaulted():
    settings = Settings()  # (a default is checked as a given value is: ~ is never a folder)
    assert settings.models.cache_dir.is_absolute() and settings.api.upload_dir.is_absolute()
