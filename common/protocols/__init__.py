"""Protocols: what each phase shows a model, as data, one module per protocol.

A ``Protocol`` holds the model-facing texts of phases I, II and IV (system prompts, the
question's layout, instruction suffixes), the generation stops, the rules of the agent's
tool loop (what it does with output it cannot use, how a zoom box maps to the original
image) and the image grid every image is resized to before a processor sees it.

- ``reference`` (``common/protocols/reference.py``): the SpecEyes evaluation, exactly;
  the default for every checkpoint that names no protocol of its own;
- ``thyme`` (``common/protocols/thyme.py``): the SpecEyes evaluation of Thyme, exactly
  (chosen by ``--agent thyme``; its phase IV loop is ``common/agents/thyme.py``);
- ``v0`` (``common/protocols/v0.py``): SpecEyes' first wording, which the shipped synth
  models were trained on.

A checkpoint folder may name the protocol it was trained with in ``speceyes.json``
(``{"protocol": "v0"}``); it is then always served with it (``common.models.registry``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Literal

from PIL import Image

from common.chat import Message
from common.contracts import Query
from common.errors import ConfigurationError
from common.images import ResizeRule
from common.protocols import reference, thyme, v0

OPTION_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

ProtocolName = Literal["reference", "thyme", "v0"]
# "reference": the evaluation's loop (an unparsable call gets the instruction back as an
# assistant turn, a call it cannot carry out ends the trajectory, an open <answer> ends
# it); "observe": ours (every problem goes back to the model as an observation).
MalformedPolicy = Literal["reference", "observe"]
# "truncate": int() of the scaled edges, clamped, unsorted (the evaluation);
# "cover": floor/ceil of the sorted edges, clamped (ours: the box covers what was asked).
BoxRule = Literal["truncate", "cover"]


@dataclass(frozen=True)
class Protocol:
    name: ProtocolName
    # the question and its options, as every phase shows them
    question_with_options: str  # fields {question}, {options}
    question_without_options: str  # field {question}
    options_prefix: str
    option_line: str  # fields {letter}, {option}
    strip_question: bool
    # phases I and II see the question text only up to this marker's first occurrence
    # (Thyme's evaluation drops its "Please select ..." line there); None: all of it
    fast_cut: str | None
    # phase I (screen), phase II (speculate)
    screen_system: str | None  # None: the chat template's default system prompt
    screen_suffix: str
    screen_stop: tuple[str, ...]
    screen_strip: bool  # white space before the verdict is dropped before it is read
    # a generation that stops at a stop string keeps the whole token that completed it
    # (transformers' stop_strings, then the tokens decoded, as the evaluation does: a last
    # token ">\n" leaves "</code>\n"); else the text is cut right after the stop string
    stop_keeps_token: bool
    speculate_system: str | None
    speculate_suffix: str
    speculate_suffix_with_options: str
    answer_strip: bool  # a small answer without <answer> tags is stripped (else kept whole)
    # phase IV (DeepEyes)
    agent_system: str
    agent_first_turn: str  # fields {question}, {suffix}
    agent_suffix: str  # the instruction that ends every user turn
    agent_stop: tuple[str, ...]
    # the tokens that end phases I and IV; None: the checkpoint's end-of-sequence tokens
    end_tokens: tuple[str, ...] | None
    malformed: MalformedPolicy
    box_rule: BoxRule
    min_box_side: int  # boxes with a side <= this are refused (0: none)
    max_box_aspect: float  # boxes with a longer aspect ratio are refused
    # every image is resized to this grid (bicubic) before the processor; None: the
    # processor's own rule resizes it
    image_grid: ResizeRule | None

    def question_block(self, question: str, options: Sequence[str] | None) -> str:
        """The question and its lettered options, laid out as this protocol shows them."""
        if self.strip_question:
            question = question.strip()
        if not options:
            return self.question_without_options.format(question=question)
        lines = "".join(
            self.option_line.format(letter=OPTION_LETTERS[i], option=option)
            for i, option in enumerate(options)
        )
        return self.question_with_options.format(
            question=question, options=self.options_prefix + lines
        )

    def fast_question(self, question: str, options: Sequence[str] | None) -> str:
        """The question as phases I and II show it."""
        block = self.question_block(question, options)
        return block.split(self.fast_cut)[0] if self.fast_cut is not None else block

    def screen_text(self, question: str, options: Sequence[str] | None) -> str:
        return self.fast_question(question, options) + self.screen_suffix

    def speculate_text(self, question: str, options: Sequence[str] | None) -> str:
        suffix = self.speculate_suffix_with_options if options else self.speculate_suffix
        return self.fast_question(question, options) + suffix

    def screen_chat(
        self, image: Image.Image, question: str, options: Sequence[str] | None
    ) -> list[Message]:
        """Phase I: would tools help? (the large model answers yes or no)."""
        return _chat(self.screen_system, image, self.screen_text(question, options))

    def speculate_chat(
        self, image: Image.Image, question: str, options: Sequence[str] | None
    ) -> list[Message]:
        """Phase II: the small model answers directly."""
        return _chat(self.speculate_system, image, self.speculate_text(question, options))

    def screen_query(self, query: Query) -> list[Message]:
        """Phase I for a job: its image on this protocol's grid, its question."""
        return self.screen_chat(self.view(query.image), query.question, query.options)

    def speculate_query(self, query: Query) -> list[Message]:
        """Phase II for a job: its image on this protocol's grid, its question."""
        return self.speculate_chat(self.view(query.image), query.question, query.options)

    def agent_start(
        self, image: Image.Image, question: str, options: Sequence[str] | None
    ) -> list[Message]:
        """Phase IV: the tool prompt and the first user turn."""
        text = self.agent_first_turn.format(
            question=self.question_block(question, options), suffix=self.agent_suffix
        )
        return [Message("system", [self.agent_system]), Message("user", [image, text])]

    def tool_response(self, observation: Image.Image | str) -> Message:
        """The user turn that returns a zoom's crop (or, ``observe``, an error)."""
        return Message(
            "user", ["<tool_response>", observation, self.agent_suffix, "</tool_response>"]
        )

    def says_tool_free(self, raw_text: str) -> bool:
        """Phase I's verdict on the screen's output (``screen_says_tool_free``)."""
        return screen_says_tool_free(raw_text, strip=self.screen_strip)

    def view(self, image: Image.Image) -> Image.Image:
        """The image as handed to the processor."""
        return self.image_grid.apply(image) if self.image_grid is not None else image

    def file_view(self, image: Image.Image) -> Image.Image:
        """The image as handed to the processor where the evaluation names its file
        instead (Thyme's agent: qwen_vl_utils makes it RGB, then resizes it)."""
        return self.image_grid.fetch(image) if self.image_grid is not None else image


