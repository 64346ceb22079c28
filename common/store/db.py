"""Engines, sessions and migrations for the job store (SQLite or PostgreSQL).

``open_store(url)`` migrates the database to the newest schema and returns a session
factory. SQLite gets WAL journaling and a busy timeout so the embedded runner's threads
can write side by side; PostgreSQL gets pre-ping so a restarted server is survived.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from common.errors import ConfigurationError

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def make_engine(url: str) -> Engine:
    """An engine for ``url``; ``sqlite:///file.db`` or ``postgresql+psycopg://...``."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to ``revision`` with Alembic (the migrations ARE the schema)."""
    _alembic(engine, "upgrade", revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    _alembic(engine, "downgrade", revision)


def _alembic(engine: Engine, action: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        getattr(command, action)(config, revision)


def open_store(url: str, *, create: bool = True) -> sessionmaker[Session]:
    """Migrate the database at ``url`` and return its session factory.

    ``create=False`` (commands that only read): a SQLite file that does not exist is a
    ``ConfigurationError``; no file or folder is made.
    """
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        file = Path(url.removeprefix("sqlite:///")).expanduser()
        if not create and not file.is_file():
            raise ConfigurationError(
                f"no job store at {file}: nothing has been written there (annotate, serve "
                "or a worker creates it); check --db / SPECEYES_DATABASE_URL"
            )
        file.parent.mkdir(parents=True, exist_ok=True)
    engine = make_engine(url)
    try:
        migrate(engine)
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise ConfigurationError(f"cannot open the job store at {_safe(url)}: {reason}") from None
    return sessionmaker(engine, expire_on_commit=False)


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"
