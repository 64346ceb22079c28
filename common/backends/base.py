"""The small protocol every model backend speaks, and the plain types it speaks in.

A backend wraps one vision-language model and offers three calls:

- ``screen(queries)``: phase I over a batch; per query, needs-tools yes/no and raw text;
- ``speculate(queries)``: phase II over a batch; per query, the answer and the per-token
  top-K scores the gate needs;
- ``generate(conversation, stop=...)``: one agent step over a multi-image chat;
- ``agent_turns(conversations, top_k=...)``: one agent step of many conversations at
  once (to the protocol's agent stops), each with its tokens' top-K scores (the small
  model's zooms before the gate, ``common.pipeline.depth``).

Batch calls either return one result per query, in order, or raise; the funnel isolates
a failing query by splitting the batch, so a backend need not. Tensors never cross this
boundary: results are plain Python values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from PIL import Image

from common.chat import Conversation, Message
from common.contracts import Query, ScreenResult
from common.images import ResizeRule
from common.scores import TokenScores

if TYPE_CHECKING:
    from common.protocols import Protocol as ProtocolSpec

FinishReason = Literal["stop", "eos", "length"]


@dataclass(frozen=True)
class Speculation:
    answer: str
    token_ids: list[int] | None  # the answer's token ids, before the first EOS / pad (None:
    # a backend that is not told them, as a server's or a stand-in)
    scores: TokenScores  # one row per answer token
    prompt_tokens: int = 0  # the tokens it read (0: its backend does not say)


@dataclass(frozen=True)
class Generation:
    text: str  # decoded, cut right after the stop string when one was hit
    finish_reason: FinishReason
    new_tokens: int
    # with agent_turns: one row per token, and each token's text (joined, they are
    # the text as the backend decoded it, which may differ from ``text`` at a stop)
    scores: TokenScores | None = None
    pieces: tuple[str, ...] | None = None
    prompt_tokens: int = 0  # the tokens it read (0: its backend does not say)
    # its model time where a batched call ran it with others: the call's seconds over the
    # generations in it (None: the call was its own, and its wall time is its time)
    seconds: float | None = None


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
        self,
        conversation: Conversation,
        *,
        stop: Sequence[str],
        max_new_tokens: int,
        ignore_eos: bool = False,
    ) -> Generation:
        """One turn, ended at a ``stop`` string, the model's end of turn or
        ``max_new_tokens``; ``ignore_eos``: not at the end of turn (the model writes on
        past it to the limit, and the text leaves the special tokens out)."""
        ...

    def agent_turns(
        self, conversations: Sequence[Conversation], *, max_new_tokens: int, top_k: int
    ) -> list[Generation]:
        """One step of each conversation, batched, ended at the protocol's ``agent_stop``,
        with ``scores`` and ``pieces``."""
        ...

    def render(self, chat: Sequence[Message], continue_cut: str | None = None) -> str:
        """The exact text the model is given for ``chat`` (its chat template's output;
        with ``continue_cut``, see ``Conversation.continue_cut``)."""
        ...


def final_answer(text: str, *, strip: bool = True) -> str:
    """The small model's answer: inside ``<answer>`` tags if it wrote them (stripped, as
    the evaluation takes it), else the whole text: stripped (``strip``, ``v0``) or as it
    came (``reference``, ``thyme``: ``pred_answer = output_text``, what they score)."""
    if "<answer>" in text and "</answer>" in text:
        return text.split("<answer>")[1].split("</answer>")[0].strip()
    return text.strip() if strip else text


def answer_scores(generation: Generation) -> TokenScores:
    """The rows of the tokens that write the answer after the first ``<answer>``, up to
    ``</answer>`` or the turn's end (a server may leave the stop string out of its
    tokens), white space alone left out: the tags, the reasoning before them and
    anything after are not the answer. All rows where the pieces hold no ``<answer>``
    or do not match the rows one for one."""
    scores, pieces = generation.scores, generation.pieces
    if scores is None:
        return TokenScores([], [])
    if pieces is None or len(pieces) != len(scores.top_values):
        return scores
    joined = "".join(pieces)
    start = joined.find("<answer>")
    if start == -1:
        return scores
    start += len("<answer>")
    end = joined.find("</answer>", start)
    end = len(joined) if end == -1 else end
    rows, offset = [], 0
    for index, piece in enumerate(pieces):
        if offset < end and offset + len(piece) > start and piece.strip():
            rows.append(index)
        offset += len(piece)
    return TokenScores(
        [scores.top_values[i] for i in rows], [scores.log_normalizer[i] for i in rows]
    )


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