def _chat(system: str | None, image: Image.Image, text: str) -> list[Message]:
    turns = [Message("system", [system])] if system is not None else []
    return [*turns, Message("user", [image, text])]


def _from_module(module: ModuleType) -> Protocol:
    """The protocol a module declares: one upper-case constant per field."""
    return Protocol(**{f.name: getattr(module, f.name.upper()) for f in fields(Protocol)})


REFERENCE = _from_module(reference)
THYME = _from_module(thyme)
V0 = _from_module(v0)

PROTOCOLS: dict[str, Protocol] = {"reference": REFERENCE, "thyme": THYME, "v0": V0}


def get_protocol(name: str) -> Protocol:
    try:
        return PROTOCOLS[name]
    except KeyError:
        known = ", ".join(PROTOCOLS)
        raise ConfigurationError(f"unknown protocol {name!r} (known: {known})") from None


def screen_says_tool_free(raw_text: str, *, strip: bool = True) -> bool:
    """SPEC's rule: output starting with "no" (case-insensitive) is tool-free; anything
    else, malformed or empty output included, means tools are needed.

    ``strip``: white space before it is dropped first (``v0``, and SPEC's brief). The
    evaluation does not strip (``output_text.lower().startswith("no")`` in both
    ``SpecEyes.py``), so under ``reference`` and ``thyme`` "\nNo" needs tools.
    """
    text = raw_text.strip() if strip else raw_text
    return text.lower().startswith("no")
