"""A model behind an OpenAI-compatible server (vLLM, SGLang, or any that returns
``top_logprobs``): every phase as ``POST {base}/chat/completions``.

- Images go as PNG data URLs, already on the protocol's grid (what an in-process
  processor would see), so the server's processor resizes nothing further.
- Greedy (``temperature: 0``); stop strings via ``stop``, with the protocol's end tokens
  appended (``"<|im_end|>"``: a server ends at its end-of-sequence tokens anyway, and a
  server that matches special tokens ends where the in-process backend does); the text
  comes back with its stop string (``include_stop_str_in_output``, or appended from
  ``stop_reason`` when a server ignores that field). It ends there: a server cuts at the
  string, so the rest of the token that completed it (``>\n`` after ``</code>``), which
  the evaluation keeps (its in-process ``generate``, as ours under ``reference`` and
  ``thyme``), cannot be had; the next turn then reads ``</code><sandbox_output>`` where
  the evaluation's reads ``</code>\n<sandbox_output>``.
- Phase II asks for ``logprobs`` with ``top_logprobs: K``. The gate's score of a token is
  unchanged by a shift of its row, so the K log-probabilities give exactly the K-logit
  score (``TokenScores`` with a log-normaliser of 0). A server that caps K (vLLM's
  ``--max-logprobs``, 20 by default) refuses with a 400; that becomes one clear
  ``ConfigurationError`` saying how to raise the cap or lower K.
- A conversation Thyme continues (``Conversation.continue_cut``) that ends with an
  assistant turn is continued, not answered anew: ``continue_final_message: true,
  add_generation_prompt: false`` (vLLM's chat extensions); any other gets a new assistant
  turn, as the evaluation's ``get_response`` always asks. The server's chat template
  cuts at the turn's last text, stripped; for Thyme's continuation after a sandbox
  output (``</sandbox_output>``) that is exactly the reference's cut. One edge differs:
  after a failed execution in Thyme's first step the reference continues the *user*
  turn keeping its final newline; a server drops it.
- The requests of a micro-batch go out at once through the endpoint's one long-lived
  client (``common.backends.inference_client``: pooled connections, at most ``concurrency`` in
  flight); 429, 5xx and connection errors are tried again by the service's one backoff
  (capped, jittered, honouring ``Retry-After``), then raised as ``BackendUnavailable``
  (retryable: the job is tried again later); other 4xx are errors of the request
  (``ModelError``), 401/403/404 of the configuration.
"""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from PIL import Image

from common.backends.base import Generation, Speculation, final_answer
from common.backends.inference_client import Backoff, ChatClient, Refused
from common.chat import Conversation, Message
from common.contracts import Query, ScreenResult
from common.errors import ConfigurationError, ModelError
from common.images import ResizeRule
from common.protocols import Protocol
from common.scores import TokenScores

log = logging.getLogger(__name__)

# a placeholder vLLM puts in top_logprobs for tokens it could not score
PLACEHOLDER = -9999.0


@dataclass(frozen=True)
class Endpoint:
    """One served model: where, which, with what key (never logged or printed)."""

    base_url: str  # e.g. http://gpu-1:8000/v1
    model: str  # the name the server serves it under
    api_key: str | None = None
    timeout_s: float = 120.0
    retries: int = 3
    backoff: Backoff = field(default_factory=Backoff)
    concurrency: int = 16

    def __repr__(self) -> str:
        return f"Endpoint({self.base_url!r}, model={self.model!r})"


