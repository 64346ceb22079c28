"""One source for the environment, the flags and the docs: each setting as a ``Leaf``
(its path, field, flat variable name), and the environment read by those names."""

from __future__ import annotations

import json
import os
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dotenv import dotenv_values
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import (
    PydanticBaseSettingsSource,
)

from common.config.base import ENV_PREFIX


# -- one source for the environment, the flags and the docs ------------------------------
@dataclass(frozen=True)
class Leaf:
    """One setting: where it sits, its field, its flat name, what its group adds."""

    path: str  # "funnel.gate.threshold"
    field: FieldInfo
    env: str  # "SPECEYES_GATE_THRESHOLD"
    placed: dict[str, Any]  # what its placement says of it (a flag)

    @property
    def extra(self) -> dict[str, Any]:
        extra = self.field.json_schema_extra
        return {**(extra if isinstance(extra, dict) else {}), **self.placed}


def leaves_of(
    model: type[BaseModel],
    path: str = "",
    prefix: str = "",
    flags: dict[str, str] | None = None,
) -> Iterator[Leaf]:
    """Every setting under ``model``, in order, with its flat name."""
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        kind = _group_type(field.annotation)
        where = f"{path}{name}"
        if kind is not None:
            inner = extra.get("flags")
            below = str(extra.get("env_prefix", prefix))
            named = (
                {str(key): str(value) for key, value in inner.items()}
                if isinstance(inner, dict)
                else None
            )
            yield from leaves_of(kind, f"{where}.", below, named)
            continue
        flat = extra.get("env") or prefix + str(extra.get("env_name", name))
        placed = {"flag": flags[name]} if flags and name in flags else {}
        yield Leaf(where, field, ENV_PREFIX + str(flat).upper(), placed)


def _group_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def nested(values: dict[str, Any], into: dict[str, Any] | None = None) -> dict[str, Any]:
    """Values by dotted path (``{"gate.threshold": 0.9}``) as the nested dict pydantic takes."""
    tree: dict[str, Any] = into if into is not None else {}
    for path, value in values.items():
        *parents, last = path.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return tree


class FlatEnvironment(PydanticBaseSettingsSource):
    """Settings from ``SPECEYES_<FLAT NAME>`` variables, then a ``.env`` file."""

    def __call__(self) -> dict[str, Any]:
        found = {**dotenv_values(".env"), **os.environ} if Path(".env").is_file() else os.environ
        values: dict[str, Any] = {}
        for leaf in leaves_of(self.settings_cls):
            raw = found.get(leaf.env)
            if raw is not None:
                values[leaf.path] = json.loads(raw) if _is_structured(leaf.field) else raw
        return nested(values)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # (the whole tree is read in __call__)


def _is_structured(field: FieldInfo) -> bool:
    """A list or dict field, whose variable holds JSON."""
    annotation = field.annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(typing.get_origin(arg) in (list, dict) for arg in typing.get_args(annotation))
    return origin in (list, dict)
