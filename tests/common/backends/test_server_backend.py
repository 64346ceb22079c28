"""The OpenAI-compatible backend against a stand-in server serving the tiny checkpoints:
the same gate confidences, screens and trajectories as the in-process backend."""

from __future__ import annotations

import json
import logging

import pytest
from PIL import Image, ImageDraw

from common.agents.deepeyes import run_deepeyes
from common.backends.inference_client import Backoff
from common.backends.server_backend import Endpoint, ServerModel
from common.backends.transformers_backend import TransformersModel
from common.chat import Conversation, Message
from common.config import AgentSettings, GateSettings
from common.contracts import Query
from common.errors import BackendUnavailable, ConfigurationError
from common.pipeline.gate import score_answers
from common.protocols import REFERENCE, THYME
from tests.helpers.images import write_images
from tests.helpers.models import ForceText
from tests.helpers.sandbox import bubblewrap_or_skip
from tests.helpers.standin_server import StandIn


def queries() -> list[Query]:
    made = []
    for index, (size, colour) in enumerate([((640, 480), "red"), ((300, 420), "blue")]):
        image = Image.new("RGB", size, (20, 40, 60))
        ImageDraw.Draw(image).ellipse((40, 40, 200, 160), fill=colour)
        options = ("red", "blue") if index == 0 else None
        made.append(Query(f"q{index}", image, "What colour is the circle?", options))
    return made


@pytest.fixture(scope="module")
def models(tiny_paths):
    return {
        role: TransformersModel(str(tiny_paths[role]), device="cpu", dtype="float32")
        for role in ("large", "small")
    }


@pytest.fixture(scope="module")
def server(models):
    with StandIn(models) as running:
        yield running


def remote(server: StandIn, role: str, protocol=REFERENCE, **endpoint) -> ServerModel:
    return ServerModel(Endpoint(server.url, role, **endpoint), protocol=protocol)


def test_gate_confidences_from_log_probabilities_equal_the_in_process_ones(models, server):
    gate = GateSettings(mode="min", top_k=64, threshold=0.5)
    local = models["small"].speculate(queries(), max_new_tokens=8, top_k=64)
    served = remote(server, "small").speculate(queries(), max_new_tokens=8, top_k=64)
    assert [s.answer for s in served] == [s.answer for s in local]
    for mode in ("min", "mean", "bottom20", "logprob"):
        gate = GateSettings(mode=mode, top_k=64, threshold=0.5)
        near = score_answers([s.scores for s in local], gate)
        far = score_answers([s.scores for s in served], gate)
        for a, b in zip(near, far, strict=True):
            assert abs(a.confidence - b.confidence) < 1e-5, (mode, a, b)


def test_a_micro_batch_goes_out_as_concurrent_requests_and_screens_the_same(models, server):
    before = len(server.requests)
    served = remote(server, "large").screen(queries(), max_new_tokens=6)
    assert len(server.requests) - before == 2
    assert served == models["large"].screen(queries(), max_new_tokens=6)
    body = server.requests[-1]["body"]
    assert body["temperature"] == 0.0 and body["stop"][-1] == "<|im_end|>"
    assert body["messages"][1]["content"][0]["image_url"]["url"].startswith("data:image/png")


def _forced_run(model, texts, run):
    model.logits_processors = [ForceText(model.tokenizer, texts, model.eos_ids[0])]
    try:
        return run()
    finally:
        model.logits_processors = []


def _steps(trajectory) -> list[tuple]:
    return [(s.text, s.finish_reason, s.box_original, s.code_output) for s in trajectory.steps]


def test_deepeyes_trajectories_match_step_for_step(models, server):
    large = models["large"]
    zoom = '<think>look</think> <tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [10, 10, 200, 150]}}</tool_call>'  # noqa: E501
    texts = ["<think>hmm</think>", zoom, "<answer>B</answer>"]
    query = queries()[0]
    limits = AgentSettings(max_steps=4, max_new_tokens=64)
    local = _forced_run(large, texts, lambda: run_deepeyes(query, large, limits))
    served = _forced_run(large, texts, lambda: run_deepeyes(query, remote(server, "large"), limits))
    assert local.answer == served.answer == "B"
    assert _steps(served) == _steps(local) and len(local.steps) == 3


def test_a_turn_past_the_end_of_turn_matches_the_in_process_one(models, server):
    """SpecReason's DeepEyes score call (``ignore_eos``): all its tokens, special ones
    left out of the text, served as in process."""
    large = models["large"]
    conversation = Conversation(messages=[Message("user", ["Score it."])], key="q0")
    said = [
        _forced_run(
            large,
            ["<|im_end|>\n8"],
            lambda model=model: model.generate(
                conversation, stop=(), max_new_tokens=10, ignore_eos=True
            ),
        )
        for model in (large, remote(server, "large"))
    ]
    assert said[0].text == said[1].text and said[0].text.startswith("\n8")
    assert said[0].new_tokens == said[1].new_tokens == 10


def test_unforced_random_trajectories_match_too(models, server):
    query, limits = queries()[1], AgentSettings(max_steps=3, max_new_tokens=12)
    local = run_deepeyes(query, models["large"], limits)
    served = run_deepeyes(query, remote(server, "large"), limits)
    assert _steps(served) == _steps(local)