class ServerModel:
    """``VisionLanguageModel`` over an OpenAI-compatible chat completions API."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        protocol: Protocol,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.name = endpoint.model
        self.protocol = protocol
        self.resize_rule = protocol.image_grid or ResizeRule()
        self.client = ChatClient(
            endpoint.base_url,
            api_key=endpoint.api_key,
            timeout_s=endpoint.timeout_s,
            retries=endpoint.retries,
            backoff=endpoint.backoff,
            concurrency=endpoint.concurrency,
            name=repr(endpoint),
            transport=transport,
        )

    # -- the protocol ---------------------------------------------------------------
    def screen(self, queries: Sequence[Query], *, max_new_tokens: int) -> list[ScreenResult]:
        stop = self._stops(self.protocol.screen_stop)
        bodies = [
            self._body(self.protocol.screen_query(query), max_new_tokens, stop) for query in queries
        ]
        screens = []
        for reply in self._all(bodies):
            text = _text(reply, stop)
            read, written = _tokens(reply)
            needs_tools = not self.protocol.says_tool_free(text)
            screens.append(ScreenResult(needs_tools, text, read, written))
        return screens

    def speculate(
        self, queries: Sequence[Query], *, max_new_tokens: int, top_k: int
    ) -> list[Speculation]:
        bodies = [
            self._body(self.protocol.speculate_query(query), max_new_tokens, ())
            | {"logprobs": True, "top_logprobs": top_k}
            for query in queries
        ]
        replies = self._all(bodies)
        strip = self.protocol.answer_strip
        return [_speculation(reply, top_k, strip) for reply in replies]

    def generate(
        self,
        conversation: Conversation,
        *,
        stop: Sequence[str],
        max_new_tokens: int,
        ignore_eos: bool = False,
    ) -> Generation:
        stops = self._stops(stop)
        proceed = conversation.continue_cut is not None
        body = self._body(conversation.messages, max_new_tokens, stops, proceed=proceed)
        if ignore_eos:
            body["ignore_eos"] = True  # (vLLM's sampling parameter; special tokens skipped)
        (reply,) = self._all([body])
        return _generation(reply, stop, stops)

    def agent_turns(
        self, conversations: Sequence[Conversation], *, max_new_tokens: int, top_k: int
    ) -> list[Generation]:
        stop = self.protocol.agent_stop
        stops = self._stops(stop)
        bodies = [
            self._body(conversation.messages, max_new_tokens, stops)
            | {"logprobs": True, "top_logprobs": top_k}
            for conversation in conversations
        ]
        generations = []
        for reply in self._all(bodies):
            rows, pieces = _scored_tokens(reply, top_k)
            scores = TokenScores(rows, [0.0] * len(rows))
            generations.append(
                replace(_generation(reply, stop, stops), scores=scores, pieces=pieces)
            )
        return generations

    def render(self, chat: Sequence[Message], continue_cut: str | None = None) -> str:
        """What is sent: the request's messages as JSON (the server renders them with the
        model's chat template), images shown as ``<image WxH>``."""
        return json.dumps(_messages(chat, images_as_text=True), indent=1, ensure_ascii=False)

    # -- requests -------------------------------------------------------------------
    def _stops(self, stop: Sequence[str]) -> list[str]:
        ends = [t for t in (self.protocol.end_tokens or ()) if t not in stop]
        return [*stop, *ends]

    def _body(
        self,
        chat: Sequence[Message],
        max_tokens: int,
        stop: Sequence[str],
        *,
        proceed: bool = False,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": _messages(chat),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "include_stop_str_in_output": True,
        }
        if stop:
            body["stop"] = list(stop)
        if proceed and chat and chat[-1].role == "assistant":
            body |= {"continue_final_message": True, "add_generation_prompt": False}
        return body

    def _all(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send every body at once (at most ``concurrency`` in flight); replies in order."""
        replies = self._send(bodies)
        for reply in replies:
            try:
                reply["choices"][0]
            except (KeyError, IndexError, TypeError):
                shown = str(reply)[:200]
                raise ModelError(f"{self.endpoint!r}: not a chat completion: {shown}") from None
        return replies

    def _send(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        try:
            return self.client.complete_all(bodies)
        except Refused as refused:
            body = next((b for b in bodies if b.get("top_logprobs")), bodies[0])
            raise _refusal(refused.response, body, self.endpoint) from None


def _refusal(response: httpx.Response, body: dict[str, Any], endpoint: Endpoint) -> Exception:
    detail = _detail(response)
    if response.status_code in (401, 403):
        return ConfigurationError(f"{endpoint!r} refused the key (HTTP {response.status_code})")
    if response.status_code == 404:
        return ConfigurationError(f"{endpoint!r}: HTTP 404 ({detail}); is the model served?")
    if "logprobs" in detail.lower() and body.get("top_logprobs"):
        return ConfigurationError(
            f"{endpoint!r} refused top_logprobs={body['top_logprobs']} ({detail}): the gate "
            f"needs K={body['top_logprobs']} log-probabilities per token; start vLLM with "
            f"--max-logprobs {body['top_logprobs']} or more, or lower SPECEYES_GATE_TOP_K"
        )
    return ModelError(f"{endpoint!r}: HTTP {response.status_code}: {detail}")


def _detail(response: httpx.Response) -> str:
    try:
        payload = response.json()
    except ValueError:
        return response.text[:300]
    error = payload.get("error", payload) if isinstance(payload, dict) else payload
    if isinstance(error, dict):
        return str(error.get("message") or error)[:300]
    return str(error)[:300]


def _messages(chat: Sequence[Message], *, images_as_text: bool = False) -> list[dict[str, Any]]:
    out = []
    for message in chat:
        parts: list[dict[str, Any]] = []
        for part in message.content:
            if isinstance(part, Image.Image):
                url = f"<image {part.width}x{part.height}>" if images_as_text else _data_url(part)
                parts.append({"type": "image_url", "image_url": {"url": url}})
            else:
                parts.append({"type": "text", "text": part})
        out.append({"role": message.role, "content": parts})
    return out


def _data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _text(reply: dict[str, Any], stop: Sequence[str]) -> str:
    """The reply's text, cut right after its stop string (appended from ``stop_reason``
    when the server left it out)."""
    choice = reply["choices"][0]
    text = str((choice.get("message") or {}).get("content") or "")
    reason = choice.get("stop_reason")
    if isinstance(reason, str) and reason in stop and not text.endswith(reason):
        text += reason
    ends = [text.find(s) + len(s) for s in stop if s and s in text]
    return text[: min(ends)] if ends else text


def _generation(reply: dict[str, Any], stop: Sequence[str], stops: Sequence[str]) -> Generation:
    """An agent step's reply: its text cut at its stop, why it ended, its token count."""
    choice = reply["choices"][0]
    finish = "length" if choice.get("finish_reason") == "length" else "stop"
    text = _text(reply, stops)
    if finish == "stop" and not any(text.endswith(s) for s in stop):
        finish = "eos"
    read, written = _tokens(reply)
    return Generation(text, finish, written, prompt_tokens=read)  # type: ignore[arg-type]


