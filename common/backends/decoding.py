"""What turns a ``generate`` call's raw output into rows: the top-K scores the gate
reads, where a stop string ends a row, and a stop on request (``TransformersModel``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch
from transformers import StoppingCriteria


class WhenSet(StoppingCriteria):
    """Ends every row at the next token once ``event`` is set."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        rows = input_ids.shape[0]
        return torch.full((rows,), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


def shortest_with_stop(decode: Any, tokens: list[int], stop: Sequence[str]) -> int:
    """The fewest leading tokens whose text already holds a stop string (binary search:
    once a prefix holds one, every longer prefix does)."""
    low, high = 1, len(tokens)
    while low < high:
        middle = (low + high) // 2
        if cut_after_stop(decode(tokens[:middle]), stop) is not None:
            high = middle
        else:
            low = middle + 1
    return high


def top_scores(
    logits: Sequence[torch.Tensor], top_k: int
) -> tuple[list[list[list[float]]], list[list[float]]]:
    """Per step [B, V] raw logits -> top-K values [steps][B][K] and log-sum-exp [steps][B]."""
    tops, norms = [], []
    for step in logits:  # one step at a time: a [steps, B, V] stack would be large
        row = step.float()
        tops.append(row.topk(min(top_k, row.shape[-1]), dim=-1).values)
        norms.append(torch.logsumexp(row, dim=-1))
    if not tops:
        return [], []
    return torch.stack(tops).cpu().tolist(), torch.stack(norms).cpu().tolist()


def cut_after_stop(text: str, stop: Sequence[str]) -> str | None:
    ends = [text.find(s) + len(s) for s in stop if s and s in text]
    return text[: min(ends)] if ends else None
