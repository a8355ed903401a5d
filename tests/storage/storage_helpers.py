"""Builders shared by the storage tests: runs in any lifecycle phase, raw row edits."""

from __future__ import annotations

import sqlite3
from typing import Any

from pi_workflows.storage import (
    Claim,
    Database,
    ExecutionMode,
    FailureClass,
    NewRun,
    OwnerType,
    RunPhase,
    cancel_run,
    claim_for_launch,
    complete_run,
    enqueue_run,
    fail_run,
    mark_runner_live,
    park_run,
    time_out_run,
    wait_run,
)


def new_run(run_id: str = "run-1", **overrides: Any) -> NewRun:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "workflow_name": "example",
        "project_path": "/project",
        "source_identity": {"root": {"kind": "file", "path": "/p/x.workflow.py", "hash": "h"}},
        "definition_digest": "sha256:def",
        "input_hash": "sha256:input",
        "input": {"topic": "private input"},
    }
    fields.update(overrides)
    return NewRun(**fields)


def enqueue(db: Database, run_id: str = "run-1", **overrides: Any) -> None:
    with db.write() as tx:
        enqueue_run(tx, new_run(run_id, **overrides))


def launch(db: Database, run_id: str = "run-1", epoch: str | None = None) -> Claim:
    with db.write() as tx:
        result = claim_for_launch(
            tx,
            run_id,
            owner_id="server-1",
            runner_epoch=epoch or f"{run_id}-epoch-{tx.now}",
            launch_envelope_hash="sha256:envelope",
        )
    return result.claim


def running(db: Database, run_id: str = "run-1") -> Claim:
    enqueue(db, run_id)
    claim = launch(db, run_id, epoch=f"{run_id}-e1")
    with db.write() as tx:
        mark_runner_live(tx, claim, runner_epoch=f"{run_id}-e1", pid=4242, process_start_time=7)
    return claim


def drive_to(db: Database, phase: RunPhase, run_id: str = "run-1") -> Claim | None:
    """Create `run_id` and bring it to `phase` through the public transitions."""
    if phase is RunPhase.QUEUED:
        enqueue(db, run_id)
        return None
    if phase is RunPhase.STARTING:
        enqueue(db, run_id)
        return launch(db, run_id, epoch=f"{run_id}-e1")
    if phase in (RunPhase.FAILED, RunPhase.CANCELLED):
        enqueue(db, run_id)
        with db.write() as tx:
            if phase is RunPhase.FAILED:
                fail_run(tx, run_id, failure_class=FailureClass.NODE_FAILED, reason="boom")
            else:
                cancel_run(tx, run_id)
        return None
    claim = running(db, run_id)
    if phase is RunPhase.RUNNING:
        return claim
    with db.write() as tx:
        if phase is RunPhase.PARKED:
            park_run(tx, claim, reason="test")
        elif phase is RunPhase.WAITING:
            wait_run(tx, claim, reason="checkpoint")
        elif phase is RunPhase.COMPLETED:
            complete_run(tx, run_id, claim=claim)
        elif phase is RunPhase.TIMED_OUT:
            time_out_run(tx, run_id, claim=claim, reason="deadline")
    return None


def raw_edit(db: Database, *statements: str, params: dict[str, Any] | None = None) -> None:
    """Apply statements bypassing checks, triggers' immutability aside (tests only)."""
    conn: sqlite3.Connection = db.connection
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("PRAGMA ignore_check_constraints = ON")
    try:
        conn.execute("BEGIN IMMEDIATE")
        for statement in statements:
            conn.execute(statement, params or {})
        conn.execute("COMMIT")
    finally:
        conn.execute("PRAGMA ignore_check_constraints = OFF")
        conn.execute("PRAGMA foreign_keys = ON")


INTERACTIVE = {"execution_mode": ExecutionMode.INTERACTIVE, "origin_session_id": "session-1"}
HOST = OwnerType.HOST
