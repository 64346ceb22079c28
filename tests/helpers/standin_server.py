"""An OpenAI-compatible stand-in server for tests: the tiny checkpoints behind
``POST /v1/chat/completions``, answering as vLLM does (the fields the server backend
uses: stop strings kept in the text, ``finish_reason`` / ``stop_reason``, ``logprobs``
with ``top_logprobs`` capped at ``max_logprobs``, ``continue_final_message``).

A stop string that is a special token (``<|im_end|>``) ends generation at that token, as
an end token, instead of the checkpoint's end-of-sequence tokens: the in-process
backend's end tokens, so that both backends generate the same text.
"""

from __future__ import annotations

import base64
import io
import threading
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from PIL import Image

from common.backends.transformers_backend import TransformersModel, template_messages
from common.chat import Message
from lab.ports import free_port
from tests.helpers.waiting import wait_until


class StandIn:
    def __init__(
        self,
        models: dict[str, TransformersModel],
        *,
        max_logprobs: int = 128,
        failures: int = 0,
        key: str | None = None,
    ) -> None:
        self.models = models
        self.max_logprobs = max_logprobs
        self.failures = failures  # the next N requests answer 503
        self.key = key
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.complete)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/v1"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> StandIn:
        self.thread.start()
        wait_until(
            lambda: self.server.started, deadline_s=30, every_s=0.02, what="the server to start"
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    async def complete(self, request: Request) -> JSONResponse:
        body = await request.json()
        with self.lock:
            client = request.client.port if request.client else None
            self.requests.append(
                {"body": body, "auth": request.headers.get("authorization"), "port": client}
            )
            if self.failures > 0:
                self.failures -= 1
                return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        if self.key is not None and request.headers.get("authorization") != f"Bearer {self.key}":
            return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
        if body.get("logprobs") and int(body.get("top_logprobs") or 0) > self.max_logprobs:
            message = f"top_logprobs must be <= max_logprobs ({self.max_logprobs})"
            return JSONResponse({"error": {"message": message}}, status_code=400)
        model = self.models.get(body["model"])
        if model is None:
            return JSONResponse({"error": {"message": "no such model"}}, status_code=404)
        with self.lock:  # one generation at a time, as one model replica
            return JSONResponse(_complete(model, body))


def _complete(model: TransformersModel, body: dict[str, Any]) -> dict[str, Any]:
    chat = [_message(m) for m in body["messages"]]
    continuing = bool(body.get("continue_final_message"))
    rendered, _ = template_messages(chat)
    text = model.processor.apply_chat_template(
        rendered,
        tokenize=False,
        add_generation_prompt=not continuing,
        continue_final_message=continuing,
    )
    stops = list(body.get("stop") or [])
    special = [s for s in stops if s in model.tokenizer.all_special_tokens]
    end_ids = [model.tokenizer.convert_tokens_to_ids(s) for s in special] or None
    if body.get("ignore_eos"):  # (vLLM's: on past the end of turn, to max_tokens)
        end_ids = []
    top_k = int(body["top_logprobs"]) if body.get("logprobs") else None
    (row,) = model._generate(
        [chat],
        max_new_tokens=int(body.get("max_tokens") or 16),
        stop=[s for s in stops if s not in special],
        top_k=top_k,
        end_ids=end_ids,
        rendered=[text],
    )
    stop_reason = next(
        (s for s in stops if row.finish_reason == "stop" and row.text.endswith(s)), None
    )
    content = row.text
    if stop_reason is not None and not body.get("include_stop_str_in_output"):
        content = content[: -len(stop_reason)]
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "finish_reason": "length" if row.finish_reason == "length" else "stop",
        "stop_reason": stop_reason,
    }
    if top_k is not None and row.scores is not None:
        pieces = model._pieces(row.token_ids)  # (each token's text, as vLLM's "token")
        choice["logprobs"] = {
            "content": [
                {
                    "token": piece,
                    "logprob": values[0] - norm,
                    "top_logprobs": [{"token": "", "logprob": v - norm} for v in values],
                }
                for values, norm, piece in zip(
                    row.scores.top_values, row.scores.log_normalizer, pieces, strict=True
                )
            ]
        }
    usage = {"prompt_tokens": row.prompt_tokens, "completion_tokens": len(row.token_ids)}
    return {
        "object": "chat.completion",
        "model": body["model"],
        "choices": [choice],
        "usage": usage,
    }


def _message(raw: dict[str, Any]) -> Message:
    content = raw["content"]
    if isinstance(content, str):
        return Message(raw["role"], [content])
    parts: list[Any] = []
    for part in content:
        if part["type"] == "text":
            parts.append(part["text"])
        else:
            data = part["image_url"]["url"].split(",", 1)[1]
            parts.append(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))
    return Message(raw["role"], parts)
