"""The invariant checker: every inconsistency between the durable projections, as findings.

Implements workflow-server.md § Conformance ("run, queue, attempt, decision, lease, event
and viewer projections remain consistent") for `state verify`. It only reads, and it
never raises on a broken database: a check that cannot run is itself a finding.
"""

from __future__ import annotations

import enum
import hashlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pi_workflows.storage import _queries as q
from pi_workflows.storage._content import SELECT_CONTENT_PART
from pi_workflows.storage._db import Database
from pi_workflows.storage._phases import RunStatus, phase_of
from pi_workflows.storage._schema import DDL_DIGEST, SCHEMA_NAME, SCHEMA_VERSION, ddl_statements

__all__ = ["Finding", "FindingCode", "verify", "verify_backup", "verify_copy"]

_TERMINAL = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.CANCELLED}
)
_LIVE_QUEUE = frozenset({"queued", "starting", "running", "parked"})
# The checker reports at most this many findings per check, so a badly broken
# database still yields a bounded report.
_MAX_PER_CHECK = 1000


class FindingCode(enum.StrEnum):
    """One kind of inconsistency; each has a deliberately broken database in the tests."""

    CHECK_FAILED = "check_failed"  # a check could not run (corrupt file, missing column)
    INTEGRITY = "integrity_check_failed"  # PRAGMA integrity_check reported a problem
    FOREIGN_KEY = "foreign_key_violation"  # PRAGMA foreign_key_check reported a row
    SCHEMA_MISMATCH = "schema_mismatch"  # schema record is not pi-workflows-state v1 + digest
    MISSING_TABLE = "missing_table"  # a table of schema.sql does not exist
    RUN_WITHOUT_QUEUE = "run_without_queue_row"  # every run has exactly one queue row
    RUN_QUEUE_MISMATCH = "run_queue_state_mismatch"  # pair not in the lifecycle table
    TERMINAL_LIVE_QUEUE = "terminal_run_live_queue_row"  # terminal run, queue still live
    CLAIMED_WITHOUT_LEASE = "claimed_queue_without_lease"  # starting/running, no claim row
    TERMINAL_LEASE = "terminal_run_has_lease"  # terminal runs never hold a claim
    LEASE_GENERATION = "lease_generation_mismatch"  # claim generation != run generation
    MULTIPLE_ACTIVE_RUNNERS = "multiple_active_runners"  # two active runner epochs
    EVENT_REVISION_GAP = "event_revision_gap"  # event revisions are not exactly 1..N
    RUN_REVISION_MISMATCH = "run_revision_mismatch"  # run revision != last event revision
    FINISHED_AT_MISMATCH = "finished_at_mismatch"  # finish time set iff terminal
    TERMINAL_PAUSED = "terminal_run_paused"  # a terminal run is never paused
    TERMINAL_UNFINISHED_ATTEMPT = "terminal_run_unfinished_attempt"
    MULTIPLE_UNFINISHED_ATTEMPTS = "multiple_unfinished_attempts"  # one node at a time
    RUNNING_ATTEMPT_WITHOUT_RUNNER = "running_attempt_without_runner"
    TERMINAL_PENDING_STEP_MESSAGE = "terminal_run_pending_step_message"
    DUPLICATE_PENDING_STEP_MESSAGE = "duplicate_pending_step_message"
    TERMINAL_PENDING_REQUEST = "terminal_run_pending_request"
    TERMINAL_PENDING_DECISION = "terminal_run_pending_decision"
    DECISION_RESOLUTION_MISMATCH = "decision_resolution_mismatch"
    TERMINAL_UNSETTLED_EFFECT = "terminal_run_unsettled_effect"
    EFFECT_APPLIED_TWICE = "effect_applied_twice"
    EFFECT_STATE_MISMATCH = "effect_state_mismatch"  # effect state vs its attempts
    EFFECT_ATTEMPT_NUMBERING = "effect_attempt_numbering_gap"  # attempts not exactly 1..N
    EFFECT_LAST_ATTEMPT_MISMATCH = "effect_last_attempt_mismatch"  # latest attempt vs effect
    EFFECT_NODE_ATTEMPT_OTHER_RUN = "effect_node_attempt_other_run"  # attempt of another run
    EFFECT_INTERRUPTED_NOT_IDEMPOTENT = "effect_interrupted_not_idempotent"  # re-applied blindly
    EFFECT_RECOVERY_UNRECORDED = "effect_recovery_unrecorded"  # no effect_recovered event
    RESERVATION_MISMATCH = "reservation_mismatch"  # session reserved iff nonterminal
    BLOB_DIGEST_MISMATCH = "blob_digest_mismatch"
    VIEW_CONTENT_DIGEST_MISMATCH = "view_content_digest_mismatch"


