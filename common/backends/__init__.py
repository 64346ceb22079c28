"""Model backends: one protocol (``base.VisionLanguageModel``), several implementations.

``load_models(settings)`` builds the pair the funnel needs, once per process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from common.backends.base import VisionLanguageModel
from common.config import Settings

if TYPE_CHECKING:
    from common.backends.server_backend import Endpoint


@dataclass
class Models:
    large: VisionLanguageModel  # M_L: screens (phase I) and runs the agent (phase IV)
    small: VisionLanguageModel  # M_S: speculates (phase II)


def load_models(settings: Settings) -> Models:
    """Load M_L and M_S as the settings say (the transformers import happens here)."""
    if settings.backend == "scripted":
        from common.backends.scripted import scripted_from_settings

        shared = scripted_from_settings(
            settings.scripted, "thyme" if settings.agent == "thyme" else settings.protocol
        )
        return Models(large=shared, small=shared)

    from common.models.registry import protocol_name
    from common.protocols import get_protocol

    if settings.backend == "openai":
        from common.backends.server_backend import ServerModel

        def serve(spec: str, role: Literal["small", "large"]) -> ServerModel:
            protocol = get_protocol(protocol_name(spec, role, settings.protocol, settings.agent))
            return ServerModel(server_endpoint(settings, role), protocol=protocol)

        return Models(
            large=serve(settings.large_model, "large"), small=serve(settings.small_model, "small")
        )

    from common.backends.transformers_backend import TransformersModel
    from common.models.registry import resolve_model

    def load(spec: str, role: Literal["small", "large"]) -> TransformersModel:
        path = resolve_model(spec, role, settings.cache_dir)
        protocol = get_protocol(protocol_name(spec, role, settings.protocol, settings.agent))
        return TransformersModel(
            path, name=spec, device=settings.device, dtype=settings.dtype, protocol=protocol
        )

    large = load(settings.large_model, "large")
    small = load(settings.small_model, "small")
    if settings.agent_workers > 1:  # their steps share one batched generate
        from common.backends.lockstep import Lockstep

        return Models(large=Lockstep(large, max_batch=settings.agent_workers), small=small)
    return Models(large=large, small=small)


def server_endpoint(settings: Settings, role: Literal["small", "large"]) -> Endpoint:
    """Where a role's model is served (backend ``openai``)."""
    from common.backends.server_backend import Endpoint
    from common.errors import ConfigurationError

    url = settings.large_server_url if role == "large" else settings.small_server_url
    key = settings.large_server_key if role == "large" else settings.small_server_key
    if role == "small" and url is None:
        url, key = settings.large_server_url, key or settings.large_server_key
    if url is None:
        raise ConfigurationError(
            "the openai backend needs a server: set SPECEYES_LARGE_SERVER_URL (and "
            "SPECEYES_SMALL_SERVER_URL where M_S is served elsewhere)"
        )
    return Endpoint(
        url,
        settings.large_model if role == "large" else settings.small_model,
        key.get_secret_value() if key is not None else None,
        timeout_s=settings.server_timeout_s,
        retries=settings.server_retries,
        concurrency=settings.server_concurrency,
    )
