"""A scratch store for a benchmark: a PostgreSQL database beside the one it is pointed
at, or a SQLite file."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from common.errors import ConfigurationError


@contextmanager
def scratch_database(url: str) -> Iterator[str]:
    """A new database on the PostgreSQL server of ``url``, dropped afterwards."""
    parsed = make_url(url)
    if not parsed.drivername.startswith("postgresql"):
        raise ConfigurationError(
            "bench pipeline needs PostgreSQL: --db postgresql+psycopg://USER@HOST:5432/DB "
            "(a scratch database is created beside DB and dropped afterwards)"
        )
    name = f"speceyes_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        admin.dispose()
        raise ConfigurationError(f"cannot create a scratch database: {exc}") from None
    try:
        yield parsed.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def scratch_store(database_url: str | None) -> Iterator[str]:
    """A scratch store's URL: PostgreSQL beside ``database_url`` (when it is PostgreSQL),
    else a SQLite file; removed afterwards."""
    if database_url and database_url.startswith("postgresql"):
        with scratch_database(database_url) as url:
            yield url
        return
    with tempfile.TemporaryDirectory(prefix="speceyes-bench-") as folder:
        yield f"sqlite:///{folder}/store.db"