@pytest.mark.sandbox
def test_thyme_trajectories_match_step_for_step(models, server, tiny_paths):
    from common.agents.thyme import run_thyme

    bubblewrap_or_skip()
    large = TransformersModel(
        str(tiny_paths["large"]), device="cpu", dtype="float32", protocol=THYME
    )
    code = (
        "<think>crop</think><code>\n```python\nfrom PIL import Image\n"
        "image = Image.open(image_path)\nx1, y1, x2, y2 = 10, 10, 300, 200\n"
        'processed_path = "/mnt/data/temp_processed_images/crop.png"\n'
        "image.crop((x1, y1, x2, y2)).save(processed_path)\nprint(processed_path)\n```\n</code>"
    )
    count = "<code>\n```python\nprint(41 + 1)\n```\n</code>"
    texts = [code, count, "<answer>B</answer>"]
    query, limits = queries()[0], AgentSettings(max_steps=5, max_new_tokens=200)
    with StandIn({"large": large}) as thyme_server:
        local = _forced_run(large, texts, lambda: run_thyme(query, large, limits))
        served = _forced_run(
            large, texts, lambda: run_thyme(query, remote(thyme_server, "large", THYME), limits)
        )
        continued = thyme_server.requests[1]["body"]
    assert local.answer == served.answer == "B"
    assert _steps(served) == _steps(local) and served.steps[1].code_output == "42"
    assert continued["continue_final_message"] is True  # the same assistant turn, continued
    assert continued["messages"][-1]["content"][-1]["text"] == "</sandbox_output>"


def test_a_server_that_caps_top_logprobs_is_one_clear_error(models):
    with (
        StandIn(models, max_logprobs=20) as capped,
        pytest.raises(ConfigurationError, match="--max-logprobs 64"),
    ):
        remote(capped, "small").speculate(queries()[:1], max_new_tokens=4, top_k=64)


def test_overload_is_retried_with_backoff_then_reported_as_retryable(models):
    with StandIn(models, failures=2) as flaky:
        model = remote(flaky, "large", retries=3, backoff=Backoff(first_s=0.01, max_s=0.05))
        assert len(model.screen(queries()[:1], max_new_tokens=4)) == 1
        assert len(flaky.requests) == 3
    with StandIn(models, failures=100) as down, pytest.raises(BackendUnavailable, match="HTTP 503"):
        quick = Backoff(first_s=0.01, max_s=0.05)
        remote(down, "large", retries=1, backoff=quick).screen(queries()[:1], max_new_tokens=4)


def test_the_key_is_sent_and_never_shown(models, caplog):
    caplog.set_level(logging.DEBUG)
    with StandIn(models, key="sekrit-123") as guarded:
        model = remote(guarded, "large", api_key="sekrit-123")
        model.screen(queries()[:1], max_new_tokens=4)
        assert guarded.requests[-1]["auth"] == "Bearer sekrit-123"
        assert "sekrit" not in repr(model.endpoint) and "sekrit" not in caplog.text
        with pytest.raises(ConfigurationError, match="refused the key"):
            remote(guarded, "large", api_key="wrong").screen(queries()[:1], max_new_tokens=4)


def test_render_shows_the_request_it_sends(server):
    chat = REFERENCE.screen_query(queries()[0])
    shown = json.loads(remote(server, "large").render(chat))
    assert shown[1]["content"][0]["image_url"]["url"].startswith("<image ")


def test_annotate_runs_on_served_models(server, tmp_path, monkeypatch):
    from cli.main import main

    monkeypatch.setenv("SPECEYES_LARGE_SERVER_URL", server.url)
    monkeypatch.setenv("SPECEYES_AGENT_MAX_NEW_TOKENS", "8")
    write_images(tmp_path / "c", 3, size=(96, 80))
    out = tmp_path / "out.jsonl"
    code = main(
        [
            "annotate",
            str(tmp_path / "c"),
            "-q",
            "Q?",
            "--backend",
            "openai",
            "--large",
            "large",
            "--small",
            "small",
            "--max-steps",
            "2",
            "--no-progress",
            "--screener",
            "none",
            "--db",
            f"sqlite:///{tmp_path / 's.db'}",
            "--out",
            str(out),
        ]
    )
    assert code in (0, 1)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(row["status"] in ("done", "failed") for row in rows)
    assert all(row["error_code"] in (None, "step_limit", "tool_call_invalid") for row in rows)
    assert {r["body"]["model"] for r in server.requests} >= {"large", "small"}


def test_micro_batches_reuse_the_endpoints_connections(models):
    """One long-lived client per endpoint: the connections of one micro-batch carry the
    next ones (before: a new client, and new connections, for every batch and step)."""
    with StandIn(models) as running:
        model = remote(running, "large", concurrency=2)
        for _ in range(3):
            model.screen(queries()[:2], max_new_tokens=2)
        ports = {request["port"] for request in running.requests}
    assert len(running.requests) == 6 and len(ports) <= 2


def test_speculation_in_depth_on_a_server_matches_the_in_process_one(models, server):
    from common.pipeline.depth import speculate_in_depth

    small = models["small"]
    call = {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [20, 20, 220, 180]}}
    texts = [f"<think>z</think><tool_call>{json.dumps(call)}</tool_call>", "<answer>red</answer>"]
    gate = GateSettings(mode="min", top_k=16, threshold=0.5)

    def run(model):
        # one job: a forced text goes to each generate call, and a server's are per job
        found = speculate_in_depth(queries()[:1], model, depth=2, max_new_tokens=48, top_k=16)
        steps = [[(s.text, s.box_original) for s in zoomed.steps] for zoomed in found]
        scores = [zoomed.speculation.scores for zoomed in found]  # type: ignore[union-attr]
        return steps, [verdict.confidence for verdict in score_answers(scores, gate)]

    local_steps, local_confidence = _forced_run(small, texts, lambda: run(small))
    served_steps, served_confidence = _forced_run(
        small, texts, lambda: run(remote(server, "small"))
    )
    assert served_steps == local_steps and len(local_steps[0]) == 2
    assert served_confidence == pytest.approx(local_confidence, abs=1e-5)