@dataclass(frozen=True, slots=True)
class Finding:
    """One inconsistency. `detail` names rows and states only: no payloads or tokens."""

    code: FindingCode
    run_id: str | None
    detail: str


# Checks that are one query each, returning (run_id, detail) rows.
_SQL_CHECKS: tuple[tuple[FindingCode, str], ...] = (
    (FindingCode.RUN_WITHOUT_QUEUE, q.CHECK_RUNS_WITHOUT_QUEUE),
    (FindingCode.CLAIMED_WITHOUT_LEASE, q.CHECK_CLAIMED_QUEUE_WITHOUT_LEASE),
    (FindingCode.TERMINAL_LEASE, q.CHECK_TERMINAL_RUNS_WITH_LEASE),
    (FindingCode.LEASE_GENERATION, q.CHECK_LEASE_GENERATION),
    (FindingCode.MULTIPLE_ACTIVE_RUNNERS, q.CHECK_TWO_ACTIVE_RUNNERS),
    (FindingCode.EVENT_REVISION_GAP, q.CHECK_EVENT_REVISION_GAPS),
    (FindingCode.RUN_REVISION_MISMATCH, q.CHECK_RUN_REVISION_MATCHES_EVENTS),
    (FindingCode.FINISHED_AT_MISMATCH, q.CHECK_FINISHED_AT),
    (FindingCode.TERMINAL_PAUSED, q.CHECK_TERMINAL_PAUSED),
    (FindingCode.TERMINAL_UNFINISHED_ATTEMPT, q.CHECK_TERMINAL_UNFINISHED_ATTEMPTS),
    (FindingCode.MULTIPLE_UNFINISHED_ATTEMPTS, q.CHECK_MULTIPLE_UNFINISHED_ATTEMPTS),
    (FindingCode.RUNNING_ATTEMPT_WITHOUT_RUNNER, q.CHECK_RUNNING_ATTEMPT_WITHOUT_RUNNER),
    (FindingCode.TERMINAL_PENDING_STEP_MESSAGE, q.CHECK_TERMINAL_PENDING_STEP_MESSAGES),
    (FindingCode.DUPLICATE_PENDING_STEP_MESSAGE, q.CHECK_DUPLICATE_PENDING_STEP_MESSAGES),
    (FindingCode.TERMINAL_PENDING_REQUEST, q.CHECK_TERMINAL_PENDING_REQUESTS),
    (FindingCode.TERMINAL_PENDING_DECISION, q.CHECK_TERMINAL_PENDING_DECISIONS),
    (FindingCode.DECISION_RESOLUTION_MISMATCH, q.CHECK_DECISION_RESOLUTIONS),
    (FindingCode.TERMINAL_UNSETTLED_EFFECT, q.CHECK_TERMINAL_UNSETTLED_EFFECTS),
    (FindingCode.EFFECT_APPLIED_TWICE, q.CHECK_EFFECT_APPLIED_TWICE),
    (FindingCode.EFFECT_STATE_MISMATCH, q.CHECK_EFFECT_STATE_MISMATCH),
    (FindingCode.EFFECT_ATTEMPT_NUMBERING, q.CHECK_EFFECT_ATTEMPT_NUMBERING),
    (FindingCode.EFFECT_LAST_ATTEMPT_MISMATCH, q.CHECK_EFFECT_LAST_ATTEMPT),
    (FindingCode.EFFECT_NODE_ATTEMPT_OTHER_RUN, q.CHECK_EFFECT_NODE_ATTEMPT_RUN),
    (FindingCode.EFFECT_INTERRUPTED_NOT_IDEMPOTENT, q.CHECK_EFFECT_INTERRUPTED_NOT_IDEMPOTENT),
    (FindingCode.EFFECT_RECOVERY_UNRECORDED, q.CHECK_EFFECT_RECOVERY_UNRECORDED),
    (FindingCode.RESERVATION_MISMATCH, q.CHECK_RESERVATIONS),
)