def _tokens(reply: dict[str, Any]) -> tuple[int, int]:
    """The tokens a reply says it read and wrote (its ``usage``; 0 where it says none)."""
    usage = reply.get("usage")
    counts = [usage.get(name) if isinstance(usage, dict) else None for name in _USAGE]
    return tuple(  # type: ignore[return-value]
        count if isinstance(count, int) and count >= 0 else 0 for count in counts
    )


_USAGE = ("prompt_tokens", "completion_tokens")


def _speculation(reply: dict[str, Any], top_k: int, strip: bool) -> Speculation:
    choice = reply["choices"][0]
    text = str((choice.get("message") or {}).get("content") or "")
    rows, _ = _scored_tokens(reply, top_k)
    answer = final_answer(text, strip=strip)
    scores = TokenScores(rows, [0.0] * len(rows))  # log-probabilities: normalised already
    # (a server tells no token ids)
    return Speculation(answer, None, scores, prompt_tokens=_tokens(reply)[0])


def _scored_tokens(reply: dict[str, Any], top_k: int) -> tuple[list[list[float]], tuple[str, ...]]:
    """Each token's top-K log-probabilities, descending (the server's placeholders left
    out), and each token's text; a server that returns fewer than K is refused."""
    content = (reply["choices"][0].get("logprobs") or {}).get("content") or []
    rows: list[list[float]] = []
    for entry in content:
        values = sorted(
            (
                float(top["logprob"])
                for top in entry.get("top_logprobs") or []
                if float(top["logprob"]) > PLACEHOLDER
            ),
            reverse=True,
        )
        returned = len(entry.get("top_logprobs") or [])
        if returned < top_k or len(values) < 2:
            raise ConfigurationError(
                f"the server returned {returned} log-probabilities for a token, the gate "
                f"needs K={top_k}: raise the server's cap (vLLM: --max-logprobs {top_k}) or "
                "lower SPECEYES_GATE_TOP_K"
            )
        rows.append(values)
    return rows, tuple(str(entry.get("token") or "") for entry in content)
