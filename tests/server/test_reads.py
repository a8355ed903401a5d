"""Client reads through a real server do not queue behind the database actor's writes.

`server.status`, `run.get` and `run.list` go to the reader actor; with the database
actor held inside an open write transaction, they are still answered, from the last
committed state, and a command goes to the writer after the held write.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.actors._database import Transact
from pi_workflows.storage import Database
from pi_workflows.testing import CallUnit
from tests.server.runs import start_run

pytestmark = pytest.mark.timeout(60)


def test_reads_are_answered_while_the_writer_is_busy(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    run_id = start_run(client, project, "hello")
    inside, release = threading.Event(), threading.Event()

    def long_write(db: Database) -> None:
        with db.write() as tx:
            tx.execute("UPDATE runs SET title = 'uncommitted' WHERE run_id = ?", (run_id,))
            inside.set()
            assert release.wait(30)

    assert server._database is not None
    server._database.tell(Transact(CallUnit(long_write)))
    assert inside.wait(30)
    try:
        status = client.call("server.status")["receipt"]
        assert status["runs"]["queued"] == 1 and status["activeRunners"] == 0
        assert client.call("run.get", run_id=run_id)["receipt"].get("title") != "uncommitted"
        items = client.call("run.list")["receipt"]["items"]
        assert [item["runId"] for item in items] == [run_id]
    finally:
        release.set()
    # A command goes to the writer, after the held write: it sees that write committed.
    client.call("run.pause", run_id=run_id)
    view = client.call("run.get", run_id=run_id)["receipt"]
    assert view["paused"] is True and view["title"] == "uncommitted"
