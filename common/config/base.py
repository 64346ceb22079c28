"""How a setting is written: ``setting`` (a field with its flat name and flag), ``group``
(a group placed in its parent), ``Group`` (frozen, no stray names), and the small
vocabularies settings choose from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

GateMode = Literal["min", "mean", "bottom20", "logprob"]
AgentKind = Literal["deepeyes", "thyme"]
BackendKind = Literal["transformers", "scripted", "openai"]
Screener = Literal["large", "small", "none"]
DepthScope = Literal["tool_free", "all"]
Method = Literal["speceyes", "specreason"]
Isolation = Literal["bubblewrap", "gvisor", "none"]
Role = Literal["large", "small"]
ENV_PREFIX = "SPECEYES_"


def setting(
    default: Any = ...,
    description: str | None = None,
    *,
    factory: Any = None,
    env: str | None = None,
    env_name: str | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    **checks: Any,
) -> Any:
    """A field with what the rest is built from: ``env``, its whole flat name where that
    is not the group's prefix + its own name (``env_name``: the part after the prefix);
    ``flag``, its command-line flag (``cli.options``)."""
    named = {"env": env, "env_name": env_name, "flag": flag, "metavar": metavar}
    extra: dict[str, Any] = {key: value for key, value in named.items() if value is not None}
    if factory is not None:
        return Field(
            default_factory=factory, description=description, json_schema_extra=extra, **checks
        )
    return Field(default, description=description, json_schema_extra=extra, **checks)


def group(
    factory: Any,
    description: str,
    *,
    env_prefix: str | None = None,
    flags: dict[str, str] | None = None,
) -> Any:
    """A group placed in its parent; its fields' flat names start with ``env_prefix``
    (where given, else the parent's); ``flags`` names flags of its fields that depend on
    where it is placed (the two models' ``--large``, ``--small``)."""
    extra: dict[str, Any] = {} if env_prefix is None else {"env_prefix": env_prefix}
    if flags:
        extra["flags"] = flags
    return Field(default_factory=factory, description=description, json_schema_extra=extra)


class Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        refuse_stray_names(self, update)
        return super().model_copy(update=update, deep=deep)


def refuse_stray_names(model: BaseModel, update: Mapping[str, Any] | None) -> None:
    """pydantic's ``model_copy`` sets any name it is given, a field or not, unchecked:
    ``settings.model_copy(update={"baseline": True})`` would change nothing the code
    reads (``baseline`` is ``funnel.baseline``). Refuse it; ``Settings.replace`` takes flat
    names and paths, and checks the values."""
    stray = sorted(set(update or ()) - set(type(model).model_fields))
    if stray:
        raise TypeError(
            f"{type(model).__name__} has no field {', '.join(stray)}: use Settings.replace"
        )
