"""The server side of unproductive agent turns (`runner.progress` `interaction.turnEnded`).

Drives the runner host's own functions (`apply_message`, the delta, the exit policy) on
a real state database, as tests/server/test_runner_content.py does: the server counts
each turn under the live claim (1 and 2 remind, the third fails), keeps a provider
error bounded, does not count an aborted turn or one that ended while a submission
validates, adopts a retried report, and a new request for the visit of an interrupted
attempt goes on counting and says `resumed`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from pi_workflows.storage import Database
from pi_workflows.storage._interactions import read_request, record_submission
from pi_workflows.wire.canonical import sha256_digest
from tests.server.test_runner_content import Runner, _enqueue

pytestmark = pytest.mark.timeout(60)

CONTRACT = {"step": "ask", "attempt": "a", "outputSchema": None, "validate": False}


def _agent_step(runner: Runner, attempt: str) -> dict[str, Any]:
    """Start an agent attempt and propose its request; returns the request reply."""
    (started,) = runner.send(
        "node.started", {"nodePath": "ask", "nodeKind": "agent", "visit": 1}, attempt
    )
    assert started["outcome"] == "accepted", started
    (reply,) = runner.send(
        "interaction.requested",
        {
            "interactionId": f"request-{attempt}",
            "interactionKind": "agent",
            "contractHash": sha256_digest(CONTRACT),
            "request": CONTRACT,
        },
        attempt,
    )
    assert reply["outcome"] == "accepted", reply
    return dict(reply["result"])


def _turn(request: str, stop: str = "stop", error: str | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "operation": "interaction.turnEnded",
        "interactionId": request,
        "stopReason": stop,
    }
    if error is not None:
        payload["error"] = error
    return payload


def _verdict(runner: Runner, payload: dict[str, Any]) -> dict[str, Any]:
    (reply,) = runner.send("runner.progress", payload)
    assert reply["outcome"] == "accepted", reply
    return dict(reply["result"])


def test_turns_are_counted_remind_remind_fail_and_a_provider_error_is_kept(
    db: Database,
) -> None:
    runner = Runner(db, _enqueue(db))
    runner.ready()
    assert "resumed" not in _agent_step(runner, "attempt-1")
    request = "request-attempt-1"
    assert _verdict(runner, _turn(request)) == {"action": "remind", "count": 1}
    assert _verdict(runner, _turn(request, "aborted")) == {"action": "remind", "count": 1}
    long_error = "upstream said no " * 300
    assert _verdict(runner, _turn(request, "error", long_error[:2048])) == {
        "action": "remind",
        "count": 2,
    }
    with db.read() as reader:
        row = read_request(reader, request)
    assert row is not None and row.last_turn_error == long_error[:2048]
    assert _verdict(runner, _turn(request)) == {"action": "fail", "count": 3}


def test_a_retried_report_gets_the_stored_reply_and_counts_once(db: Database) -> None:
    runner = Runner(db, _enqueue(db))
    runner.ready()
    _agent_step(runner, "attempt-1")
    message = runner.message("runner.progress", _turn("request-attempt-1"))
    (first,) = runner.handle(message)
    (again,) = runner.handle(message)  # the runner's retry after a lost reply
    assert first == again and first["result"] == {"action": "remind", "count": 1}
    with db.read() as reader:
        row = read_request(reader, "request-attempt-1")
    assert row is not None and row.unproductive_turn_ends == 1


def test_a_turn_while_a_submission_validates_is_not_counted_and_an_unknown_request_is_refused(
    db: Database,
) -> None:
    runner = Runner(db, _enqueue(db))
    runner.ready()
    _agent_step(runner, "attempt-1")
    with db.write() as tx:
        submitted = record_submission(
            tx,
            request_id="request-attempt-1",
            submission_id="submission-1",
            idempotency_key="key-1",
            value={"summary": "x"},
        )
    assert submitted.status == "new"
    assert _verdict(runner, _turn("request-attempt-1")) == {"action": "remind", "count": 0}
    (refused,) = runner.send("runner.progress", _turn("request-nope"))
    assert refused["outcome"] != "accepted"


def test_the_request_of_a_resumed_visit_goes_on_counting_and_says_resumed(
    db: Database, tmp_path: Path
) -> None:
    run_id = _enqueue(db)
    first = Runner(db, run_id)
    first.ready()
    _agent_step(first, "attempt-1")
    _verdict(first, _turn("request-attempt-1", "error", "boom"))
    _verdict(first, _turn("request-attempt-1"))
    assert first.exit(-9) == "workerCrashed"  # the attempt is interrupted
    second = Runner(db, run_id)
    second.ready()
    assert _agent_step(second, "attempt-2")["resumed"] is True
    with db.read() as reader:
        row = read_request(reader, "request-attempt-2")
    assert row is not None and (row.unproductive_turn_ends, row.status) == (2, "pending")
    assert _verdict(second, _turn("request-attempt-2")) == {"action": "fail", "count": 3}
    with sqlite3.connect(tmp_path / "workflows" / "state.sqlite") as conn:
        statuses = conn.execute(
            "SELECT status FROM node_attempts WHERE run_id = ? ORDER BY started_at", (run_id,)
        ).fetchall()
    assert statuses == [("interrupted",), ("running",)]
