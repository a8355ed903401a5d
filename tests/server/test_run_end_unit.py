"""The run's end as one claim-checked unit: its last pure node, and its receipts check.

`run.finished` may name the run's last pure node (`lastNode`): the server finishes that
attempt, with the run's output as the node's, and completes the run in one transaction.
It carries `receipts`, how many of the runner's messages before it the server must have
accepted, because the runner sends it behind its posted messages without waiting for
their answers: if one of them was refused, the run's end is refused too and changes
nothing. Driven through the runner host's own functions on a real state database.
"""

from __future__ import annotations

from typing import Any

import pytest

from pi_workflows.storage import (
    Database,
    count_runner_replies,
    get_run,
    list_attempts,
    put_json_blob,
)
from tests.server.test_runner_content import Runner, _enqueue

pytestmark = pytest.mark.timeout(60)


def _started(runner: Runner, path: str, visit: int = 1) -> dict[str, Any]:
    started = {"nodePath": path, "nodeKind": "compute", "visit": visit}
    (reply,) = runner.send("node.started", started, f"attempt-{path}")
    return reply


def _status(db: Database, run_id: str) -> str:
    with db.read() as reader:
        run = get_run(reader, run_id)
    assert run is not None
    return run.status


def test_the_last_node_finishes_with_the_run_in_one_unit(db: Database) -> None:
    run_id = _enqueue(db)
    runner = Runner(db, run_id)
    runner.ready()
    runner.finish_node("a", {"n": 1})
    assert _started(runner, "c")["outcome"] == "accepted"
    output = {"summary": "done"}
    end = {
        "status": "completed",
        "output": output,
        "lastNode": {"attemptId": "attempt-c", "nodePath": "c"},
        "receipts": 4,  # ready, a started, a finished, c started
    }
    (reply,) = runner.send("run.finished", end)
    assert reply["outcome"] == "accepted", reply
    assert _status(db, run_id) == "completed"
    with db.read() as reader:
        attempts = {a.node_path: a for a in list_attempts(reader, run_id)}
        assert count_runner_replies(reader, runner.epoch) == 5
    assert attempts["c"].status == "completed"
    with db.write() as tx:  # the same canonical bytes name the same blob
        assert attempts["c"].output_hash == put_json_blob(tx, output)


def test_a_run_end_behind_a_refused_message_is_refused_and_changes_nothing(
    db: Database,
) -> None:
    run_id = _enqueue(db)
    runner = Runner(db, run_id)
    runner.ready()
    runner.finish_node("a", {"n": 1})
    # Posted with the visit the runner assumed; the server counts another: refused.
    refused = _started(runner, "b", visit=2)
    assert refused["outcome"] == "rejected", refused
    # Nothing else stops this end: no attempt is open, the claim holds.
    end = {"status": "completed", "output": {"n": 1}, "receipts": 4}
    (reply,) = runner.send("run.finished", end)
    assert reply["outcome"] == "rejected", reply
    assert reply["error"]["code"] == "protocolRejected"
    assert _status(db, run_id) == "running"
    with db.read() as reader:
        assert [a.node_path for a in list_attempts(reader, run_id)] == ["a"]
        assert count_runner_replies(reader, runner.epoch) == 3  # ready, a started, finished


def test_a_run_end_with_every_earlier_message_accepted_needs_no_last_node(
    db: Database,
) -> None:
    run_id = _enqueue(db)
    runner = Runner(db, run_id)
    runner.ready()
    runner.finish_node("a", {"n": 1})
    failed = {
        "status": "failed",
        "error": {"code": "nodeFailed", "message": "a: no"},
        "receipts": 3,
    }
    (reply,) = runner.send("run.finished", failed)
    assert reply["outcome"] == "accepted", reply
    assert _status(db, run_id) == "failed"
