# One image for every SpecEyes process: workers, the one-shot migration, later the API.
# The default torch wheel from PyPI is the CUDA build; on a CPU-only host pass
#   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu
FROM python:3.11-slim

ARG TORCH_INDEX=https://pypi.org/simple
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HF_HOME=/models/hf SPECEYES_CACHE_DIR=/models/speceyes

WORKDIR /app
RUN pip install --index-url "$TORCH_INDEX" "torch>=2.4"
COPY pyproject.toml README.md ./
COPY common ./common
COPY api ./api
COPY workers ./workers
COPY cli ./cli
COPY migrations ./migrations
COPY alembic.ini ./
RUN pip install .

RUN useradd --create-home speceyes && mkdir -p /models && chown speceyes /models
USER speceyes
ENTRYPOINT ["speceyes"]
CMD ["--help"]
