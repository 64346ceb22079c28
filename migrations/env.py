"""Alembic environment: the schema of the job store.

Run through ``common.store.db.migrate(url)`` (which the CLI calls), or by hand with
``alembic -x url=sqlite:///speceyes.db upgrade head`` from the repository root.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from common.store.tables import Base

config = context.config
url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
    "sqlalchemy.url"
)


def run_offline() -> None:
    context.configure(url=url, target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = engine_from_config(
        {"sqlalchemy.url": url}, prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.connect() as connection:
        _run(connection)


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters by copying
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
