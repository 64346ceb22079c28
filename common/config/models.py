"""The two models, what runs them and where they are served."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr, field_validator, model_validator

from common.config.base import BackendKind, Group, Role, group, setting


class ModelSettings(Group):
    """One of the two models: what it is, and where it is served (backend ``openai``)."""

    name: str = setting(
        description="A Hugging Face id, a local checkpoint folder, "
        "'synth' (trained on SpecEyes-Synth, shipped) or 'tiny' (random "
        "weights, built offline).",
        env_name="model",
        metavar="MODEL",
    )
    server_url: str | None = setting(
        None, "Its OpenAI-compatible server, e.g. http://gpu-1:8000/v1, serving it by name."
    )
    server_key: SecretStr | None = setting(None, "That server's key (never printed).")


DEFAULT_MODELS = {"large": "ChenShawn/DeepEyes-7B", "small": "Qwen/Qwen3-VL-2B-Instruct"}


class ModelsSettings(Group):
    """The two models and what runs them."""

    large: ModelSettings = group(
        lambda: ModelSettings(name=DEFAULT_MODELS["large"]),
        "M_L, the agentic model (a Qwen2.5-VL).",
        env_prefix="large_",
        flags={"name": "--large"},
    )
    small: ModelSettings = group(
        lambda: ModelSettings(name=DEFAULT_MODELS["small"]),
        "M_S, the tool-free speculative model (a Qwen3-VL); its server defaults to M_L's.",
        env_prefix="small_",
        flags={"name": "--small"},
    )
    backend: BackendKind = setting(
        "transformers",
        "'transformers' runs the checkpoints in this process; 'openai' "
        "calls them behind OpenAI-compatible servers; 'scripted' is a deterministic "
        "stand-in for tests and throughput experiments.",
        env="backend",
        flag="--backend",
    )
    protocol: Literal["auto", "reference", "v0"] = setting(
        "auto",
        "What the models are shown (prompts, stops, tool-loop rules, image grid): "
        "'reference' is the SpecEyes evaluation's, 'v0' SpecEyes' first wording. 'auto': a "
        "checkpoint that names its protocol (speceyes.json) gets it, others 'reference'. "
        "Naming one a checkpoint was not trained with is an error.",
        env="protocol",
        flag="--protocol",
    )
    device: str = setting(
        "auto",
        "'auto' (cuda if present, else cpu), 'cpu', 'cuda:0', ...",
        env="device",
        flag="--device",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = setting(
        "auto", "'auto' is bfloat16 on a GPU and float32 on the CPU.", env="dtype", flag="--dtype"
    )
    cache_dir: Path = setting(
        Path("~/.cache/speceyes"), "Where built tiny checkpoints are kept.", env="cache_dir"
    )
    server_timeout_s: float = setting(
        120.0, "Seconds per request to a model server.", env="server_timeout_s", gt=0
    )
    server_retries: int = setting(
        3,
        "Retries of a request a model server refused for now "
        "(429, 5xx, a lost connection), with backoff.",
        env="server_retries",
        ge=0,
    )
    server_concurrency: int = setting(
        16,
        "Requests in flight at once to a model server, per micro-batch.",
        env="server_concurrency",
        ge=1,
    )

    @model_validator(mode="before")
    @classmethod
    def _default_names(cls, values: Any) -> Any:
        """A model given in part (its server only) is still the default model."""
        if isinstance(values, dict):
            for role, name in DEFAULT_MODELS.items():
                if isinstance(values.get(role), dict) and "name" not in values[role]:
                    values[role] = {**values[role], "name": name}
        return values

    @field_validator("cache_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    def role(self, role: Role) -> ModelSettings:
        return self.large if role == "large" else self.small
