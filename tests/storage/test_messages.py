"""Workflow messages: the partial unique index on pending step messages.

workflow-server.md § Conformance: "a partial unique index allows at most one pending
step message for each interactive request". The index is the guarantee, so the test
writes through `insert_message` and lets SQLite refuse the second one.
"""

from __future__ import annotations

import sqlite3

import pytest

from pi_workflows.storage import Database
from pi_workflows.storage._messages import insert_message, mark_sent, read_message
from tests.storage.storage_helpers import INTERACTIVE, enqueue

SESSION = str(INTERACTIVE["origin_session_id"])


def _step(db: Database, request_id: str, reason: str = "initial") -> str:
    with db.write() as tx:
        return insert_message(
            tx,
            run_id="run-1",
            session_id=SESSION,
            kind="step",
            source_id=request_id,
            content={"prompt": "p"},
            reason=reason,
        )


def _states(db: Database) -> list[tuple[str, str, str]]:
    return [
        (str(source), str(reason), str(state))
        for source, reason, state in db.connection.execute(
            "SELECT source_id, reason, state FROM workflow_messages ORDER BY session_order"
        )
    ]


def test_a_second_pending_step_message_for_one_request_is_refused_by_the_index(
    db: Database,
) -> None:
    enqueue(db, **INTERACTIVE)
    first = _step(db, "request-1")
    with pytest.raises(sqlite3.IntegrityError):
        _step(db, "request-1", "reminder")
    assert _states(db) == [("request-1", "initial", "pending")], "the refused write left nothing"
    # Another request has its own pending step; a sent message no longer counts.
    _step(db, "request-2")
    message = read_message(db, first)
    assert message is not None
    with db.write() as tx:
        mark_sent(tx, message, "entry-1")
    _step(db, "request-1", "reminder")
    assert _states(db) == [
        ("request-1", "initial", "sent"),
        ("request-2", "initial", "pending"),
        ("request-1", "reminder", "pending"),
    ]
