"""Model backends: one protocol (``base.VisionLanguageModel``), several implementations.

``load_models(settings)`` builds the pair the funnel needs, once per process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from common.backends.base import VisionLanguageModel
from common.backends.lockstep import Lockstep
from common.backends.scripted import ScriptedSettings, scripted_from_settings
from common.backends.server_backend import Endpoint, ServerModel
from common.config import Settings
from common.errors import ConfigurationError
from common.models.registry import protocol_name, resolve_model
from common.protocols import get_protocol

if TYPE_CHECKING:
    from common.backends.transformers_backend import TransformersModel


@dataclass
class Models:
    large: VisionLanguageModel  # M_L: screens (phase I) and runs the agent (phase IV)
    small: VisionLanguageModel  # M_S: speculates (phase II)


def load_models(settings: Settings, scripted: ScriptedSettings | None = None) -> Models:
    """Load M_L and M_S as the settings say (torch and transformers load here, if at all); the
    scripted backend follows ``scripted`` (default: its ``SPECEYES_SCRIPTED__*`` knobs)."""
    if settings.models.backend == "scripted":
        shared = scripted_from_settings(
            scripted or ScriptedSettings(),
            "thyme" if settings.agent.kind == "thyme" else settings.models.protocol,
        )
        return Models(large=shared, small=shared)

    if settings.models.backend == "openai":

        def serve(spec: str, role: Literal["small", "large"]) -> ServerModel:
            protocol = get_protocol(
                protocol_name(spec, role, settings.models.protocol, settings.agent.kind)
            )
            return ServerModel(server_endpoint(settings, role), protocol=protocol)

        return Models(
            large=serve(settings.models.large.name, "large"),
            small=serve(settings.models.small.name, "small"),
        )

    # Only the in-process backend needs torch and transformers (seconds to import): a
    # worker that talks to a model server, or runs scripted, never loads them.
    from common.backends.transformers_backend import TransformersModel

    def load(spec: str, role: Literal["small", "large"]) -> TransformersModel:
        path = resolve_model(spec, role, settings.models.cache_dir)
        protocol = get_protocol(
            protocol_name(spec, role, settings.models.protocol, settings.agent.kind)
        )
        return TransformersModel(
            path,
            name=spec,
            device=settings.models.device,
            dtype=settings.models.dtype,
            protocol=protocol,
        )

    large = load(settings.models.large.name, "large")
    small = load(settings.models.small.name, "small")
    if settings.agent.workers > 1:  # their steps share one batched generate
        batched = Lockstep(
            large, max_batch=settings.agent.workers, max_wait_s=settings.agent.step_wait_s
        )
        return Models(large=batched, small=small)
    return Models(large=large, small=small)


def server_endpoint(settings: Settings, role: Literal["small", "large"]) -> Endpoint:
    """Where a role's model is served (backend ``openai``)."""
    model, large = settings.models.role(role), settings.models.large
    url, key = model.server_url, model.server_key
    if role == "small" and url is None:  # M_S defaults to M_L's server
        url, key = large.server_url, key or large.server_key
    if url is None:
        raise ConfigurationError(
            "the openai backend needs a server: set SPECEYES_LARGE_SERVER_URL (and "
            "SPECEYES_SMALL_SERVER_URL where M_S is served elsewhere)"
        )
    return Endpoint(
        url,
        model.name,
        key.get_secret_value() if key is not None else None,
        timeout_s=settings.models.server_timeout_s,
        retries=settings.models.server_retries,
        concurrency=settings.models.server_concurrency,
    )
