"""The command line, run in-process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from cli.bench import COMMANDS as BENCH_KINDS
from cli.main import COMMANDS, main
from common.config import without_password
from tests.helpers.serving import SPECEYES

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "images"
SAMPLE, OTHER_SAMPLE = sorted(SAMPLES.glob("*.png"))[:2]


@pytest.fixture
def tiny_env(monkeypatch: pytest.MonkeyPatch, tiny_cache_dir: Path) -> Path:
    monkeypatch.setenv("SPECEYES_CACHE_DIR", str(tiny_cache_dir))
    return tiny_cache_dir


def test_help_teaches_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_code:
        main(["--help"])
    assert exit_code.value.code == 0
    out = capsys.readouterr().out
    for command in ("ask", "bench", "models", "config", "examples:"):
        assert command in out


def test_ask_on_the_scripted_backend_answers_with_the_small_model(capsys):
    code = main(
        [
            "ask",
            str(SAMPLE),
            "-q",
            "What colour?",
            "--backend",
            "scripted",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["status"] == "done" and report["answered_by"] == "small"


def test_ask_on_the_tiny_models_runs_every_phase(capsys, tiny_env):
    code = main(
        [
            "ask",
            str(OTHER_SAMPLE),
            "-q",
            "What colour is the square?",
            "--options",
            "red",
            "blue",
            "--small",
            "tiny",
            "--large",
            "tiny",
            "--max-steps",
            "2",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert report["status"] in {"done", "failed"}  # random weights: either is fine
    assert code == (0 if report["status"] == "done" else 1)
    if report["answered_by"] == "large":
        assert 1 <= len(report["steps"]) <= 2


def test_ask_on_a_corrupt_image_fails_with_the_reason(capsys, tmp_path: Path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff garbage")
    code = main(["ask", str(bad), "-q", "Q?", "--backend", "scripted", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["error_code"] == "image_error"


def test_bad_settings_are_one_line_and_exit_2(capsys):
    image = SAMPLE
    code = main(["ask", str(image), "-q", "Q?", "--backend", "scripted", "--threshold", "3"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "funnel.gate.threshold (--threshold, SPECEYES_GATE_THRESHOLD)" in err


def test_models_build_tiny_writes_both_checkpoints(capsys, tmp_path: Path):
    assert main(["models", "build-tiny", "--out", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t" / "large" / "config.json").is_file()
    assert (tmp_path / "t" / "small" / "model.safetensors").is_file()
    assert main(["models", "build-tiny", "--out", str(tmp_path / "t")]) == 0
    assert "already built" in capsys.readouterr().out


def test_bench_fast_prints_a_row_per_depth_and_batch_size(capsys, tiny_env, monkeypatch):
    monkeypatch.setenv("SPECEYES_ZOOM_MAX_NEW_TOKENS", "16")  # (random weights ramble)
    args = ["--jobs", "4", "--batch-sizes", "1,4", "--image-size", "96x64", "--depths", "0,1"]
    assert main(["bench", "fast", *args]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = [line.split() for line in lines[2:]]
    assert [(row[0], row[1]) for row in rows] == [("0", "1"), ("0", "4"), ("1", "1"), ("1", "4")]
    assert all(float(row[-1]) > 0 for row in rows)
    assert all(row[-2] == "0" for row in rows[:2])  # (no zoom at depth 0)


def test_bench_embedded_prints_the_bound_and_the_overhead_free_replay_of_its_draws(capsys):
    # zero costs: the run is over in a moment, the figures are the pipeline's own
    args = [
        "bench",
        "embedded",
        "--jobs",
        "12",
        "--agent-workers",
        "2",
        "--agent-s",
        "0",
        "--fast-batch-s",
        "0",
        "--fast-job-s",
        "0",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("efficiency") >= 4  # the bound's and the replay's, funnel and baseline
    assert out.count("the same draws with no overhead at all") == 2
    assert "speedup" in out


def test_config_prints_every_setting(capsys, monkeypatch):
    monkeypatch.setenv("SPECEYES_GATE_TOP_K", "32")
    assert main(["config", "--json"]) == 0
    values = json.loads(capsys.readouterr().out)
    assert values["funnel"]["gate"]["top_k"] == 32 and "database_url" in values


def test_an_image_folder_is_not_an_image(capsys, tmp_path: Path):
    Image.new("RGB", (8, 8)).save(tmp_path / "x.png")
    assert main(["ask", str(tmp_path), "-q", "Q?", "--backend", "scripted"]) == 1
    assert "not a file" in capsys.readouterr().out


def test_the_help_lists_every_command_without_loading_one():
    """Each command's module loads only when it runs: `speceyes --help` imports none."""
    probe = (
        "import sys, contextlib, io\n"
        "from cli.main import COMMANDS, main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    main(['--help'])\n"
        "assert all(name in out.getvalue() for name in COMMANDS)\n"
        "print(sorted(m for m in sys.modules if m.startswith('cli.') and m != 'cli.main'))\n"
        "print('torch' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert run.stdout.split("\n")[:2] == ["[]", "False"]


@pytest.mark.parametrize(
    "command", [*sorted(COMMANDS), *(f"bench {kind}" for kind in sorted(BENCH_KINDS))]
)
def test_every_command_has_its_own_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([*command.split(), "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: speceyes {command}")


def test_config_into_a_pipe_closed_early_ends_quietly():
    """`speceyes config | head`: the reader leaves first; no BrokenPipeError traceback."""
    process = subprocess.Popen(
        [*SPECEYES, "config"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    process.stdout.close()  # before a byte is read: the first write meets a closed pipe
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 141
    assert stderr == b""


def test_flags_offer_their_settings_choices_and_refuse_others(capsys):
    with pytest.raises(SystemExit):
        main(["annotate", "--help"])
    usage = capsys.readouterr().out
    assert "--backend {transformers,scripted,openai}" in usage
    assert "--agent {deepeyes,thyme}" in usage and "SETTING__" not in usage
    with pytest.raises(SystemExit) as refused:
        main(["annotate", "x", "--backend", "nope"])
    assert refused.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["annotate", "x", "--max-steps", "many"])
    assert "invalid int value: 'many'" in capsys.readouterr().err


def test_config_and_help_name_every_kind_of_model_and_backend(capsys):
    assert main(["config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    small = next(line for line in lines if line.startswith("SPECEYES_SMALL_MODEL "))
    backend = next(line for line in lines if line.startswith("SPECEYES_BACKEND "))
    assert "'synth'" in small and "'tiny'" in small
    assert all(f"'{name}'" in backend for name in ("transformers", "openai", "scripted"))
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = " ".join(capsys.readouterr().out.split())
    assert "models build the tiny checkpoints or a random full-size one, train the synth" in listing


def test_ctrl_c_while_a_command_loads_is_one_line_and_130(capsys, monkeypatch):
    """The seconds a heavy command spends importing (torch) are inside the handling too."""
    import cli.main as cli_main

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main, "build_parser", interrupted)
    assert cli_main.main(["annotate", "x"]) == 130
    assert capsys.readouterr().err == "speceyes: interrupted\n"


def test_passwords_in_urls_are_starred_wherever_a_setting_is_shown(capsys, monkeypatch):
    monkeypatch.setenv("SPECEYES_DATABASE_URL", "postgresql://u:dbpassw0rd@db.example/speceyes")
    monkeypatch.setenv("SPECEYES_BROKER_URL", "redis://:brokerpw@127.0.0.1:6379/0")
    for flags in ([], ["--json"]):
        assert main(["config", *flags]) == 0
        shown = capsys.readouterr().out
        assert "dbpassw0rd" not in shown and "brokerpw" not in shown
        assert "postgresql://u:***@db.example/speceyes" in shown
        assert "redis://:***@127.0.0.1:6379/0" in shown
    assert without_password("postgresql://u@h/db?password=pw&sslmode=require") == (
        "postgresql://u@h/db?password=***&sslmode=require"
    )
    assert without_password("sqlite:///speceyes.db") == "sqlite:///speceyes.db"
    assert without_password("redis://x:pw@[::1") == "***"  # no URL, but it holds a secret


def test_serve_on_a_port_another_process_holds_is_one_line(capsys, tmp_path: Path):
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        flags = ["--backend", "scripted", "--db", f"sqlite:///{tmp_path / 's.db'}"]
        assert main(["serve", "--port", str(port), *flags]) == 2
    error = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port} (Address already in use)" in error
    assert not (tmp_path / "s.db").exists()  # refused before anything was made


def test_a_settings_help_keeps_its_ellipsis(capsys):
    with pytest.raises(SystemExit):
        main(["annotate", "--help"])
    assert "'cuda:0', ..." in " ".join(capsys.readouterr().out.split())


def test_ask_explains_only_what_was_sent(capsys, tmp_path: Path):
    """A query the screen sends to the agent was never speculated on: --explain shows its
    screen and agent steps, and no small model's prompt."""
    scripts = tmp_path / "scripts.json"
    scripts.write_text(
        json.dumps({"*": {"needs_tools": True, "agent_steps": ["<answer>B</answer>"]}})
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECEYES_SCRIPTED__SCRIPTS_FILE", str(scripts))
        code = main(
            ["ask", str(SAMPLE), "-q", "What colour?", "--backend", "scripted", "--explain"]
        )
    printed = capsys.readouterr().out
    assert code == 0 and "answered_by  large" in printed
    assert "--- sent (screen) ---" in printed and "--- sent (agent, step 1) ---" in printed
    assert "--- sent (speculate) ---" not in printed
