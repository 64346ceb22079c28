# The project's command surface. `make help` lists the targets.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help setup sandbox demo test lint format bench bench-gpu gpu-wheels clean

help:
	@echo "make demo    set up and annotate the sample corpus with the shipped synth models"
	@echo "make test    set up and run the test suite"
	@echo "make lint    ruff + mypy"
	@echo "make bench   fast stage against batch size, the embedded funnel, the synth report (CPU)"
	@echo "             (speceyes bench pipeline: the distributed pipeline, needs Redis + PostgreSQL)"
	@echo "make bench-gpu  trajectories/s at N = 1, 4, 16 at full size (7B, random weights; CUDA torch)"
	@echo "make gpu-wheels what a GPU image without network needs for bench-gpu, into .whl/"

# torch first and pinned: 2.13.0 is the CPU build this machine has on disk; any other
# torch spec downloads a multi-GB CUDA build.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP) sandbox

# Thyme's code sandbox is bubblewrap (Debian's package), with gVisor's runsc as an
# optional stronger isolation; installed here where we can (root, or passwordless sudo).
# Without bubblewrap Thyme refuses to start; DeepEyes runs as ever.
SANDBOX_PACKAGES := bwrap:bubblewrap runsc:runsc
sandbox:
	@SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
	for pair in $(SANDBOX_PACKAGES); do \
		command -v $${pair%%:*} >/dev/null && continue; \
		$$SUDO apt-get install -y -qq $${pair#*:} >/dev/null 2>&1 || \
		{ $$SUDO apt-get update -qq >/dev/null 2>&1 && \
		  $$SUDO apt-get install -y -qq $${pair#*:} >/dev/null 2>&1; } || \
		echo "warning: could not install $${pair#*:} (bubblewrap: --agent thyme will refuse to start; runsc: no gVisor isolation)"; \
	done

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

# On a machine with a CUDA GPU whose python3 has torch: many trajectories per agent
# worker at full size (Qwen2.5-VL-7B's architecture, random weights built on the GPU: no
# hub, nothing stored). Runs from the tree; a GPU image without network first gets what
# it lacks from .whl/, which `make gpu-wheels` fills where PyPI is reachable.
bench-gpu:
	bash lab/bench_gpu.sh

# The wheels a GPU image (Python $(GPU_PYTHON), torch present) lacks for bench-gpu, at
# the versions this venv runs: transformers (>= 5.20) and pydantic with their own needs.
GPU_PYTHON ?= 3.12
GPU_WHEELS := transformers pydantic pydantic-core pydantic-settings annotated-types \
	typing-inspection typing-extensions python-dotenv regex
gpu-wheels: setup
	rm -rf .whl
	$(PY) -c 'import sys, importlib.metadata as m; \
		print(*(f"{n}=={m.version(n)}" for n in sys.argv[1:]))' $(GPU_WHEELS) \
	| xargs $(PY) -m pip download --quiet --no-deps --only-binary=:all: -d .whl \
		--python-version $(GPU_PYTHON) --implementation cp --platform manylinux_2_28_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
	@du -sh .whl

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
