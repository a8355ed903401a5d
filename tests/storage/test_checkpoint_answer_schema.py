"""`answer_checkpoint` checks the answer against the snapshot's `answerSchema` first."""

from __future__ import annotations

from typing import Any

import pytest

from pi_workflows.storage import (
    AnswerInvalidError,
    Database,
    answer_checkpoint,
    checkpoint_answer_schema,
    get_run,
    list_runs,
    mark_runner_live,
    open_checkpoint_decision,
    put_json_blob,
    wait_run,
)
from pi_workflows.wire.canonical import sha256_digest
from tests.storage.storage_helpers import enqueue, launch

SCHEMA = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}


def snapshot(answer_schema: Any | None) -> dict[str, Any]:
    node: dict[str, Any] = {"kind": "checkpoint", "timeoutMs": None}
    if answer_schema is not None:
        node["answerSchema"] = answer_schema
    return {"schema": "pi-workflows.definition-snapshot.v1", "nodes": {"ask": node}}


def waiting(db: Database, definition: dict[str, Any] | None) -> str:
    """A run waiting at checkpoint `ask`; its snapshot stored unless `definition` is None."""
    digest = sha256_digest(definition if definition is not None else {"missing": True})
    enqueue(db, "run-1", definition_digest=digest)
    claim = launch(db, "run-1", epoch="run-1-e1")
    with db.write() as tx:
        if definition is not None:
            assert put_json_blob(tx, definition) == digest
        mark_runner_live(tx, claim, runner_epoch="run-1-e1", pid=None, process_start_time=None)

        def decide(tx: Any) -> None:
            open_checkpoint_decision(
                tx, "run-1", attempt_id=None, node_path="ask", request={"summary": "?"}
            )

        wait_run(tx, claim, reason="checkpoint", change=decide)
    return "run-1"


def test_an_answer_outside_the_schema_writes_nothing(db: Database) -> None:
    run_id = waiting(db, snapshot(SCHEMA))
    assert checkpoint_answer_schema(db, run_id, "ask") == SCHEMA
    with db.write() as tx, pytest.raises(AnswerInvalidError) as caught:
        answer_checkpoint(tx, run_id, answer={"ok": "yes"}, idempotency_key="k1")
    assert caught.value.code == "answerInvalid"
    assert caught.value.path == "/ok"
    assert "at /ok: must be boolean" in str(caught.value)
    assert "yes" not in str(caught.value), "the refused answer is never quoted"
    assert len(list_runs(db)) == 1
    with db.write() as tx:
        answered = answer_checkpoint(tx, run_id, answer={"ok": True}, idempotency_key="k2")
    assert get_run(db, answered.continuation_run_id) is not None


def test_a_checkpoint_without_a_schema_accepts_any_json(db: Database) -> None:
    run_id = waiting(db, snapshot(None))
    assert checkpoint_answer_schema(db, run_id, "ask") is None
    with db.write() as tx:
        answer_checkpoint(tx, run_id, answer=["anything", 1], idempotency_key="k")


def test_a_run_without_a_stored_snapshot_cannot_be_answered(db: Database) -> None:
    run_id = waiting(db, None)
    with db.write() as tx, pytest.raises(AnswerInvalidError) as caught:
        answer_checkpoint(tx, run_id, answer={"ok": True}, idempotency_key="k")
    assert caught.value.code == "definitionUnavailable"
    assert len(list_runs(db)) == 1
