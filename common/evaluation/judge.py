"""An LLM judge for benchmark answers the reference's rules leave undecided.

As the SpecEyes evaluation does (``judge_code/``): the judge model gets the reference's
prompt (``common.protocols.judge``) with the question, the standard answer (V*:
``A. <option>``; HR-Bench: the letter; POPE: yes / no) and the model's answer, at
temperature 0, and its reply is read as the reference reads it. Any OpenAI-compatible
endpoint serves (vLLM, SGLang, a hosted API). Verdicts are cached in the store by model
and exact prompt, so re-scoring a batch, or another batch with the same answer, asks
nothing twice; each row keeps its verdict (``batch_items.judge_verdict``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy.orm import Session, sessionmaker

from common.backends.inference_client import Backoff, ChatClient, Refused
from common.contracts import JobStatus
from common.errors import BackendUnavailable, ConfigurationError
from common.protocols.judge import SYSTEM, judge_prompt
from common.protocols.scoring import reference_verdict, standard_answer
from common.store import reads, verdicts
from common.store.ids import idempotency_key
from common.store.tables import JudgeVerdict, utcnow


def read_verdict(benchmark: str, response: str) -> bool:
    """The judge's reply as the reference reads it (anything unreadable: wrong)."""
    if "Judgement:" in response:
        return "1" in response.split("Judgement:")[-1]
    # judge_hr.py looks for a 1 anywhere; judge_vstar.py / judge_pope.py want exactly "1"
    return "1" in response if benchmark == "hr" else response == "1"


@dataclass
class JudgeCounts:
    asked: int = 0  # requests sent to the judge
    cached: int = 0  # verdicts found in the cache


class Judge:
    """One judge model behind an OpenAI-compatible ``/chat/completions``, through the
    service's one client (``common.backends.inference_client``: pooled, retried by the one
    backoff)."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        retries: int = 3,
        concurrency: int = 8,
        backoff: Backoff | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not model:
            raise ConfigurationError("a judge needs a model name: --judge-model NAME")
        self.model = model
        self.client = ChatClient(
            url,
            api_key=api_key,
            timeout_s=timeout_s,
            retries=retries,
            backoff=backoff,
            concurrency=concurrency,
            name=f"the judge at {url}",
            transport=transport,
        )

    def ask(self, prompt: str) -> str:
        """The judge's reply to ``prompt``; 429 / 5xx / lost connections tried again, then
        ``BackendUnavailable``, as any refusal."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": prompt},
            ],
            "temperature": 0.0,
        }
        try:
            reply = self.client.complete(body)
        except Refused as refused:
            status, text = refused.response.status_code, refused.response.text[:200]
            raise BackendUnavailable(
                f"{self.client.name} refused (HTTP {status}: {text})"
            ) from None
        try:
            return str(reply["choices"][0]["message"]["content"]).strip()
        except (KeyError, IndexError, TypeError):
            raise BackendUnavailable(f"{self.client.name}: not a chat completion") from None

    def close(self) -> None:
        self.client.close()


def judge_batch(
    sessions: sessionmaker[Session], batch_id: str, judge: Judge, *, concurrency: int = 8
) -> JudgeCounts:
    """Judge every finished benchmark row of the batch that the reference's rules leave
    undecided and that has no verdict yet. Prompts not in the cache go out ``concurrency``
    at a time (an inference server batches them); each verdict is committed as it comes,
    so an interrupted judging resumes where it stopped."""
    counts = JudgeCounts()
    with sessions() as session:
        rows = [
            (item.position, item.split, item.expected, job.question, job.options, job.scored_text)
            for item, job in reads.batch_results(session, batch_id)
            if item.split
            and item.expected
            and item.judge_verdict is None
            and job.status in (JobStatus.DONE, JobStatus.FAILED)  # (a failed one it scores)
            and job.scored_text is not None
        ]
    pending: dict[str, tuple[str, str, list[int]]] = {}  # key -> (benchmark, prompt, rows)
    for position, split, expected, question, options, answer in rows:
        assert answer is not None  # (kept only rows that have one)
        benchmark = split.split("/")[0]
        if reference_verdict(benchmark, answer, expected, options) is not None:
            continue
        prompt = judge_prompt(
            benchmark, question, standard_answer(benchmark, expected, options), answer
        )
        key = idempotency_key("judge", judge.model, prompt)
        pending.setdefault(key, (benchmark, prompt, []))[2].append(position)

    def settle(key: str, verdict: bool) -> None:
        with sessions.begin() as session:
            for position in pending[key][2]:
                verdicts.set_judge_verdict(session, batch_id, position, verdict)

    with sessions() as session:
        cached = {key: session.get(JudgeVerdict, key) for key in pending}
    for key, found in cached.items():
        if found is not None:
            settle(key, found.verdict)
            counts.cached += 1

    def ask(key: str) -> JudgeVerdict:
        benchmark, prompt, _ = pending[key]
        response = judge.ask(prompt)
        return JudgeVerdict(
            key=key,
            model=judge.model,
            verdict=read_verdict(benchmark, response),
            response=response,
            created_at=utcnow(),
        )

    to_ask = [key for key, found in cached.items() if found is None]
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for record in pool.map(ask, to_ask):
            with sessions.begin() as session:
                session.merge(record)
            settle(record.key, record.verdict)
            counts.asked += 1
    return counts
