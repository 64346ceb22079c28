"""Model backends: one protocol (``base.VisionLanguageModel``), several implementations.

``load_models(settings)`` builds the pair the funnel needs, once per process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from common.backends.base import VisionLanguageModel
from common.config import Settings


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

    from common.backends.transformers_backend import TransformersModel
    from common.models.registry import protocol_name, resolve_model
    from common.protocols import get_protocol

    def load(spec: str, role: Literal["small", "large"]) -> TransformersModel:
        path = resolve_model(spec, role, settings.cache_dir)
        protocol = get_protocol(protocol_name(spec, role, settings.protocol, settings.agent))
        return TransformersModel(
            path, name=spec, device=settings.device, dtype=settings.dtype, protocol=protocol
        )

    large = load(settings.large_model, "large")
    return Models(large=large, small=load(settings.small_model, "small"))
