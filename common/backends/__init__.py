"""Model backends: one protocol (``base.VisionLanguageModel``), several implementations.

``load_models(settings)`` builds the pair the funnel needs, once per process.
"""

from __future__ import annotations

from dataclasses import dataclass

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

        shared = scripted_from_settings(settings.scripted)
        return Models(large=shared, small=shared)

    from common.backends.transformers_backend import TransformersModel
    from common.models.registry import resolve_model

    def load(spec: str, role: str) -> TransformersModel:
        path = resolve_model(spec, "large" if role == "large" else "small", settings.cache_dir)
        return TransformersModel(path, name=spec, device=settings.device, dtype=settings.dtype)

    large = load(settings.large_model, "large")
    return Models(large=large, small=load(settings.small_model, "small"))
