# The project's command surface. `make help` lists the targets.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help setup demo test lint format bench clean

help:
	@echo "make demo    set up, build the tiny models, run the funnel on the sample images"
	@echo "make test    set up and run the test suite"
	@echo "make lint    ruff + mypy"
	@echo "make bench   fast-stage throughput against batch size (tiny models, CPU)"

# torch first and pinned: 2.13.0 is the CPU build this machine has on disk; any other
# torch spec downloads a multi-GB CUDA build.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/speceyes models build-tiny
	$(VENV)/bin/speceyes ask samples/images/red_circle.png \
		--question "What is the colour of the circle?" --options red green blue yellow \
		--small tiny --large tiny --max-steps 2 \
		|| echo "(tiny random-weight models: an agent step-limit error is the expected end)"

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

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
