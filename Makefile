# The project's command surface. `make help` lists the targets.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help setup sandbox demo test lint format bench bench-gpu clean

help:
	@echo "make demo    set up and annotate the sample corpus with the shipped synth models"
	@echo "make test    set up and run the test suite"
	@echo "make lint    ruff + mypy"
	@echo "make bench   fast stage against batch size, the embedded funnel, the synth report (CPU)"
	@echo "             (speceyes bench pipeline: the distributed pipeline, needs Redis + PostgreSQL)"
	@echo "make bench-gpu  trajectories/s at N = 1, 4, 16 at full size (7B, random weights; CUDA torch)"

# torch first and pinned: 2.13.0 is the CPU build this machine has on disk; any other
# torch spec downloads a multi-GB CUDA build.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP) sandbox

# Thyme's code sandbox is bubblewrap (Debian's package), installed here where we can
# (root, or passwordless sudo); without it Thyme refuses to start, DeepEyes runs as ever.
sandbox:
	@command -v bwrap >/dev/null || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
		$$SUDO apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
		{ $$SUDO apt-get update -qq >/dev/null 2>&1 && \
		  $$SUDO apt-get install -y -qq bubblewrap >/dev/null 2>&1; } || \
		echo "warning: could not install bubblewrap; --agent thyme will refuse to start"; }

demo: setup
	$(VENV)/bin/speceyes annotate samples/manifest.jsonl --small synth --large synth \
		--threshold 0.9 --db sqlite:///demo.db --out demo-results.jsonl

test: setup
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: setup
	$(VENV)/bin/speceyes bench fast --batch-sizes 1,4,16,32 --jobs 64
	$(VENV)/bin/speceyes bench embedded --jobs 200
	$(VENV)/bin/speceyes bench synth --json synth-report.json

# On a machine with a CUDA GPU: many trajectories per agent worker at full size
# (Qwen2.5-VL-7B's architecture, random weights built on the GPU: no hub, nothing stored).
bench-gpu: setup
	$(VENV)/bin/speceyes models build-random --preset qwen2.5-vl-7b --out /tmp/speceyes-qwen7b
	$(VENV)/bin/speceyes bench agent --large /tmp/speceyes-qwen7b --device cuda \
		--dtype bfloat16 --concurrency 1,4,16 --trajectories 32

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
