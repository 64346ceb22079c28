"""``common`` is the service's domain: it imports no queue, no web framework, no lab code."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import common

FORBIDDEN = (
    "celery",
    "celery_batches",
    "kombu",
    "redis",
    "fastapi",
    "starlette",
    "uvicorn",
    "lab",
    "api",
    "workers",
    "cli",
)


def test_no_common_module_imports_the_queue_the_web_or_the_lab():
    names = sorted(
        module.name
        for module in pkgutil.walk_packages(common.__path__, prefix="common.")
        if not module.name.startswith("common.models.weights")
    )
    assert "common.store.claims" in names and "common.pipeline.work" in names  # the walk found them
    probe = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r})))"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        check=True,
    )
    assert run.stdout.strip() == "[]", run.stdout
