"""Opening the store checks its schema; only `speceyes db upgrade` migrates one."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from cli.main import main
from common.errors import ConfigurationError
from common.store.db import head_revision, make_engine, migrate, open_store, schema_revision


def test_a_new_store_is_made_at_the_newest_schema(database_url):
    store = open_store(database_url)
    assert schema_revision(store.engine) == head_revision()
    store.close()


def test_an_older_store_is_refused_until_db_upgrade_migrates_it(database_url, capsys):
    engine = make_engine(database_url)
    migrate(engine, "0008")  # a store an older version made
    engine.dispose()
    with pytest.raises(ConfigurationError, match=r"revision 0008.*speceyes db upgrade"):
        open_store(database_url)
    engine = make_engine(database_url)
    assert schema_revision(engine) == "0008"  # opening it changed nothing
    engine.dispose()

    assert main(["db", "upgrade", "--db", database_url]) == 0
    assert f"from 0008 to revision {head_revision()}" in capsys.readouterr().out
    store = open_store(database_url)
    assert schema_revision(store.engine) == head_revision()
    store.close()
    assert main(["db", "upgrade", "--db", database_url]) == 0  # again: nothing to do
    assert "already at" in capsys.readouterr().out


def test_a_database_of_something_else_is_not_taken_for_a_store(database_url):
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE invoices (id INTEGER PRIMARY KEY)"))
    engine.dispose()
    with pytest.raises(ConfigurationError, match="not a job store"):
        open_store(database_url)


def test_0011_forgets_the_paths_refused_api_jobs_kept(database_url):
    """An older version kept the path a refused API batch job named; the upgrade forgets
    it (the image routes would serve it), and nothing else."""
    engine = make_engine(database_url)
    migrate(engine, "0010")
    job = (
        "INSERT INTO jobs (id, idempotency_key, image_path, image_hash, question, status, "
        "stage, attempts, created_at) VALUES (:id, :id, :path, :hash, 'q', :status, 'fast', "
        "0, '2026-12-01 00:00:00')"
    )
    with engine.begin() as connection:
        for batch, source in (("b-api", "api"), ("b-cli", "/corpus")):
            connection.execute(
                text(
                    "INSERT INTO batches (id, key, name, source, config, created_at) VALUES "
                    "(:id, :id, 'n', :source, '{}', '2026-12-01 00:00:00')"
                ),
                {"id": batch, "source": source},
            )
        rows = [  # (job, batch, path, hash, status)
            ("refused", "b-api", "/etc/secret.png", None, "failed"),
            ("uploaded", "b-api", "/uploads/a.png", "h1", "failed"),
            ("waiting", "b-api", "/roots/b.png", None, "queued"),
            ("cli", "b-cli", "/corpus/missing.png", None, "failed"),
        ]
        for position, (job_id, batch, path, digest, status) in enumerate(rows):
            connection.execute(
                text(job), {"id": job_id, "path": path, "hash": digest, "status": status}
            )
            connection.execute(
                text(
                    "INSERT INTO batch_items (batch_id, position, item_id, job_id) "
                    "VALUES (:batch, :position, :item, :job)"
                ),
                {"batch": batch, "position": position, "item": job_id, "job": job_id},
            )
    migrate(engine, "head")
    with engine.connect() as connection:
        paths = dict(connection.execute(text("SELECT id, image_path FROM jobs")).all())
    engine.dispose()
    assert paths == {
        "refused": None,
        "uploaded": "/uploads/a.png",
        "waiting": "/roots/b.png",
        "cli": "/corpus/missing.png",
    }


def test_the_migrations_make_the_schema_the_tables_declare(database_url):
    """``open_store`` builds a store from the migrations; what the code declares
    (``common.store.tables``, ``openai_tables``, ``tallies``) matches it: no table,
    column or index only one side has."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    import common.store.openai_tables
    import common.store.tallies  # noqa: F401
    from common.store.db import open_store
    from common.store.tables import Base

    store = open_store(database_url)
    try:
        with store.engine.connect() as connection:
            differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
            # (an index on an expression: SQLite cannot reflect it, PostgreSQL writes its
            # expression back in its own words; it is there, by name, with its columns)
            names = {
                "sqlite": "SELECT name FROM sqlite_master WHERE type = 'index'",
                "postgresql": "SELECT indexname FROM pg_indexes",
            }
            indexes = set(connection.scalars(text(names[connection.dialect.name])))
    finally:
        store.close()
    expressions = {"ix_jobs_margin"}
    assert expressions <= indexes
    assert [
        d
        for d in differences
        if d[0]
        in ("add_index", "remove_index", "add_table", "remove_table", "add_column", "remove_column")
        and not (d[0].endswith("_index") and d[1].name in expressions)
    ] == []
