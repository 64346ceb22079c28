"""Model backends: one protocol (``base.VisionLanguageModel``), several implementations.

``load_models(settings)`` builds the pair the funnel needs, once per process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from common.backends.base import VisionLanguageModel
from common.backends.lockstep import Lockstep
from common.backends.scripted import ScriptedSettings, scripted_from_settings
from common.backends.server_backend import Endpoint, ServerModel
from common.config import Settings
from common.errors import ConfigurationError
from common.models.registry import check_available, protocol_name, resolve_model
from common.protocols import get_protocol

if TYPE_CHECKING:
    from common.backends.transformers_backend import TransformersModel

log = logging.getLogger(__name__)


@dataclass
class Models:
    large: VisionLanguageModel  # M_L: screens (phase I) and runs the agent (phase IV)
    small: VisionLanguageModel  # M_S: speculates (phase II)
    # Set when the process stops (Ctrl-C): in-process generations end at their next
    # token and raise ``Interrupted``, so no thread is inside torch when Python exits.
    stop: threading.Event = field(default_factory=threading.Event)


def check_models(settings: Settings) -> None:
    """Raise ``ConfigurationError`` now, in seconds, if a model the in-process backend
    would load cannot be had (``check_available``); other backends load nothing here."""
    if settings.models.backend != "transformers":
        return
    for role in ("large", "small"):
        check_available(settings.models.role(role).name, role, settings.models.cache_dir)


def load_models(
    settings: Settings,
    scripted: ScriptedSettings | None = None,
    *,
    say: Callable[[str], None] = log.info,
) -> Models:
    """Load M_L and M_S as the settings say (torch and transformers load here, if at all); the
    scripted backend follows ``scripted`` (default: its ``SPECEYES_SCRIPTED__*`` knobs).
    ``say`` is told what is loading, and when it is loaded."""
    if settings.models.backend == "scripted":
        shared = scripted_from_settings(
            scripted or ScriptedSettings(),
            "thyme" if settings.agent.kind == "thyme" else settings.models.protocol,
        )
        return Models(large=shared, small=shared, stop=shared.stop)

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

    stop = threading.Event()

    def load(spec: str, role: Literal["small", "large"]) -> TransformersModel:
        path = resolve_model(spec, role, settings.models.cache_dir)
        where = "" if path == spec else f" from {path}"
        say(f"loading the {role} model {spec}{where} ...")
        started = time.perf_counter()
        protocol = get_protocol(
            protocol_name(spec, role, settings.models.protocol, settings.agent.kind)
        )
        model = TransformersModel(
            path,
            name=spec,
            device=settings.models.device,
            dtype=settings.models.dtype,
            protocol=protocol,
            stop=stop,
        )
        model.warm_up()
        say(f"loaded the {role} model in {time.perf_counter() - started:.1f} s ({model.device})")
        return model

    large = load(settings.models.large.name, "large")
    small = load(settings.models.small.name, "small")
    if settings.agent.workers > 1:  # their steps share one batched generate
        batched = Lockstep(
            large, max_batch=settings.agent.workers, max_wait_s=settings.agent.step_wait_s
        )
        return Models(large=batched, small=small, stop=stop)
    return Models(large=large, small=small, stop=stop)


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
