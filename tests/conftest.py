"""Fixtures shared by the whole suite, and each test's kind.

The tiny checkpoints are built once per test session (per xdist worker) into a temporary
cache (seconds), so no test depends on what a developer's ~/.cache holds.

Every test is of one kind, a marker (``pytest -m unit``, ``make test-fast``):

- ``unit``: in this process, no service: SQLite, the scripted backend, the tiny models;
- ``integration``: real services or processes: PostgreSQL, Redis, workers, servers,
  the code sandbox;
- ``faults``: stops what the pipeline depends on (workers, Redis, PostgreSQL) and
  measures recovery;
- ``browser``: drives a real browser.

A test marked ``faults`` or ``browser`` is that; otherwise the fixtures it uses decide
(the browser, or a page in it: browser; a PostgreSQL database, Redis, a sandbox:
integration), and a test that starts processes of its own says so with ``integration``.

Tests that start code sandboxes (``sandbox``: the folder ``tests/common/sandbox`` and
every Thyme run) check that nothing is left on the whole machine (no process of the
sandbox's uid), so they run one at a time and alone: ``make test`` runs the rest in
parallel (pytest-xdist), then these; pytest refuses to run them in parallel workers.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.services import POSTGRES_ADMIN_URL, REDIS_URL

KINDS = ("unit", "integration", "faults", "browser")
SERVICE_FIXTURES = {"postgres_url", "postgres_admin", "redis_client", "broker_env", "sandbox"}
SANDBOX_FOLDER = Path(__file__).parent / "common" / "sandbox"


# A suite started in the background by a script (``make test &``) inherits SIGINT ignored,
# and so would every process its tests start: a Ctrl-C test's `speceyes annotate` would
# then run on, Python's KeyboardInterrupt never installed. A handler, unlike an ignored
# signal, is not inherited: each child starts with Ctrl-C as a terminal gives it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ONE_AT_A_TIME = pytest.mark.skip(
    reason="starts code sandboxes: never in parallel workers (make test runs these after "
    "the rest; alone: pytest -m sandbox, without -n)"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    parallel = os.environ.get("PYTEST_XDIST_WORKER") is not None
    for item in items:
        if item.path.is_relative_to(SANDBOX_FOLDER):
            item.add_marker(pytest.mark.sandbox)
        if parallel and item.get_closest_marker("sandbox"):
            item.add_marker(ONE_AT_A_TIME)
        if not any(item.get_closest_marker(kind) for kind in KINDS):
            item.add_marker(_kind_from_fixtures(item))


def _kind_from_fixtures(item: pytest.Item) -> pytest.MarkDecorator:
    fixtures = set(getattr(item, "fixturenames", ()))
    if "browser" in fixtures:  # page takes it: a test that takes a page is here too
        return pytest.mark.browser
    callspec = getattr(item, "callspec", None)
    on_postgres = callspec is not None and callspec.params.get("database_url") == "postgresql"
    if fixtures & SERVICE_FIXTURES or on_postgres or item.get_closest_marker("sandbox"):
        return pytest.mark.integration
    return pytest.mark.unit


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


# -- databases ---------------------------------------------------------------------------
# Every test that needs a store gets a fresh one: a SQLite file in its tmp folder, or a
# PostgreSQL database of its own on the server the machine runs (created, then dropped).


def _reachable_or_exit(answers: Callable[[], object], what: str, start: str, name: str) -> None:
    """Stop the whole run with one clear line when a server the tests use does not
    answer (every test of it would fail the same way)."""
    try:
        answers()
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0]
        pytest.exit(
            f"{what} is not reachable ({reason}). Start it (e.g. `{start}`) or set "
            f"SPECEYES_TEST_{name}_URL.",
            returncode=3,
        )


@pytest.fixture(scope="session")
def postgres_admin():
    from sqlalchemy import create_engine, text

    engine = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")

    def answers() -> None:
        with engine.connect() as connection:
            connection.execute(text("select 1"))

    _reachable_or_exit(
        answers, f"PostgreSQL at {POSTGRES_ADMIN_URL}", "pg_ctlcluster 15 main start", "POSTGRES"
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


# -- the broker ------------------------------------------------------------------------
# Tests of the distributed pipeline use the Redis the machine runs. Each test gets a key
# prefix and queue names of its own, and its keys are deleted afterwards.


@pytest.fixture(scope="session")
def redis_client():
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    _reachable_or_exit(
        client.ping, f"Redis at {REDIS_URL}", "redis-server --daemonize yes", "REDIS"
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


# -- the browser -----------------------------------------------------------------------
# Tests marked browser drive Debian's Chromium through Playwright (tests/helpers/browser):
# one browser per test module (a launch is a fraction of a second), a context and page of
# their own per test. They skip without chromium, saying how to install it (CI fails).


@pytest.fixture(scope="module")
def browser():
    from tests.helpers.browser import launched_chromium

    with launched_chromium() as browser:
        yield browser


@pytest.fixture
def page_errors() -> list[str]:
    """What the ``page`` fixture's page reported as errors, in order: console errors (a
    CSP violation, a failed load, console.error) and uncaught exceptions."""
    return []


@pytest.fixture
def page(browser, page_errors: list[str]):
    from tests.helpers.browser import watched_page

    with watched_page(browser, page_errors) as page:
        yield page
