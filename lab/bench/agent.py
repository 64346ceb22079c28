"""``speceyes bench agent``: trajectories per second against how many run at once.

N trajectories in flight share one model through ``Lockstep``, which batches their steps
into one ``generate``; N = 1 is the model alone. Random-weight checkpoints give the
shapes and the timing, not answers: every trajectory runs its full step budget.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from PIL import Image, ImageDraw

from common.backends.base import VisionLanguageModel
from common.backends.lockstep import Lockstep
from common.backends.transformers_backend import TransformersModel
from common.config import AgentSettings, Settings
from common.contracts import Query
from common.models.registry import protocol_name, resolve_model
from common.pipeline.funnel import run_agent_stage
from common.protocols import get_protocol


@dataclass(frozen=True)
class AgentRow:
    concurrency: int
    trajectories_per_s: float
    mean_batch: float  # steps per generate (1 without Lockstep)


def load_large(settings: Settings) -> TransformersModel:
    """The large model of ``settings``, in process (the bench times the model itself)."""
    spec = settings.models.large.name
    path = resolve_model(spec, "large", settings.models.cache_dir)
    protocol = get_protocol(protocol_name(spec, "large", settings.models.protocol))
    return TransformersModel(
        path, device=settings.models.device, dtype=settings.models.dtype, protocol=protocol
    )


def agent_queries(count: int) -> list[Query]:
    queries = []
    for index in range(count):
        image = Image.new("RGB", (448, 336), (index * 13 % 256, 80, 160))
        ImageDraw.Draw(image).ellipse((40 + index, 30, 200, 180), fill=(250, 250, 250))
        queries.append(Query(f"b{index}", image, f"What is at spot {index}?", ("a", "b")))
    return queries


def bench_agent(
    model: TransformersModel,
    queries: list[Query],
    concurrency: Sequence[int],
    limits: AgentSettings,
) -> Iterator[AgentRow]:
    """Every query's trajectory at each concurrency, one row per level."""
    warm_up = limits.model_copy(update={"max_steps": 1, "max_new_tokens": 2})
    run_agent_stage(queries[0], model, warm_up)
    for n in concurrency:
        engine: VisionLanguageModel = (
            Lockstep(model, max_batch=n, max_wait_s=1.0) if n > 1 else model
        )
        started = time.perf_counter()
        run_concurrently(engine, queries, n, limits)
        rate = len(queries) / (time.perf_counter() - started)
        sizes = engine.batch_sizes if isinstance(engine, Lockstep) else [1]
        yield AgentRow(n, rate, sum(sizes) / max(1, len(sizes)))


def run_concurrently(
    engine: VisionLanguageModel, queries: list[Query], threads: int, limits: AgentSettings
) -> None:
    """Every query's trajectory, ``threads`` at a time."""
    pending = list(queries)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                query = pending.pop()
            run_agent_stage(query, engine, limits)

    running = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