# What a check may raise on a broken database: SQLite errors, and value or type
# surprises from rows that a corrupt file or a hand edit left behind.
_BROKEN = (sqlite3.Error, ValueError, TypeError, UnicodeDecodeError)


@cache
def _expected_tables() -> frozenset[str]:
    conn = sqlite3.connect(":memory:")
    try:
        for statement in ddl_statements():
            conn.execute(statement)
        return frozenset(row[0] for row in conn.execute(q.SELECT_TABLE_NAMES))
    finally:
        conn.close()


def _failed(check: str, exc: BaseException) -> Finding:
    return Finding(FindingCode.CHECK_FAILED, None, f"{check}: {type(exc).__name__}: {exc}")


def _integrity(conn: sqlite3.Connection) -> Iterator[Finding]:
    for (message,) in conn.execute(q.PRAGMA_INTEGRITY_CHECK):
        if message != "ok":
            yield Finding(FindingCode.INTEGRITY, None, str(message))


def _schema(conn: sqlite3.Connection) -> Iterator[Finding]:
    present = {row[0] for row in conn.execute(q.SELECT_TABLE_NAMES)}
    for table in sorted(_expected_tables() - present):
        yield Finding(FindingCode.MISSING_TABLE, None, table)
    if "schema_info" in present:
        row = conn.execute(q.SELECT_SCHEMA_INFO).fetchone()
        if row is None or tuple(row) != (SCHEMA_NAME, SCHEMA_VERSION, DDL_DIGEST):
            found = "no schema record" if row is None else f"{row[0]} v{row[1]} {row[2]}"
            yield Finding(FindingCode.SCHEMA_MISMATCH, None, found)


def _foreign_keys(conn: sqlite3.Connection) -> Iterator[Finding]:
    for table, rowid, parent, fkid in conn.execute(q.PRAGMA_FOREIGN_KEY_CHECK):
        yield Finding(
            FindingCode.FOREIGN_KEY, None, f"{table} row {rowid} -> {parent} (key {fkid})"
        )


def _lifecycle_pairs(conn: sqlite3.Connection) -> Iterator[Finding]:
    for run_id, status, state in conn.execute(q.CHECK_RUN_QUEUE_PAIRS):
        if phase_of(status, state) is not None:
            continue
        code = (
            FindingCode.TERMINAL_LIVE_QUEUE
            if status in _TERMINAL and state in _LIVE_QUEUE
            else FindingCode.RUN_QUEUE_MISMATCH
        )
        yield Finding(code, run_id, f"run {status}, queue {state}")


VERIFY_PART_BYTES = 1024 * 1024
"""Content is hashed in parts of this size, so one large blob never sits in memory whole."""


def _digests(conn: sqlite3.Connection) -> Iterator[Finding]:
    for row_id, digest, byte_length, is_blob, length in conn.execute(q.SELECT_BLOB_CONTENTS):
        stored = _Stored(digest, byte_length, length if is_blob else None)
        if not _matches(conn, "blobs", row_id, stored):
            yield Finding(FindingCode.BLOB_DIGEST_MISMATCH, None, str(digest))
    for row in conn.execute(q.SELECT_VIEW_CONTENTS):
        row_id, run_id, digest, media_type, byte_length, is_blob, length = row
        stored = _Stored(digest, byte_length, length if is_blob else None)
        if not _matches(conn, "run_view_content", row_id, stored):
            yield Finding(
                FindingCode.VIEW_CONTENT_DIGEST_MISMATCH, run_id, f"{digest} {media_type}"
            )


