"""The transformers backend: Qwen2.5-VL and Qwen3-VL checkpoints through the Auto classes.

One ``TransformersModel`` holds one loaded checkpoint (loaded once). Every call goes
through ``_generate``, which:

1. renders each chat with the checkpoint's own chat template;
2. runs the processor over the batch with LEFT padding (rows of different lengths line
   up at the end, so the first new token of every row comes from the same step);
3. generates greedily, with the raw logits of every step (``output_logits``);
4. cuts each row at its first EOS / pad token (and at a stop string, when asked: after
   the whole token that completed it under `reference` and `thyme`, as the evaluation
   decodes it; right after the string under `v0`);
5. reduces each step's logits to the top K and the log-sum-exp on the device, and moves
   them to the CPU once, as plain lists.

Batched rows give the same tokens as the same rows run alone (a test holds this).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
import transformers
from PIL import Image
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessorList,
    StoppingCriteriaList,
)
from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
from transformers.utils import is_torchvision_available

from common.backends.base import FinishReason, Generation, Speculation, final_answer
from common.backends.decoding import WhenSet, cut_after_stop, shortest_with_stop, top_scores
from common.chat import Conversation, Message
from common.contracts import Query, ScreenResult
from common.errors import ConfigurationError, Interrupted
from common.images import ResizeRule
from common.models.full_size import random_init_seed
from common.protocols import REFERENCE, Protocol
from common.scores import TokenScores

WARM_UP_CALLS = 3  # (the first three calls of a process were the slow ones)


@dataclass
class _Row:
    """One generated row: its answer tokens and, when asked, their top-K scores."""

    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    scores: TokenScores | None
    prompt_tokens: int = 0


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def load_processor(path: str) -> Any:
    """The checkpoint's processor; without torchvision, its image + text part only.

    Qwen's processors insist on a video processor, which needs torchvision; the image
    processor falls back to its PIL version, so dropping the video part keeps images and
    text working where torchvision cannot be installed.
    """

    if is_torchvision_available():
        return AutoProcessor.from_pretrained(path)
    model_type = AutoConfig.from_pretrained(path).model_type
    processor_cls = getattr(transformers, PROCESSOR_MAPPING_NAMES[model_type])

    class ImageTextProcessor(processor_cls):  # type: ignore[valid-type,misc]
        # ProcessorMixin derives its parts from this signature: no video_processor here.
        def __init__(self, image_processor: Any = None, tokenizer: Any = None, **kwargs: Any):
            super().__init__(image_processor, tokenizer, None, **kwargs)

    tokenizer = AutoTokenizer.from_pretrained(path)
    return ImageTextProcessor(
        image_processor=AutoImageProcessor.from_pretrained(path),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )


class TransformersModel:
    """A Qwen-VL checkpoint that can screen, speculate and take agent steps."""

    def __init__(
        self,
        path: str,
        *,
        name: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        logits_processors: Sequence[Any] = (),
        protocol: Protocol = REFERENCE,
        stop: threading.Event | None = None,
    ) -> None:
        """``stop``: once set, a generation in progress ends at its next token and raises
        ``Interrupted`` (the process is stopping: Ctrl-C)."""
        self.name = name or path
        self.stop = stop or threading.Event()
        self.protocol = protocol
        self.device = resolve_device(device)
        try:
            self.processor = load_processor(path)
            self.model = _load_model(path, resolve_dtype(dtype, self.device), self.device)
        except (OSError, ValueError, KeyError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigurationError(
                f"cannot load model {path!r}: not a checkpoint folder here, and it could not "
                f"be downloaded ({reason})"
            ) from exc
        self.model.to(self.device)
        self.model.eval()
        self.tokenizer = self.processor.tokenizer
        self.tokenizer.padding_side = "left"
        self.logits_processors = list(logits_processors)
        generation = self.model.generation_config
        eos = generation.eos_token_id
        eos_ids = eos if isinstance(eos, list) else [eos]
        self.pad_id = generation.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.pad_token_id
        self.eos_ids = [token for token in eos_ids if token is not None]
        # phases I and IV end at the protocol's end tokens, or at the checkpoint's own
        self.turn_end_ids = (
            [self.tokenizer.convert_tokens_to_ids(t) for t in protocol.end_tokens]
            if protocol.end_tokens is not None
            else self.eos_ids
        )
        image_processor = self.processor.image_processor
        self.processor_rule = ResizeRule(
            factor=image_processor.patch_size * image_processor.merge_size,
            min_pixels=image_processor.size["shortest_edge"],
            max_pixels=image_processor.size["longest_edge"],
        )
        # The grid the images are shown at: the protocol's (resized before the processor)
        # or, without one, the processor's own.
        self.resize_rule = protocol.image_grid or self.processor_rule

    # -- the protocol ---------------------------------------------------------------
    def screen(self, queries: Sequence[Query], *, max_new_tokens: int) -> list[ScreenResult]:
        chats = [self.protocol.screen_query(query) for query in queries]
        rows = self._generate(
            chats,
            max_new_tokens=max_new_tokens,
            stop=self.protocol.screen_stop,
            end_ids=self.turn_end_ids,
        )
        return [
            ScreenResult(
                not self.protocol.says_tool_free(row.text),
                row.text,
                row.prompt_tokens,
                len(row.token_ids),
            )
            for row in rows
        ]

    def speculate(
        self, queries: Sequence[Query], *, max_new_tokens: int, top_k: int
    ) -> list[Speculation]:
        chats = [self.protocol.speculate_query(query) for query in queries]
        rows = self._generate(chats, max_new_tokens=max_new_tokens, top_k=top_k)
        return [
            Speculation(
                final_answer(row.text, strip=self.protocol.answer_strip),
                row.token_ids,
                row.scores or TokenScores([], []),
                row.prompt_tokens,
            )
            for row in rows
        ]

    def render(self, chat: Sequence[Message], continue_cut: str | None = None) -> str:
        """The exact text the chat template makes of ``chat`` (before the processor
        expands each image into its visual tokens): what the model is asked."""
        rendered, _ = template_messages(chat)
        if continue_cut is not None:  # Thyme's evaluation: no prompt, the turn's end cut
            whole: str = self.processor.apply_chat_template(
                rendered, tokenize=False, add_generation_prompt=False
            )
            return whole.removesuffix(continue_cut)
        # a new assistant turn, whoever wrote the last one (the evaluation's get_response:
        # add_generation_prompt=True after its assistant-turn instruction, or SpecReason's
        # kept steps)
        text: str = self.processor.apply_chat_template(
            rendered, tokenize=False, add_generation_prompt=True
        )
        return text

    def warm_up(self) -> None:
        """One short generation on a small image, once loaded: a process's first calls
        pay for what the runtime sets up once (about 0.1 s each for the first three
        on the tiny agent on CPU), and no job should be charged it, nor wait for it."""
        image = Image.new("RGB", (self.processor_rule.factor * 2,) * 2, (128, 128, 128))
        for _ in range(WARM_UP_CALLS):
            self._generate([[Message("user", [image, "Hello"])]], max_new_tokens=2)

    def generate(
        self,
        conversation: Conversation,
        *,
        stop: Sequence[str],
        max_new_tokens: int,
        ignore_eos: bool = False,
    ) -> Generation:
        (row,) = self._generate(
            [conversation.messages],
            max_new_tokens=max_new_tokens,
            stop=stop,
            end_ids=[] if ignore_eos else self.turn_end_ids,
            continue_cut=conversation.continue_cut,
        )
        return Generation(
            row.text, row.finish_reason, len(row.token_ids), prompt_tokens=row.prompt_tokens
        )

    def agent_turns(
        self, conversations: Sequence[Conversation], *, max_new_tokens: int, top_k: int
    ) -> list[Generation]:
        rows = self._generate(
            [conversation.messages for conversation in conversations],
            max_new_tokens=max_new_tokens,
            stop=self.protocol.agent_stop,
            top_k=top_k,
            end_ids=self.turn_end_ids,
        )
        return [
            Generation(
                row.text,
                row.finish_reason,
                len(row.token_ids),
                row.scores,
                self._pieces(row.token_ids),
                row.prompt_tokens,
            )
            for row in rows
        ]

    # -- the one generation path --------------------------------------------------------
    @torch.inference_mode()
    def _generate(
        self,
        chats: Sequence[Sequence[Message]],
        *,
        max_new_tokens: int,
        stop: Sequence[str] = (),
        top_k: int | None = None,
        end_ids: Sequence[int] | None = None,
        continue_cut: str | None = None,
        rendered: Sequence[str] | None = None,
    ) -> list[_Row]:
        """``end_ids``: the tokens that end a row (default: the checkpoint's own);
        ``rendered``: the chats' texts when the caller rendered them already."""

        ends = list(end_ids) if end_ids is not None else self.eos_ids
        texts: list[str] = []
        images: list[Image.Image] = []
        for index, chat in enumerate(chats):
            texts.append(rendered[index] if rendered else self.render(chat, continue_cut))
            images.extend(part for message in chat for part in message.images)
        inputs = self.processor(
            text=texts, images=images or None, padding=True, return_tensors="pt"
        ).to(self.device)
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=ends,
            pad_token_id=self.pad_id,
            output_logits=top_k is not None,
            return_dict_in_generate=True,
            stop_strings=list(stop) or None,
        )
        self._check_stop()
        output = self.model.generate(
            **inputs,
            generation_config=config,
            logits_processor=LogitsProcessorList(self.logits_processors),
            stopping_criteria=StoppingCriteriaList([WhenSet(self.stop)]),
            tokenizer=self.tokenizer if stop else None,
        )
        self._check_stop()  # cut short: its rows are not what the model would have said
        new_tokens = output.sequences[:, inputs["input_ids"].shape[1] :].tolist()
        top_values = log_norm = None
        if top_k is not None:
            top_values, log_norm = top_scores(output.logits, top_k)
        prompts = inputs["attention_mask"].sum(dim=1).tolist()  # (padding left out)
        return [
            replace(
                self._row(tokens, stop, top_values, log_norm, index, max_new_tokens, set(ends)),
                prompt_tokens=int(prompts[index]),
            )
            for index, tokens in enumerate(new_tokens)
        ]

    def _pieces(self, tokens: list[int]) -> tuple[str, ...]:
        """Each token's text: what it adds to the decoded text before it (a token that
        ends inside a character adds nothing until the one that completes it). Decoded
        as servers detokenize a stream: at each step only the tokens since the last whole
        piece, with that piece for context (prefix by prefix cost a turn's length squared)."""
        decode = partial(self.tokenizer.decode, skip_special_tokens=True)
        pieces: list[str] = []
        start = read = 0  # tokens[start:read]: the context already given out
        for length in range(1, len(tokens) + 1):
            before = decode(tokens[start:read])
            text = decode(tokens[start:length])
            if text.endswith("\ufffd") or not text.startswith(before):
                pieces.append("")  # (a character not yet whole)
                continue
            pieces.append(text[len(before) :])
            start, read = read, length
        return tuple(pieces)

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise Interrupted("the model stopped generating: the process is stopping")

    def _stop_length(self, tokens: list[int], stop: Sequence[str]) -> int:
        def decode(part: list[int]) -> str:
            return str(self.tokenizer.decode(part, skip_special_tokens=True))

        return shortest_with_stop(decode, tokens, stop)

    def _row(
        self,
        tokens: list[int],
        stop: Sequence[str],
        top_values: list[list[list[float]]] | None,
        log_norm: list[list[float]] | None,
        index: int,
        max_new_tokens: int,
        ends: set[int],
    ) -> _Row:
        # a row ends at its first end token; the padding after it comes only after one
        length = next((i for i, token in enumerate(tokens) if token in ends), len(tokens))
        answer = tokens[:length]
        text = self.tokenizer.decode(answer, skip_special_tokens=True)
        ended = length < len(tokens) or length < max_new_tokens
        finish: FinishReason = "eos" if ended else "length"
        cut = cut_after_stop(text, stop)
        if cut is not None:
            finish = "stop"
            # in a batch, a row that stopped early goes on (padded) while others run:
            # its tokens are those up to the one that completed the stop string
            answer = answer[: self._stop_length(answer, stop)]
            if self.protocol.stop_keeps_token:  # that whole token, as the evaluation
                text = self.tokenizer.decode(answer, skip_special_tokens=True)
            else:
                text = cut
        scores = None
        if top_values is not None and log_norm is not None:
            kept = len(answer)  # (a row cut at its stop string: its batch-mates went on)
            scores = TokenScores(
                [step[index] for step in top_values[:kept]],
                [step[index] for step in log_norm[:kept]],
            )
        return _Row(answer, text, finish, scores)


def _load_model(path: str, dtype: torch.dtype, device: torch.device) -> Any:
    """The checkpoint at ``path``; a random-init folder (``common.models.full_size``) is
    built from its config on the device itself, seeded (no weights to read)."""

    seed = random_init_seed(path) if Path(path).is_dir() else None
    if seed is None:
        return AutoModelForImageTextToText.from_pretrained(path, dtype=dtype)
    torch.manual_seed(seed)
    with device:
        return AutoModelForImageTextToText.from_config(
            AutoConfig.from_pretrained(path), dtype=dtype
        )


def template_messages(chat: Sequence[Message]) -> tuple[list[dict[str, Any]], list[Image.Image]]:
    """Our messages -> the chat template's dicts, and the images in order of appearance."""
    messages, images = [], []
    for message in chat:
        parts: list[dict[str, Any]] = []
        for part in message.content:
            if isinstance(part, Image.Image):
                parts.append({"type": "image"})
                images.append(part)
            else:
                parts.append({"type": "text", "text": part})
        messages.append({"role": message.role, "content": parts})
    return messages, images
