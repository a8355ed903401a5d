"""The invariant checker: clean on everything the transitions build, and one deliberately
broken database per finding code. It never raises, and never reports payloads or tokens."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from pi_workflows.storage import (
    Claim,
    Database,
    ExecutionMode,
    Finding,
    FindingCode,
    ManualClock,
    Tx,
    cancel_run,
    complete_run,
    finish_node_attempt,
    mark_runner_live,
    open_database,
    put_blob,
    put_json_blob,
    put_view_content,
    start_node_attempt,
    verify,
    verify_backup,
    wait_run,
)
from pi_workflows.storage._verify import VERIFY_PART_BYTES
from tests.storage.storage_helpers import enqueue, launch, running

SECRETS: list[str] = []


def _interactive(db: Database, run_id: str, session: str) -> Claim:
    enqueue(db, run_id, execution_mode=ExecutionMode.INTERACTIVE, origin_session_id=session)
    claim = launch(db, run_id, epoch=f"{run_id}-e1")
    with db.write() as tx:
        mark_runner_live(tx, claim, runner_epoch=f"{run_id}-e1", pid=1, process_start_time=1)
    return claim


def _request(tx: Tx, run_id: str, attempt_id: str) -> None:
    contract = put_json_blob(tx, {"contract": run_id})
    tx.execute(
        "INSERT INTO interactive_requests (request_id, run_id, attempt_id, target_session_id,"
        " kind, contract_hash, status, created_at, updated_at)"
        " VALUES (:r, :run, :a, 's', 'agent', :c, 'pending', 1, 1)",
        {"r": f"req-{run_id}", "run": run_id, "a": attempt_id, "c": contract},
    )
    tx.execute(
        "INSERT INTO workflow_messages (message_id, run_id, target_session_id, kind, reason,"
        " source_id, content_digest, session_order, state, created_at, updated_at)"
        " VALUES (:m, :run, 's', 'step', 'initial', :r, 'sha256:c',"
        " (SELECT count(*) FROM workflow_messages), 'pending', 1, 1)",
        {"m": f"{run_id}-step", "run": run_id, "r": f"req-{run_id}"},
    )


def _effects(tx: Tx, run_id: str, attempt_id: str) -> None:
    for state in ("pending", "applying", "applied"):
        effect_id = f"{run_id}-{state}"
        tx.execute(
            "INSERT INTO effects (effect_id, run_id, attempt_id, effect_type, idempotency_key,"
            " request_fingerprint, state, created_at, updated_at, settled_at)"
            " VALUES (:e, :run, :a, 'http', :e, 'sha256:f', :s, 1, 1, :settled)",
            {
                "e": effect_id,
                "run": run_id,
                "a": attempt_id,
                "s": state,
                "settled": 1 if state == "applied" else None,
            },
        )
        if state != "pending":
            tx.execute(
                "INSERT INTO effect_attempts (effect_id, attempt_number, executor_epoch, state,"
                " started_at, finished_at) VALUES (:e, 1, 'x', :s, 1, :f)",
                {"e": effect_id, "s": state, "f": 2 if state == "applied" else None},
            )


def _decision(tx: Tx, run_id: str, attempt_id: str) -> None:
    request = put_json_blob(tx, {"decision": run_id})
    tx.execute(
        "INSERT INTO human_decisions (decision_id, run_id, attempt_id, node_path, audience,"
        " request_digest, request_hash, status, expires_at, created_at, updated_at)"
        " VALUES (:d, :run, :a, 'n', 'ops', 'sha256:r', :h, 'pending', 99, 1, 1)",
        {"d": f"{run_id}-decision", "run": run_id, "a": attempt_id, "h": request},
    )


def build(db: Database) -> None:
    """Runs in several phases with attempts, requests, decisions, effects and content."""
    enqueue(db, "q")
    r = running(db, "r")
    with db.write() as tx:
        start_node_attempt(tx, r, attempt_id="a-r", node_path="n", node_type="compute")
        _effects(tx, "r", "a-r")
        put_view_content(tx, "r", "application/json", b'{"view":1}')
        put_blob(tx, b"some output")
    w = _interactive(db, "w", "session-w")
    with db.write() as tx:
        start_node_attempt(
            tx, w, attempt_id="a-w", node_path="ask", node_type="agent", deadline_at=10**13
        )
        _request(tx, "w", "a-w")
        wait_run(tx, w, reason="interaction", attempt_id="a-w")
    c = running(db, "c")
    with db.write() as tx:
        start_node_attempt(tx, c, attempt_id="a-c", node_path="n", node_type="compute")
        finish_node_attempt(tx, c, attempt_id="a-c")
        complete_run(tx, "c", claim=c)
    x = _interactive(db, "x", "session-x")
    with db.write() as tx:
        start_node_attempt(tx, x, attempt_id="a-x", node_path="n", node_type="agent")
        _request(tx, "x", "a-x")
        _decision(tx, "x", "a-x")
        _effects(tx, "x", "a-x")
        cancel_run(tx, "x", claim=x, reason="user")
    SECRETS[:] = [r.token, r.token_hash, "private input"]


@pytest.fixture
def built(tmp_path: Path) -> Path:
    path = tmp_path / "state.sqlite"
    db = open_database(path, clock=ManualClock())
    build(db)
    assert verify(db) == []
    db.close()
    return path


def raw(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("PRAGMA ignore_check_constraints = ON")
    for statement in statements:
        conn.execute(statement)
    conn.close()


def _corrupt_index(path: Path) -> None:
    raw(
        path,
        "PRAGMA writable_schema = ON",
        "UPDATE sqlite_schema SET sql = 'CREATE INDEX runs_by_status ON runs (workflow_name)'"
        " WHERE name = 'runs_by_status'",
    )


BREAKS: dict[FindingCode, Callable[[Path], None]] = {
    FindingCode.CHECK_FAILED: lambda p: raw(p, "DROP TABLE runner_epochs"),
    FindingCode.INTEGRITY: _corrupt_index,
    FindingCode.FOREIGN_KEY: lambda p: raw(
        p,
        "INSERT INTO events (run_id, revision, event_type, generation, payload, recorded_at)"
        " VALUES ('ghost', 1, 'x', 0, '{}', 1)",
    ),
    FindingCode.SCHEMA_MISMATCH: lambda p: raw(p, "UPDATE schema_info SET ddl_digest = 'old'"),
    FindingCode.MISSING_TABLE: lambda p: raw(p, "DROP TABLE channel_messages"),
    FindingCode.RUN_WITHOUT_QUEUE: lambda p: raw(p, "DELETE FROM run_queue WHERE run_id = 'q'"),
    FindingCode.RUN_QUEUE_MISMATCH: lambda p: raw(
        p, "UPDATE run_queue SET state = 'done' WHERE run_id = 'q'"
    ),
    FindingCode.TERMINAL_LIVE_QUEUE: lambda p: raw(
        p, "UPDATE run_queue SET state = 'queued' WHERE run_id = 'c'"
    ),
    FindingCode.CLAIMED_WITHOUT_LEASE: lambda p: raw(p, "DELETE FROM leases WHERE resource = 'r'"),
    FindingCode.TERMINAL_LEASE: lambda p: raw(
        p,
        "INSERT INTO leases (resource, owner_type, owner_id, token_hash, generation,"
        " acquired_at, heartbeat_at, expires_at) VALUES ('c', 'host', 'h', 'x', 1, 1, 1, 2)",
    ),
    FindingCode.LEASE_GENERATION: lambda p: raw(
        p, "UPDATE leases SET generation = 7 WHERE resource = 'r'"
    ),
    FindingCode.MULTIPLE_ACTIVE_RUNNERS: lambda p: raw(
        p,
        "DROP INDEX runner_epochs_one_active",
        "INSERT INTO runner_epochs (runner_epoch, run_id, generation, launch_envelope_hash, status,"
        " started_at) VALUES ('r-e2', 'r', 1, 'h', 'starting', 1)",
    ),
    FindingCode.EVENT_REVISION_GAP: lambda p: raw(
        p, "DELETE FROM events WHERE run_id = 'r' AND revision = 2"
    ),
    FindingCode.RUN_REVISION_MISMATCH: lambda p: raw(
        p, "UPDATE runs SET revision = revision + 1 WHERE run_id = 'q'"
    ),
    FindingCode.FINISHED_AT_MISMATCH: lambda p: raw(
        p, "UPDATE runs SET finished_at = NULL WHERE run_id = 'c'"
    ),
    FindingCode.TERMINAL_PAUSED: lambda p: raw(p, "UPDATE runs SET paused = 1 WHERE run_id = 'c'"),
    FindingCode.TERMINAL_UNFINISHED_ATTEMPT: lambda p: raw(
        p, "UPDATE node_attempts SET status = 'running', finished_at = NULL WHERE run_id = 'c'"
    ),
    FindingCode.MULTIPLE_UNFINISHED_ATTEMPTS: lambda p: raw(
        p,
        "DROP INDEX node_attempts_one_unfinished",
        "INSERT INTO node_attempts (attempt_id, run_id, node_path, node_type, visit, generation,"
        " status, started_at) VALUES ('a-r2', 'r', 'm', 'compute', 1, 1, 'running', 1)",
    ),
    FindingCode.RUNNING_ATTEMPT_WITHOUT_RUNNER: lambda p: raw(
        p, "UPDATE node_attempts SET status = 'running' WHERE attempt_id = 'a-w'"
    ),
    FindingCode.TERMINAL_PENDING_STEP_MESSAGE: lambda p: raw(
        p, "UPDATE workflow_messages SET state = 'pending' WHERE message_id = 'x-step'"
    ),
    FindingCode.DUPLICATE_PENDING_STEP_MESSAGE: lambda p: raw(
        p,
        "DROP INDEX workflow_messages_one_pending_step",
        "INSERT INTO workflow_messages (message_id, run_id, target_session_id, kind, reason,"
        " source_id, content_digest, session_order, state, created_at, updated_at)"
        " VALUES ('w-step-2', 'w', 's', 'step', 'reminder', 'req-w', 'sha256:c', 99,"
        " 'pending', 1, 1)",
    ),
    FindingCode.TERMINAL_PENDING_REQUEST: lambda p: raw(
        p,
        "UPDATE interactive_requests SET status = 'pending', settled_at = NULL WHERE run_id = 'x'",
    ),
    FindingCode.TERMINAL_PENDING_DECISION: lambda p: raw(
        p,
        "UPDATE human_decisions SET status = 'pending' WHERE run_id = 'x'",
        "DELETE FROM human_decision_resolutions",
    ),
    FindingCode.DECISION_RESOLUTION_MISMATCH: lambda p: raw(
        p, "DELETE FROM human_decision_resolutions"
    ),
    FindingCode.TERMINAL_UNSETTLED_EFFECT: lambda p: raw(
        p, "UPDATE effects SET state = 'pending', settled_at = NULL WHERE effect_id = 'x-pending'"
    ),
    FindingCode.EFFECT_APPLIED_TWICE: lambda p: raw(
        p,
        "DROP INDEX effect_attempts_one_applied",
        "INSERT INTO effect_attempts (effect_id, attempt_number, executor_epoch, state,"
        " started_at, finished_at) VALUES ('r-applied', 2, 'x', 'applied', 3, 4)",
    ),
    FindingCode.EFFECT_STATE_MISMATCH: lambda p: raw(
        p, "UPDATE effects SET state = 'applied' WHERE effect_id = 'x-pending'"
    ),
    FindingCode.EFFECT_ATTEMPT_NUMBERING: lambda p: raw(
        p, "UPDATE effect_attempts SET attempt_number = 3 WHERE effect_id = 'r-applied'"
    ),
    FindingCode.EFFECT_LAST_ATTEMPT_MISMATCH: lambda p: raw(
        p,
        "INSERT INTO effect_attempts (effect_id, attempt_number, executor_epoch, state,"
        " started_at, finished_at) VALUES ('r-applied', 2, 'y', 'rejected', 3, 4)",
    ),
    FindingCode.EFFECT_NODE_ATTEMPT_OTHER_RUN: lambda p: raw(
        p, "UPDATE effects SET attempt_id = 'a-w' WHERE effect_id = 'r-pending'"
    ),
    FindingCode.EFFECT_INTERRUPTED_NOT_IDEMPOTENT: lambda p: raw(
        p,
        "UPDATE effect_attempts SET attempt_number = 2 WHERE effect_id = 'r-applied'",
        "INSERT INTO effect_attempts (effect_id, attempt_number, executor_epoch, state,"
        " started_at, finished_at) VALUES ('r-applied', 1, 'w', 'interrupted', 1, 2)",
    ),
    FindingCode.EFFECT_RECOVERY_UNRECORDED: lambda p: raw(
        p, "UPDATE effect_attempts SET recovery = 'confirmed' WHERE effect_id = 'r-applied'"
    ),
    FindingCode.RESERVATION_MISMATCH: lambda p: raw(
        p, "UPDATE run_bindings SET reserved = 1 WHERE run_id = 'x'"
    ),
    FindingCode.BLOB_DIGEST_MISMATCH: lambda p: raw(
        p, "UPDATE blobs SET content = x'00' WHERE byte_length = 11"
    ),
    FindingCode.VIEW_CONTENT_DIGEST_MISMATCH: lambda p: raw(
        p, "UPDATE run_view_content SET content = x'7b7d'"
    ),
}


def test_every_finding_code_has_a_broken_database() -> None:
    assert set(BREAKS) == set(FindingCode)


@pytest.mark.parametrize("code", list(BREAKS), ids=[c.value for c in BREAKS])
def test_checker_reports_each_deliberate_break(built: Path, code: FindingCode) -> None:
    BREAKS[code](built)
    findings = verify_backup(built)
    assert code in {f.code for f in findings}, findings
    for finding in findings:
        assert isinstance(finding, Finding)
        for secret in SECRETS:
            assert secret not in finding.detail


def test_findings_name_the_run(built: Path) -> None:
    BREAKS[FindingCode.TERMINAL_LIVE_QUEUE](built)
    findings = verify_backup(built)
    assert Finding(FindingCode.TERMINAL_LIVE_QUEUE, "c", "run completed, queue queued") in findings


def test_live_database_and_its_backup_verify_clean(built: Path, tmp_path: Path) -> None:
    db = open_database(built, clock=ManualClock())
    backup = tmp_path / "backup.sqlite"
    db.connection.execute("VACUUM INTO ?", (str(backup),))
    assert verify(db) == []
    assert verify(db.connection) == []
    db.close()
    assert verify_backup(backup) == []


def test_deleting_a_terminal_run_cascades_cleanly(built: Path) -> None:
    """Retention deletes whole runs; every dependent row goes with them."""
    db = open_database(built, clock=ManualClock())
    try:
        with db.write() as tx:
            tx.execute("DELETE FROM runs WHERE run_id IN ('x', 'c')")
        assert verify(db) == []
        assert db.fetch_value("SELECT count(*) FROM effects WHERE run_id = 'x'", {}) == 0
        assert db.fetch_value("SELECT count(*) FROM human_decision_resolutions", {}) == 0
    finally:
        db.close()


def test_a_blob_larger_than_one_part_is_hashed_part_by_part(built: Path) -> None:
    """A clean multi-part blob verifies; one changed byte in its last part is found."""
    large = bytes(range(256)) * (VERIFY_PART_BYTES // 128 + 3)  # just over two parts
    db = open_database(built, clock=ManualClock())
    try:
        with db.write() as tx:
            put_blob(tx, large)
        assert verify(db) == []
    finally:
        db.close()
    with contextlib.closing(sqlite3.connect(built)) as conn, conn:
        conn.execute(
            "UPDATE blobs SET content = ? WHERE byte_length = ?",
            (large[:-1] + b"\x00", len(large)),
        )
    findings = verify_backup(built)
    assert FindingCode.BLOB_DIGEST_MISMATCH in {finding.code for finding in findings}


def test_expired_claims_are_recoverable_state_not_findings(built: Path) -> None:
    db = open_database(built, clock=ManualClock(start_ms=10**15))
    try:
        assert verify(db) == []
    finally:
        db.close()


@pytest.mark.parametrize(
    "content",
    [b"", b"not a database" * 1000, b"SQLite format 3\x00" + b"\xff" * 8000],
    ids=["empty", "garbage", "bad-header"],
)
def test_checker_never_raises_on_a_broken_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "broken.sqlite"
    path.write_bytes(content)
    findings = verify_backup(path)
    assert findings, "a broken file must produce findings"
    assert {f.code for f in findings} <= {
        FindingCode.CHECK_FAILED,
        FindingCode.MISSING_TABLE,
        FindingCode.INTEGRITY,
    }


def test_checker_on_a_missing_file(tmp_path: Path) -> None:
    findings = verify_backup(tmp_path / "absent.sqlite")
    assert [f.code for f in findings] == [FindingCode.CHECK_FAILED]
    assert not (tmp_path / "absent.sqlite").exists()


def test_checker_reports_a_truncated_file(built: Path) -> None:
    conn = sqlite3.connect(built)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = built.read_bytes()
    built.write_bytes(data[: len(data) // 2])
    findings = verify_backup(built)
    assert findings
