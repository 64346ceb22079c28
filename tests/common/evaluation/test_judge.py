"""The LLM judge against a small OpenAI-compatible stand-in server (real HTTP on
127.0.0.1): the reference's prompt, its reading of the reply, retries, the cache."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from common.config import GateSettings
from common.contracts import Accepted, Stage
from common.evaluation.judge import Judge, judge_batch, read_verdict
from common.protocols.judge import judge_prompt
from common.store import analytics, claims, new_jobs, submission

QUESTION = "What is the colour of the cup?"


class StandIn:
    """``POST /v1/chat/completions``: "Judgement: 1" when the answer under judgement is
    "red", else "Judgement: 0"; the first ``fail_first`` requests get a 503."""

    def __init__(self, fail_first: int = 0) -> None:
        self.requests: list[dict] = []
        self.fail_first = fail_first
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stand_in.requests.append({"path": self.path, **body})
                if len(stand_in.requests) <= stand_in.fail_first:
                    self.send_response(503)
                    self.end_headers()
                    return
                asked = body["messages"][-1]["content"].rsplit("[Model_answer] : ", 1)[1]
                verdict = "1" if asked.startswith("red\n") else "0"
                message = {"role": "assistant", "content": f"Judgement: {verdict}"}
                reply = {"choices": [{"message": message}]}
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn(fail_first=1)
    yield server
    server.close()


def answered_batch(sessions, key: str, answers: list[str]) -> str:
    """A V* batch whose rows the small model answered with ``answers``."""
    items = [
        new_jobs.NewItem(
            i,
            f"row{i}",
            QUESTION,
            ["red", "blue"],
            f"/img/{key}{i}.jpg",
            image_hash=f"{key}{i}",
            expected="red",
            split="vstar/direct_attributes",
        )
        for i in range(len(answers))
    ]
    with sessions.begin() as session:
        batch, _ = submission.get_or_create_batch(session, key=key, name=key, source="s", config={})
        submission.submit_items(session, batch, items, "cfg")
        tickets = claims.claim(session, Stage.FAST, 100, batch.id)
        by_id = {t.image_hash: t.job_id for t in tickets}
        outcomes = [
            Accepted(by_id[f"{key}{i}"], answer, 0.99, [7.0], None)
            for i, answer in enumerate(answers)
        ]
        claims.record_fast(session, outcomes, GateSettings())
        return batch.id


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_judge_decides_what_the_rules_cannot_and_is_asked_once(sessions, stand_in):
    batch_id = answered_batch(sessions, "b1", ["red", "blue", "A"])  # A: the rules decide
    judge = Judge(stand_in.url, "judge-72b", retries=3)

    counts = judge_batch(sessions, batch_id, judge)

    assert (counts.asked, counts.cached) == (2, 0)
    assert len(stand_in.requests) == 3  # one 503, retried
    for body in stand_in.requests:  # sent concurrently: in any order
        assert body["path"] == "/v1/chat/completions" and body["model"] == "judge-72b"
        assert body["temperature"] == 0.0
        assert body["messages"][0] == {"role": "system", "content": "You are a helpful assistant."}
    prompts = {body["messages"][1]["content"] for body in stand_in.requests}
    assert judge_prompt("vstar", QUESTION, "A. red", "blue") in prompts
    with sessions() as session:
        (score,) = analytics.split_scores(session, batch_id)
    assert (score.rows, score.reference_correct, score.undecided) == (3, 2, 0)

    assert judge_batch(sessions, batch_id, judge).asked == 0  # every row has its verdict
    again = answered_batch(sessions, "b2", ["red", "blue"])  # same prompts: from the cache
    assert judge_batch(sessions, again, judge) == type(counts)(asked=0, cached=2)
    assert len(stand_in.requests) == 3
    judge.close()


def test_the_reply_is_read_as_the_reference_reads_it():
    assert read_verdict("vstar", "Judgement: 1") and not read_verdict("vstar", "Judgement: 0")
    assert read_verdict("pope", "1") and not read_verdict("pope", "1.")  # exactly "1"
    assert read_verdict("hr", "The answer is 1.")  # judge_hr.py: a 1 anywhere
    assert not read_verdict("vstar", "consistent")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_annotate_asks_the_judge_named_by_its_flags(sessions, stand_in, capsys):
    from cli.annotate import _judge
    from common.config import Settings

    batch_id = answered_batch(sessions, "b3", ["red", "blue"])
    settings = Settings(judge_url=stand_in.url, judge_model="judge-72b", judge_api_key="k")
    _judge(sessions, batch_id, settings)
    assert "2 asked, 0 from the cache (judge-72b)" in capsys.readouterr().out
    with sessions() as session:
        (score,) = analytics.split_scores(session, batch_id)
    assert (score.reference_correct, score.undecided) == (1, 0)
