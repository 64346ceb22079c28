"""``Settings``: the groups composed, read from keyword arguments, the environment and
``.env``; and what is derived from the whole tree (flat names, defaults, the
configuration page)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from common.config.accounting import AccountingSettings
from common.config.agent import AgentSettings
from common.config.base import (
    ENV_PREFIX,
    group,
    refuse_stray_names,
    setting,
)
from common.config.calibration import read_calibration
from common.config.environment import FlatEnvironment, Leaf, leaves_of, nested
from common.config.inputs import ImageSettings, RequestLimits, SourceSettings
from common.config.method import AuditSettings, FunnelSettings, GateSettings, JudgeSettings
from common.config.models import ModelsSettings
from common.config.service import ApiSettings, BrokerSettings, RecoverySettings, WebhookSettings

THYME_DEFAULTS: dict[str, Any] = {
    "funnel.gate.threshold": 0.95,
    "agent.max_steps": 5,
    "agent.max_new_tokens": 2048,
}


class Settings(BaseSettings):
    """SpecEyes configuration (see the module's text)."""

    model_config = SettingsConfigDict(extra="ignore", validate_default=True)

    models: ModelsSettings = group(ModelsSettings, "The two models and what runs them.")
    funnel: FunnelSettings = group(FunnelSettings, "Phases I-III, the gate among them.")
    agent: AgentSettings = group(AgentSettings, "Phase IV: the agent.", env_prefix="agent_")
    images: ImageSettings = group(ImageSettings, "Images before they are decoded.")
    requests: RequestLimits = group(RequestLimits, "What a job's texts may hold.")
    sources: SourceSettings = group(SourceSettings, "Corpora in and results out.")
    broker: BrokerSettings = group(
        BrokerSettings, "The distributed pipeline's broker.", env_prefix="broker_"
    )
    recovery: RecoverySettings = group(RecoverySettings, "Riding out faults.")
    api: ApiSettings = group(ApiSettings, "The HTTP API.", env_prefix="api_")
    audit: AuditSettings = group(AuditSettings, "The online audit.", env_prefix="audit_")
    judge: JudgeSettings = group(JudgeSettings, "The LLM judge.", env_prefix="judge_")
    accounting: AccountingSettings = group(
        AccountingSettings, "What model time costs.", env_prefix="accounting_"
    )
    webhooks: WebhookSettings = group(
        WebhookSettings, "Events sent to callers' URLs.", env_prefix="webhook_"
    )
    database_url: str = setting(
        "sqlite:///speceyes.db", "SQLAlchemy URL of the job store.", flag="--db", metavar="URL"
    )
    calibration_file: Path | None = setting(
        None,
        "A calibration file (speceyes calibrate --out): the gate it chose (where no gate "
        "setting is given) and the agreement the audit then expects.",
        flag="--calibration",
        metavar="FILE",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        given = nest_flat(dict(getattr(init_settings, "init_kwargs", {})))
        stray = sorted(set(given) - set(settings_cls.model_fields))
        if stray:  # (a mistyped name would otherwise be ignored, its default used)
            raise TypeError(f"Settings has no setting {', '.join(stray)}")
        return InitSettingsSource(settings_cls, given), FlatEnvironment(settings_cls)

    @model_validator(mode="after")
    def _calibrated_gate(self) -> Settings:
        """A calibration file's gate, where no gate setting is given (field by field)."""
        if self.calibration_file is not None:
            chosen = read_calibration(self.calibration_file).gate
            current = self.funnel.gate
            given = current.model_fields_set if "gate" in self.funnel.model_fields_set else set()
            gate = GateSettings(**{**chosen, **{name: getattr(current, name) for name in given}})
            object.__setattr__(self, "funnel", self.funnel.model_copy(update={"gate": gate}))
            self.__pydantic_fields_set__.add("funnel")  # (given, by the file)
        return self

    @model_validator(mode="after")
    def _zooms_need_deepeyes(self) -> Settings:
        if self.funnel.speculation_depth and self.agent.kind == "thyme":
            raise ValueError(
                "speculation_depth >= 1 gives the small model DeepEyes' zoom tool; Thyme's "
                "protocol has none (its tool is code): use it with --agent deepeyes"
            )
        return self

    @model_validator(mode="after")
    def _agent_defaults(self) -> Settings:
        """Thyme's reference values where the operator set none."""
        if self.agent.kind == "thyme":
            for path, value in THYME_DEFAULTS.items():
                if not _was_set(self, path):
                    first, *rest = path.split(".")
                    object.__setattr__(self, first, _updated(getattr(self, first), rest, value))
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        refuse_stray_names(self, update)
        return super().model_copy(update=update, deep=deep)

    def replace(self, **values: Any) -> Settings:
        """These settings with some changed, by flat name (``baseline=True``) or by path
        (``**{"funnel.baseline": True}``); checked as any setting is."""
        return Settings(**_merged(self.model_dump(), nest_flat(dict(values))))


def nest_flat(values: dict[str, Any]) -> dict[str, Any]:
    """Settings given by flat name (``Settings(gate_threshold=0.9)``, as
    ``SPECEYES_GATE_THRESHOLD=0.9``) or by path, as the nested dict pydantic takes; a
    group given whole (a dict, a model) stays as it is."""
    paths = flat_paths()
    moved = {}
    for key in list(values):
        whole_group = key in Settings.model_fields and isinstance(values[key], dict | BaseModel)
        if "." in key or (key in paths and not whole_group):
            moved[paths.get(key, key)] = values.pop(key)
    return nested(moved, values)


def _merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merged(base[key], value)
        else:
            base[key] = value
    return base


def _updated(node: BaseModel, parts: list[str], value: Any) -> BaseModel:
    """A copy of ``node`` with the field at ``parts`` (a path below it) set to ``value``."""
    first, *rest = parts
    return node.model_copy(
        update={first: _updated(getattr(node, first), rest, value) if rest else value}
    )


def _was_set(settings: BaseModel, path: str) -> bool:
    """Whether the setting at ``path`` was given (by any source), not defaulted."""
    *groups, name = path.split(".")
    node: BaseModel = settings
    for part in groups:
        if part not in node.model_fields_set:
            return False
        node = getattr(node, part)
    return name in node.model_fields_set


def leaves() -> Iterator[Leaf]:
    """Every setting, in order, with its flat name."""
    return leaves_of(Settings)


@functools.cache
def flat_paths() -> dict[str, str]:
    """Flat name (``gate_threshold``) -> path (``funnel.gate.threshold``), for every setting."""
    return {leaf.env[len(ENV_PREFIX) :].lower(): leaf.path for leaf in leaves()}


def default_of(path: str) -> Any:
    """A setting's default as written, by path (``~`` not expanded: it is shown)."""
    field = next(leaf.field for leaf in leaves() if leaf.path == path)
    if not field.is_required():
        return field.get_default(call_default_factory=True)
    first, *rest = path.split(".")  # (a model's name: its group's placement gives it)
    value = Settings.model_fields[first].get_default(call_default_factory=True)
    for part in rest:
        value = getattr(value, part)
    return value


def without_password(value: str) -> str:
    """A URL with its password shown as stars (``postgresql://u:***@host/db``, and a
    ``password=`` in its query); any other text as it is. Settings and messages print
    URLs through this."""
    if "://" not in value:
        return value
    try:
        parsed = urlsplit(value)
        password = parsed.password
    except ValueError:  # not a URL after all; it may still hold one's secret
        return "***" if "@" in value or "password" in value else value
    query = re.sub(r"(?i)(password=)[^&]*", r"\1***", parsed.query)
    if password is None and query == parsed.query:
        return value  # (rebuilt, sqlite:///x.db would lose a slash)
    if password is not None:
        parsed = parsed._replace(netloc=parsed.netloc.replace(f":{password}@", ":***@", 1))
    return urlunsplit(parsed._replace(query=query))


def configuration_markdown() -> str:
    """docs/configuration.md: every setting, its variable, default, flag and meaning."""
    lines = [
        "# Configuration",
        "",
        "Generated from `common/config/` by `speceyes config --markdown` (a test fails when",
        "this page is stale). Each setting is read from its `SPECEYES_` variable (or a",
        "`.env` file in the working folder), some also from a flag of the commands that take",
        "them (see each command's `--help`); a flag beats the variable, which beats the",
        "default. `speceyes config` prints the values in effect. Lists are JSON.",
    ]
    section = None
    for leaf in leaves():
        top = leaf.path.split(".")[0] if "." in leaf.path else ""
        if top != section:
            section = top
            described = Settings.model_fields[top].description if top else None
            lines += ["", f"## {top or 'the store'}", ""]
            lines += [described, ""] if described else []
            lines += [
                "| setting | variable | default | flag | what it is |",
                "|---|---|---|---|---|",
            ]
        flag = leaf.extra.get("flag")
        meaning = (leaf.field.description or "").replace("|", "/")
        lines.append(
            f"| `{leaf.path}` | `{leaf.env}` | {_shown(default_of(leaf.path))} | "
            f"{f'`{flag}`' if flag else ''} | {meaning} |"
        )
    return "\n".join(lines) + "\n"


def _shown(value: Any) -> str:
    if value is None or value == [] or value == "":
        return "unset" if value is None or value == [] else "empty"
    if isinstance(value, Path):
        return f"`{value}`"
    return f"`{json.dumps(value) if not isinstance(value, str) else value}`"
