"""The small protocol every model backend speaks, and the plain types it speaks in.

A backend wraps one vision-language model and offers three calls:

- ``screen(queries)``: phase I over a batch; per query, needs-tools yes/no and raw text;
- ``speculate(queries)``: phase II over a batch; per query, the answer and the per-token
  top-K scores the gate needs;
- ``generate(conversation, stop=...)``: one agent step over a multi-image chat.

Batch calls either return one result per query, in order, or raise; the funnel isolates
a failing query by splitting the batch, so a backend need not. Tensors never cross this
boundary: results are plain Python values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from PIL import Image

from common.contracts import Query, ScreenResult
from common.gate import TokenScores
from common.images import ResizeRule

if TYPE_CHECKING:
    from common.protocols import Protocol as ProtocolSpec

Role = Literal["system", "user", "assistant"]
Part = str | Image.Image
FinishReason = Literal["stop", "eos", "length"]


@dataclass(frozen=True)
class Speculation:
    answer: str
    token_ids: list[int]  # the answer's tokens, before the first EOS / pad
    scores: TokenScores  # one row per answer token


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

    def add(self, role: Role, *content: Part) -> None:
        self.messages.append(Message(role, list(content)))

    def add_generation(self, text: str) -> None:
        """The model's output, as the assistant turn it wrote."""
        self.add("assistant", text)
        self.generations += 1

    @property
    def images(self) -> list[Image.Image]:
        return [image for message in self.messages for image in message.images]


@dataclass(frozen=True)
class Generation:
    text: str  # decoded, cut right after the stop string when one was hit
    finish_reason: FinishReason
    new_tokens: int


class VisionLanguageModel(Protocol):
    """One loaded model; any model can screen, speculate and generate."""

    name: str
    protocol: ProtocolSpec  # what it is shown (prompts, stops, tool-loop rules)
    resize_rule: ResizeRule  # the grid of the images it is shown (zoom boxes are in it)

    def screen(self, queries: Sequence[Query], *, max_new_tokens: int) -> list[ScreenResult]: ...

    def speculate(
        self, queries: Sequence[Query], *, max_new_tokens: int, top_k: int
    ) -> list[Speculation]: ...

    def generate(
        self, conversation: Conversation, *, stop: Sequence[str], max_new_tokens: int
    ) -> Generation: ...

    def render(self, chat: Sequence[Message], continue_cut: str | None = None) -> str:
        """The exact text the model is given for ``chat`` (its chat template's output;
        with ``continue_cut``, see ``Conversation.continue_cut``)."""
        ...


def final_answer(text: str) -> str:
    """The small model's answer: inside ``<answer>`` tags if it wrote them (as the
    reference does with its output), else the whole text, stripped."""
    if "<answer>" in text and "</answer>" in text:
        return text.split("<answer>")[1].split("</answer>")[0].strip()
    return text.strip()


def plain_render(chat: Sequence[Message], continue_cut: str | None = None) -> str:
    """A chat in Qwen's turn layout with each image as ``<image WxH>``: for stand-ins that
    have no chat template of their own."""
    turns = []
    for message in chat:
        parts = [
            f"<image {part.width}x{part.height}>" if isinstance(part, Image.Image) else part
            for part in message.content
        ]
        turns.append(f"<|im_start|>{message.role}\n{''.join(parts)}<|im_end|>\n")
    text = "".join(turns)
    if continue_cut is not None:
        return text.removesuffix(continue_cut)
    return text + "<|im_start|>assistant\n"
