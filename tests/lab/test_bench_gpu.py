"""``lab/bench/gpu.sh``, the one script a lent GPU machine runs, taken down its whole path
on the CPU with the tiny preset, so that it cannot rot where no GPU is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    wheels = tmp_path / "no-wheels"  # not the checkout's .whl/: those are for the GPU image
    wheels.mkdir(exist_ok=True)
    settings = {"PYTHON": sys.executable, "WHEELS": str(wheels), "OUT": str(tmp_path)}
    return subprocess.run(
        ["bash", "lab/bench/gpu.sh"],
        cwd=ROOT,
        env=os.environ | settings | env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_script_builds_a_random_checkpoint_and_benches_the_agent_at_each_n(tmp_path):
    done = _run(
        tmp_path,
        PRESET="test",
        DEVICE="cpu",
        DTYPE="float32",
        CONCURRENCY="1,2",
        TRAJECTORIES="2",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("device: CPU; torch ")
    assert "wrote test (random weights, built at load)" in done.stdout
    figures = (tmp_path / "bench-gpu.txt").read_text()
    assert re.search(r"N = 1 +[\d.]+ trajectories/s", figures)
    assert re.search(r"N = 2 +[\d.]+ trajectories/s +x ?[\d.]+ +mean batch", figures)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_a_cuda_device_it_says_so_before_building_anything(tmp_path):
    done = _run(tmp_path)
    assert done.returncode != 0
    assert "no CUDA device visible to torch" in done.stderr
    assert "wrote" not in done.stdout
    assert not (tmp_path / "bench-gpu.txt").exists()


def test_its_commands_need_only_what_a_gpu_image_is_given():
    """A GPU image has torch, and `make gpu-wheels` adds transformers and pydantic: the
    script's two commands load no queue, no web stack and no database driver."""
    probe = (
        "import sys\n"
        "from cli.main import build_parser\n"
        "for argv in (['models', 'build-random'], ['bench', 'agent']):\n"
        "    build_parser(argv)\n"
        "    import cli.models, cli.bench.agent, cli.options\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:])))"
    )
    outside = ["celery", "kombu", "redis", "fastapi", "uvicorn", "sqlalchemy", "alembic"]
    run = subprocess.run(
        [sys.executable, "-c", probe, *outside], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
