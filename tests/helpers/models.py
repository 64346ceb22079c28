"""Controlling what a real (tiny) model says: with random weights, assert on shapes,
routing and stopping, and force the text where the test needs one."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class ForceText:
    """A logits processor that makes generate() write the given texts, one per call.

    Each new generate() call (seen as an input that did not grow by one token) takes the
    next text; after its tokens come EOS. (A new prompt exactly one token longer than the
    last input would read as the same call: vary a forced text where that could happen.)
    Only the *processed* scores are forced: the raw logits a backend records stay the
    model's own.
    """

    def __init__(self, tokenizer, texts: Sequence[str | list[int]], eos_id: int) -> None:
        # a text is written as the tokenizer encodes it; a list of token ids as it is (to
        # make the model write a text in tokens of a chosen cut)
        self.targets = [
            text if isinstance(text, list) else tokenizer.encode(text, add_special_tokens=False)
            for text in texts
        ]
        self.eos_id = eos_id
        self.call = -1
        self.prompt_length = 0
        self.last_length = -1

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        if length != self.last_length + 1:  # a new generate() call
            self.call += 1
            self.prompt_length = length
        self.last_length = length
        target = self.targets[min(self.call, len(self.targets) - 1)]
        position = length - self.prompt_length
        token = target[position] if position < len(target) else self.eos_id
        forced = torch.full_like(scores, float("-inf"))
        forced[:, token] = 0.0
        return forced


class ForceRows:
    """A logits processor that makes one batched generate() write a text per row (row i
    the i-th text, then EOS): rows of different lengths in one batch."""

    def __init__(self, tokenizer, texts: Sequence[str], eos_id: int) -> None:
        self.targets = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
        self.eos_id = eos_id
        self.prompt_length: int | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
        position = input_ids.shape[1] - self.prompt_length
        forced = torch.full_like(scores, float("-inf"))
        for row, target in enumerate(self.targets):
            forced[row, target[position] if position < len(target) else self.eos_id] = 0.0
        return forced
