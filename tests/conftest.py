"""Fixtures shared by the whole suite.

The tiny checkpoints are built once per test session into a temporary cache (seconds),
so no test depends on what a developer's ~/.cache holds.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image


@pytest.fixture(scope="session")
def tiny_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from common.models.tiny import ensure_tiny

    cache_dir = tmp_path_factory.mktemp("speceyes-cache")
    ensure_tiny(cache_dir)
    return cache_dir


@pytest.fixture(scope="session")
def tiny_paths(tiny_cache_dir: Path) -> dict[str, Path]:
    from common.models.tiny import tiny_paths

    return tiny_paths(tiny_cache_dir)


@pytest.fixture(scope="session")
def tiny_large(tiny_paths: dict[str, Path]):
    from common.backends.transformers_backend import TransformersModel

    return TransformersModel(str(tiny_paths["large"]), device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def tiny_small(tiny_paths: dict[str, Path]):
    from common.backends.transformers_backend import TransformersModel

    return TransformersModel(str(tiny_paths["small"]), device="cpu", dtype="float32")


def solid_image(
    width: int, height: int, colour: tuple[int, int, int] = (200, 30, 30)
) -> Image.Image:
    return Image.new("RGB", (width, height), colour)


# -- databases ---------------------------------------------------------------------------
# Every test that needs a store gets a fresh one: a SQLite file in its tmp folder, or a
# PostgreSQL database of its own on the server the machine runs (created, then dropped).
POSTGRES_ADMIN_URL = os.environ.get(
    "SPECEYES_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(scope="session")
def postgres_admin():
    from sqlalchemy import create_engine, text

    engine = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text("select 1"))
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0]
        pytest.exit(
            f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL} ({reason}). Start it "
            "(e.g. `pg_ctlcluster 15 main start`) or set SPECEYES_TEST_POSTGRES_URL.",
            returncode=3,
        )
    yield engine
    engine.dispose()


@pytest.fixture
def postgres_url(postgres_admin) -> Iterator[str]:
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    name = f"speceyes_test_{uuid.uuid4().hex[:12]}"
    with postgres_admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    with postgres_admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def sessions(database_url: str):
    from common.store.db import open_store

    factory = open_store(database_url)
    yield factory
    factory.close()


def write_images(folder: Path, count: int, size: tuple[int, int] = (64, 48)) -> list[Path]:
    """``count`` distinct small PNGs (distinct bytes: distinct jobs)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        path = folder / f"img{index:03d}.png"
        Image.new("RGB", size, (index * 7 % 256, index * 13 % 256, 90)).save(path)
        paths.append(path)
    return paths


# -- the broker ------------------------------------------------------------------------
# Tests of the distributed pipeline use the Redis the machine runs. Each test gets a key
# prefix and queue names of its own, and its keys are deleted afterwards.
REDIS_URL = os.environ.get("SPECEYES_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def redis_client():
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0]
        pytest.exit(
            f"Redis is not reachable at {REDIS_URL} ({reason}). Start it "
            "(e.g. `redis-server --daemonize yes`) or set SPECEYES_TEST_REDIS_URL.",
            returncode=3,
        )
    yield client
    client.close()


@pytest.fixture
def broker_env(redis_client, postgres_url: str) -> Iterator[dict[str, str]]:
    """SPECEYES_* settings of an isolated distributed deployment (Redis + PostgreSQL)."""
    tag = uuid.uuid4().hex[:10]
    prefix = f"speceyes-test-{tag}:"
    yield {
        "SPECEYES_BROKER_URL": REDIS_URL,
        "SPECEYES_BROKER_KEY_PREFIX": prefix,
        "SPECEYES_FAST_QUEUE": f"fast-{tag}",
        "SPECEYES_SLOW_QUEUE": f"slow-{tag}",
        "SPECEYES_DATABASE_URL": postgres_url,
        "SPECEYES_BACKEND": "scripted",
    }
    keys = list(redis_client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        redis_client.delete(*keys)
