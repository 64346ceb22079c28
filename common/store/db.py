"""Engines, sessions and migrations for the job store (SQLite or PostgreSQL).

``open_store(url)`` returns a ``Store``: the session factory, owning its engine
(``store.engine``, ``store.close()``). It checks that the schema is the newest: a new,
empty database gets it (the first ``annotate`` on a new file just works), one at an
older revision is refused with the way forward (``speceyes db upgrade``, which
migrates), so that no worker or command changes a shared database's schema by opening
it. SQLite gets WAL journaling and a busy timeout so the embedded runner's threads can
write side by side; PostgreSQL gets pre-ping so a restarted server is survived.
"""

from __future__ import annotations

import logging
from functools import cached_property
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from common.errors import ConfigurationError

log = logging.getLogger(__name__)
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


def is_postgres(where: Session | Engine | Any) -> bool:
    """Whether ``where`` (a session, an engine or a connection) talks to PostgreSQL: the
    one question the store's bulk and locking paths ask of the database."""
    bind = where.get_bind() if isinstance(where, Session) else where
    return bool(bind.dialect.name == "postgresql")


def autocommit(sessions: sessionmaker[Session], *, durable: bool = True) -> sessionmaker[Session]:
    """Sessions on the same database whose every statement commits on its own.

    For a unit of work that is one statement (a claim, the record of a trajectory): on
    PostgreSQL it then costs one round trip instead of three (BEGIN, the statement,
    COMMIT). Several statements in such a session are separate transactions.

    ``durable=False`` (claims): the commit does not wait for the WAL to reach the disk
    (``synchronous_commit`` off, on connections of their own). A server crash may then
    forget the last fraction of a second of claims, which only puts those jobs back to
    wait (their messages, or the reconciler, bring them again); any durable commit after
    a claim flushes it too. Records stay durable. SQLite (in this process, no round
    trips) keeps ``sessions``.
    """
    engine = sessions.kw.get("bind")
    if not isinstance(engine, Engine) or not is_postgres(engine):
        return sessions
    if not durable and isinstance(sessions, Store):
        return sessionmaker(sessions.relaxed)
    return sessionmaker(engine.execution_options(isolation_level="AUTOCOMMIT"))


def _commit_without_waiting(connection: Any, _record: Any) -> None:
    """A new connection's commits stop waiting for the WAL flush (set in its session,
    beside whatever the URL's options set; a server that refuses leaves it durable)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET synchronous_commit = off")
        connection.commit()
    except Exception as exc:  # (a pooler that forbids session settings: durable claims)
        connection.rollback()
        log.info("claims commit durably here: %s", exc)


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
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        getattr(command, action)(config, revision)


class Store(sessionmaker[Session]):
    """The job store: sessions (``store()``, ``store.begin()``) on an engine it owns."""

    def __init__(self, engine: Engine, new_file: Path | None = None) -> None:
        super().__init__(engine, expire_on_commit=False)
        self.engine = engine
        self.new_file = new_file  # a SQLite file made by this opening

    @property
    def described(self) -> str:
        """Where the store is, for people: a SQLite file's absolute path, or the URL
        without its password."""
        url = self.engine.url
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            return f"{Path(url.database).resolve()} (SQLite)"
        return _safe(url.render_as_string(hide_password=False))

    def discard_if_unused(self) -> None:
        """Close, and remove a SQLite file this opening made and nothing was written to
        (a command refused before its first job must leave no empty store behind)."""
        self.close()
        file = self.new_file
        if file is None or not file.is_file():
            return
        probe = create_engine(f"sqlite:///{file}")
        try:
            with probe.connect() as connection:
                used = connection.exec_driver_sql(
                    "SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM batches) "
                    "+ (SELECT count(*) FROM api_keys)"
                ).scalar()
        except OperationalError:
            return  # (not ours to judge)
        finally:
            probe.dispose()
        if not used:
            for path in (
                file,
                file.with_name(file.name + "-wal"),
                file.with_name(file.name + "-shm"),
            ):
                path.unlink(missing_ok=True)

    @cached_property
    def relaxed(self) -> Engine:
        """Autocommit connections whose commits do not wait for the WAL flush (PostgreSQL:
        ``autocommit(durable=False)``), in a pool of their own (connections made as used)."""
        engine = create_engine(self.engine.url, pool_pre_ping=True, isolation_level="AUTOCOMMIT")
        event.listen(engine, "connect", _commit_without_waiting)
        return engine

    def close(self) -> None:
        """Close every connection of the engine (the store can no longer be used)."""
        self.engine.dispose()
        if "relaxed" in self.__dict__:
            self.relaxed.dispose()


def schema_revision(engine: Engine) -> str | None:
    """The database's schema revision (Alembic's), None for a database without one."""

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def open_store(url: str, *, create: bool = True) -> Store:
    """The job store at ``url``, its schema checked (a new database gets it).

    ``create=False`` (commands that only read): a SQLite file that does not exist is a
    ``ConfigurationError``; no file or folder is made.
    """
    new_file = None
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        file = Path(url.removeprefix("sqlite:///")).expanduser()
        new_file = None if file.exists() else file
        if not create and not file.is_file():
            raise ConfigurationError(
                f"no job store at {file}: nothing has been written there (annotate, serve "
                "or a worker creates it); check --db / SPECEYES_DATABASE_URL"
            )
        file.parent.mkdir(parents=True, exist_ok=True)
    engine = make_engine(url)
    try:
        current = schema_revision(engine)
        if current is None and _empty(engine):
            migrate(engine)  # a new store
        elif current != head_revision():
            engine.dispose()
            found = f"at schema revision {current}" if current else "not a job store"
            raise ConfigurationError(
                f"the job store at {_safe(url)} is {found}, this version needs "
                f"{head_revision()}: run `speceyes db upgrade --db URL` (back it up first)"
            )
    except OperationalError as exc:
        engine.dispose()
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise ConfigurationError(f"cannot open the job store at {_safe(url)}: {reason}") from None
    return Store(engine, new_file)


def _empty(engine: Engine) -> bool:
    return not inspect(engine).get_table_names()


def _safe(url: str) -> str:
    """The URL without its password, for messages."""

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"
