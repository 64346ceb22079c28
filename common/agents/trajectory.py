"""A trajectory as every agent records it: one ``AgentStep`` per generation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class AgentStep:
    """One generation of the trajectory and what the tool made of it."""

    index: int
    text: str
    finish_reason: str
    new_tokens: int
    generate_seconds: float
    tool_call: dict[str, Any] | None = None
    box_model: list[float] | None = None  # as the model wrote it, in its view's pixels
    box_original: list[int] | None = None  # cropped from the original: [x1, y1, x2, y2]
    observation: str = ""  # what went back to the model, in words
    tool_seconds: float = 0.0
    # Thyme: the code the step ran (as written), what it printed, the images it produced
    # (size, digest, a thumbnail), why the sandbox stopped it, if it did, and what the
    # sandbox used (CPU seconds, peak memory of its processes and files)
    code: str | None = None
    code_output: str | None = None
    images: list[dict[str, Any]] | None = None
    sandbox_stop: str | None = None
    sandbox_cpu_s: float | None = None
    sandbox_peak_mb: float | None = None


@dataclass
class Trajectory:
    steps: list[AgentStep] = field(default_factory=list)
    answer: str | None = None
    error_code: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