@dataclass(frozen=True, slots=True)
class _Stored:
    """What a content row claims about its bytes, and their real length."""

    digest: object
    byte_length: object
    length: int | None
    """None when the stored value is not a blob at all."""


def _matches(conn: sqlite3.Connection, table: str, row_id: int, stored: _Stored) -> bool:
    """The stored length and digest match the bytes, hashed part by part."""
    if stored.length is None or stored.byte_length != stored.length:
        return False
    hasher = hashlib.sha256()
    sql = SELECT_CONTENT_PART[table]
    for start in range(1, stored.length + 1, VERIFY_PART_BYTES):
        part = conn.execute(sql, {"start": start, "length": VERIFY_PART_BYTES, "row_id": row_id})
        hasher.update(part.fetchone()[0])
    return stored.digest == "sha256:" + hasher.hexdigest()


def _sql_check(conn: sqlite3.Connection, code: FindingCode, sql: str) -> Iterator[Finding]:
    for run_id, detail in conn.execute(sql):
        yield Finding(code, run_id, str(detail))


def _run_check(name: str, checks: Iterator[Finding]) -> list[Finding]:
    found: list[Finding] = []
    try:
        for finding in checks:
            found.append(finding)
            if len(found) >= _MAX_PER_CHECK:
                break
    except _BROKEN as exc:
        found.append(_failed(name, exc))
    return found


def verify(source: Database | sqlite3.Connection) -> list[Finding]:
    """Check every invariant of the state database and return the findings.

    Runs `PRAGMA integrity_check`, the schema record and table presence, `PRAGMA
    foreign_key_check`, the lifecycle pair of every run, the claim, runner, event,
    attempt, message, request, decision, effect and reservation invariants, and the
    digest of every blob and view content row. Time-independent: an expired claim on
    a running row is a recoverable state, not a finding.

    **Blocking:** reads the whole database; run it while the server is otherwise idle.

    Returns:
        The findings, grouped by check; empty for a consistent database. Never raises
        for a broken database: a check that cannot run yields `check_failed`.
    """
    conn = source.connection if isinstance(source, Database) else source
    findings = _run_check("integrity_check", _integrity(conn))
    if any(f.code is FindingCode.CHECK_FAILED for f in findings):
        return findings  # not a readable database: every other check would fail the same
    findings += _run_check("schema", _schema(conn))
    findings += _run_check("foreign_key_check", _foreign_keys(conn))
    findings += _run_check("lifecycle_pairs", _lifecycle_pairs(conn))
    for code, sql in _SQL_CHECKS:
        findings += _run_check(code.value, _sql_check(conn, code, sql))
    findings += _run_check("content_digests", _digests(conn))
    return findings


def verify_backup(path: Path) -> list[Finding]:
    """Open an inactive backup read-only (`mode=ro`, `query_only`) and `verify` it.

    Never raises for a broken or missing file: that is a `check_failed` finding.
    """
    try:
        conn = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)
    except _BROKEN as exc:
        return [_failed("open", exc)]
    try:
        conn.execute(q.PRAGMA_QUERY_ONLY)
        return verify(conn)
    except _BROKEN as exc:
        return [_failed("open", exc)]
    finally:
        conn.close()


def verify_copy(path: Path) -> list[Finding]:
    """Check that a fresh backup copy is a sound database of this schema, read-only:
    `PRAGMA integrity_check`, every table present, and the schema record with its DDL
    digest. The invariants between rows are the live database's (the copy has the same
    pages); `verify_backup` (`state verify BACKUP`) checks those too.

    Never raises for a broken or missing file: that is a `check_failed` finding.
    """
    try:
        conn = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)
    except _BROKEN as exc:
        return [_failed("open", exc)]
    try:
        conn.execute(q.PRAGMA_QUERY_ONLY)
        findings = _run_check("integrity_check", _integrity(conn))
        if any(f.code is FindingCode.CHECK_FAILED for f in findings):
            return findings
        return findings + _run_check("schema", _schema(conn))
    except _BROKEN as exc:
        return [_failed("open", exc)]
    finally:
        conn.close()
