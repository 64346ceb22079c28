# One image for every SpecEyes process: the API (`serve`), the fast and slow workers, the
# one-shot migration (`db upgrade`) and the lab's commands (`bench`, `synth`,
# `train-synth`). Versions are the lock's (constraints.txt, `make lock`).
# The default torch wheel from PyPI is the CUDA build; on a CPU-only host pass
#   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu
#
# Users: the image runs as the unprivileged user `speceyes`, and so do the API, the fast
# workers and DeepEyes' slow workers. A slow worker whose agent is Thyme must run as
# root, allowed to make namespaces, mounts and control groups (docker-compose.yml's
# worker-thyme: `user: root`, `privileged: true`): it builds a bubblewrap (or gVisor)
# sandbox for each trajectory, and the model's code runs in it as an unprivileged uid
# (65533) with no capabilities, never as root (docs/sandbox.md). Run as `speceyes`, a
# Thyme worker refuses to start, with one line saying why.
#
# bookworm: the Debian release the sandbox is tested on, whose bubblewrap (0.8) and runsc
# (gVisor, SPECEYES_SANDBOX_ISOLATION=gvisor) these are; setpriv (util-linux) drops the
# guest's root.
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap runsc util-linux \
    && rm -rf /var/lib/apt/lists/*

ARG TORCH_INDEX=https://pypi.org/simple
# the lock's torch (tests/test_packaging.py holds them equal), in a layer of its own that
# a new lock does not rebuild; ==2.13.0 takes the CPU index's 2.13.0+cpu too
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HF_HOME=/models/hf SPECEYES_CACHE_DIR=/models/speceyes

WORKDIR /app
# torch alone from its index; what it needs comes from PyPI with the rest, below
RUN pip install --no-deps --index-url "$TORCH_INDEX" "torch==$TORCH_VERSION"
COPY constraints.txt pyproject.toml README.md ./
COPY client ./client
COPY common ./common
COPY api ./api
COPY workers ./workers
COPY cli ./cli
COPY lab ./lab
COPY migrations ./migrations
COPY alembic.ini ./
RUN pip install -c constraints.txt .

RUN useradd --create-home speceyes \
    && mkdir -p /models /uploads && chown speceyes /models /uploads
USER speceyes
ENTRYPOINT ["speceyes"]
CMD ["--help"]
