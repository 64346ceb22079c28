"""``speceyes webhooks`` (issue 46, point 4): register, list and remove endpoints, read
the callback secret and the deliveries, on the store the API uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from common.store import webhooks
from common.store.db import open_store


def test_endpoints_are_registered_listed_and_removed_and_deliveries_read(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
):
    store = ["--db", f"sqlite:///{tmp_path / 's.db'}"]
    assert main(["db", "upgrade", *store]) == 0
    assert main(["webhooks", "add", "http://127.0.0.1:9/hook", *store]) == 2
    assert "not a public address" in capsys.readouterr().err
    monkeypatch.setenv("SPECEYES_WEBHOOK_ALLOW_HOSTS", '["127.0.0.1"]')
    add = ["webhooks", "add", "http://127.0.0.1:9/hook", "--events", "batch.finished"]
    assert main([*add, "--tenant", "acme", *store]) == 0
    made, secret = capsys.readouterr().out.splitlines()
    endpoint_id = made.split()[1]
    assert secret.startswith("secret whsec_")
    assert main(["webhooks", "list", *store]) == 0  # the command line's: none
    assert capsys.readouterr().out == ""
    assert main(["webhooks", "list", "--tenant", "acme", *store]) == 0
    assert capsys.readouterr().out.split() == [
        endpoint_id,
        "http://127.0.0.1:9/hook",
        "batch.finished",
    ]
    sessions = open_store(store[1])
    with sessions.begin() as session:  # an event, as a batch's end writes one
        webhooks.emit(session, "batch.finished", "acme", "b" * 32, {"id": "b" * 32})
    assert main(["webhooks", "deliveries", "--tenant", "acme", *store]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    delivery = json.loads(line)
    assert (delivery["type"], delivery["state"], delivery["attempts"]) == (
        "batch.finished",
        "pending",
        [],
    )
    assert main(["webhooks", "secret", "--tenant", "acme", *store]) == 0
    assert capsys.readouterr().out.startswith("whsec_")
    assert main(["webhooks", "remove", endpoint_id, *store]) == 2  # (not the CLI's)
    assert "no endpoint" in capsys.readouterr().err
    assert main(["webhooks", "remove", endpoint_id, "--tenant", "acme", *store]) == 0
    assert main(["webhooks", "list", "--tenant", "acme", *store]) == 0
    assert capsys.readouterr().out == f"removed {endpoint_id}\n"
    sessions.close()
