"""What a calibration run keeps to replay any gate later, exactly, without a model.

Per speculated job: the top ``REPLAY_K`` logits of every answer token and each token's
log-sum-exp, as float32 (the backend computes them in float32, so nothing is rounded:
a replayed gate decides exactly as the live one did), base64 in a small JSON record:
about 0.5 KB per answer token. (Replaying: ``common.calibration.replay``.)
"""

from __future__ import annotations

import base64
import json
from array import array

from common.scores import TokenScores


def encode(scores: TokenScores) -> str:
    """``scores`` as a compact JSON record (every row cut to the same width)."""
    width = min((len(row) for row in scores.top_values), default=0)
    top = array("f", (value for row in scores.top_values for value in row[:width]))
    norm = array("f", scores.log_normalizer)
    return json.dumps(
        {
            "tokens": scores.num_tokens,
            "k": width,
            "top": base64.b64encode(top.tobytes()).decode(),
            "norm": base64.b64encode(norm.tobytes()).decode(),
        }
    )


def decode(record: str) -> TokenScores:
    data = json.loads(record)
    tokens, width = int(data["tokens"]), int(data["k"])
    top, norm = array("f"), array("f")
    top.frombytes(base64.b64decode(data["top"]))
    norm.frombytes(base64.b64decode(data["norm"]))
    rows = [list(top[t * width : (t + 1) * width]) for t in range(tokens)]
    return TokenScores(rows, list(norm))
