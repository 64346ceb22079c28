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
