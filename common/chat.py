"""The messages a model is shown: a multi-turn, multi-image chat.

Plain types with no model behind them: the protocols build them (``common.protocols``),
the agents grow them, the backends render them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from PIL import Image

Role = Literal["system", "user", "assistant"]
# what a generation is for: an agent step; or SpecReason's proposal (small model), its
# score and a correction (large model), which a scripted stand-in answers differently
Purpose = Literal["agent", "propose", "verify", "correct"]
Part = str | Image.Image


@dataclass
class Message:
    role: Role
    content: list[Part]  # text and images, in order

    @property
    def images(self) -> list[Image.Image]:
        return [part for part in self.content if isinstance(part, Image.Image)]


@dataclass
class Conversation:
    """A multi-turn chat. ``key`` names the trajectory (scripted backends look it up)."""

    messages: list[Message] = field(default_factory=list)
    key: str = ""
    generations: int = 0  # the model's own turns so far (other turns may be any role)
    # Thyme's later steps: render without a generation prompt and cut this end off the
    # text (``"<|im_end|>\n"``), so the model continues the last turn, whoever wrote it
    continue_cut: str | None = None
    purpose: Purpose = "agent"

    def add(self, role: Role, *content: Part) -> None:
        self.messages.append(Message(role, list(content)))

    def add_generation(self, text: str) -> None:
        """The model's output, as the assistant turn it wrote."""
        self.add("assistant", text)
        self.generations += 1

    @property
    def images(self) -> list[Image.Image]:
        return [image for message in self.messages for image in message.images]
