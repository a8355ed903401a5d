"""Interactive requests and submissions: binding and kind first, adoption, settlement."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from pi_workflows.storage import Claim, ClaimLostError, Database, put_blob, start_node_attempt
from pi_workflows.storage._interactions import (
    read_request,
    record_submission,
    record_unproductive_turn,
    request_interaction,
    settle_submission,
    submission_receipt,
    submission_value,
    validating_submissions,
)
from tests.storage.storage_helpers import raw_edit, running

CONTRACT = {"outputSchema": {"type": "object"}}


def _agent_request(db: Database, claim: Claim) -> None:
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id="a1", node_path="ask", node_type="agent")
        request_interaction(
            tx, claim, attempt_id="a1", request_id="req-1", kind="agent", contract=CONTRACT
        )


def _submit(db: Database, key: str, value: object, sid: str) -> str:
    with db.write() as tx:
        return record_submission(
            tx, request_id="req-1", submission_id=sid, idempotency_key=key, value=value
        ).status


def test_new_submission_validates_then_accepting_settles_the_request(db: Database) -> None:
    claim = running(db)
    _agent_request(db, claim)
    assert _submit(db, "k1", {"x": 1}, "s1") == "new"
    assert [s.submission_id for s in validating_submissions(db)] == ["s1"]
    assert _submit(db, "k2", {"x": 2}, "s2") == "rejected"  # one validating at a time
    with db.write() as tx:
        row = settle_submission(tx, submission_id="s1", accepted=True)
    assert row.outcome == "accepted"
    request = read_request(db, "req-1")
    assert request is not None
    assert (request.status, request.accepted_submission_id) == ("settled", "s1")
    assert _submit(db, "k1", {"x": 1}, "s9") == "adopted"
    assert _submit(db, "k1", {"x": 3}, "s9") == "conflict"
    assert _submit(db, "k3", {"x": 1}, "s3") == "claimLost"  # settled: nothing accepted twice


def test_a_rejection_keeps_the_request_pending_for_a_corrected_retry(db: Database) -> None:
    claim = running(db)
    _agent_request(db, claim)
    assert _submit(db, "k1", {"x": "bad"}, "s1") == "new"
    error = {"code": "invalidOutput", "message": "x must be an integer"}
    with db.write() as tx:
        row = settle_submission(tx, submission_id="s1", accepted=False, error=error)
    assert submission_receipt(db, row) == {
        "submissionId": "s1",
        "outcome": "rejected",
        "error": error,
    }
    assert _submit(db, "k1", {"x": "bad"}, "s1b") == "adopted"
    assert _submit(db, "k2", {"x": 1}, "s2") == "new"


def test_binding_and_kind_are_checked_before_receipt_lookup(db: Database) -> None:
    claim = running(db)
    _agent_request(db, claim)
    assert _submit(db, "k1", {"x": 1}, "s1") == "new"
    with db.write() as tx:
        wrong_kind = record_submission(
            tx,
            request_id="req-1",
            submission_id="s1",
            idempotency_key="k1",
            value={"x": 1},
            kind="checkpoint",
        )
        missing = record_submission(
            tx, request_id="nope", submission_id="s1", idempotency_key="k1", value={"x": 1}
        )
    assert (wrong_kind.status, missing.status) == ("rejected", "notFound")
    raw_edit(db, "UPDATE interactive_requests SET target_session_id = 'sess-1'")
    assert _submit(db, "k1", {"x": 1}, "s1") == "rejected"


def test_unproductive_turns_remind_twice_then_fail_and_keep_the_error(db: Database) -> None:
    claim = running(db)
    _agent_request(db, claim)
    outcomes = []
    for error in (None, "500 boom", None):
        with db.write() as tx:
            outcomes.append(record_unproductive_turn(tx, claim, request_id="req-1", error=error))
    assert [(o.count, o.fail) for o in outcomes] == [(1, False), (2, False), (3, True)]
    with db.write() as tx:
        record_unproductive_turn(tx, claim, request_id="req-1", error="x" * 5000)
    request = read_request(db, "req-1")
    assert request is not None and request.last_turn_error == "x" * 2048


def test_a_stale_claim_cannot_request(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id="a1", node_path="ask", node_type="agent")
    stale = replace(claim, token="not-the-token")
    with pytest.raises(ClaimLostError), db.write() as tx:
        request_interaction(
            tx, stale, attempt_id="a1", request_id="req-1", kind="agent", contract=CONTRACT
        )


def test_the_value_validate_returned_is_the_steps_and_events_name_no_value(db: Database) -> None:
    claim = running(db)
    _agent_request(db, claim)
    assert _submit(db, "k1", {"x": 1}, "s1") == "new"
    with db.write() as tx:
        row = settle_submission(tx, submission_id="s1", accepted=True, value={"x": 1, "ok": True})
    assert submission_value(db, row) == {"x": 1, "ok": True}
    events = db.fetch_all(
        "SELECT event_type, payload FROM events WHERE event_type LIKE 'interaction_sub%' "
        "ORDER BY revision",
        {},
        _Event,
    )
    assert [e.event_type for e in events] == [
        "interaction_submitted",
        "interaction_submission_settled",
    ]
    assert all('"x"' not in e.payload for e in events)


def test_a_stale_attempt_or_a_pause_accepts_nothing(db: Database) -> None:
    claim = running(db)
    _agent_request(db, claim)
    assert _submit(db, "k1", {"x": 1}, "s1") == "new"
    raw_edit(db, "UPDATE runs SET paused = 1")
    with db.write() as tx:
        row = settle_submission(tx, submission_id="s1", accepted=True)
    assert row.outcome == "rejected"
    request = read_request(db, "req-1")
    assert request is not None and request.status == "pending"
    raw_edit(db, "UPDATE runs SET paused = 0")
    raw_edit(db, "UPDATE node_attempts SET status = 'interrupted', finished_at = 1")
    assert _submit(db, "k2", {"x": 1}, "s2") == "claimLost"
    assert _submit(db, "k1", {"x": 1}, "s1b") == "adopted", "a repeat still gets its outcome"


@dataclass(frozen=True)
class _Event:
    event_type: str
    payload: str


def _blob_count(db: Database) -> int:
    return int(db.fetch_value("SELECT count(*) FROM blobs", {}))


def test_a_refused_submission_stores_no_blob_whatever_the_reason(db: Database) -> None:
    """Busy, conflict, paused, stale attempt, settled: each refusal is decided before
    the payload is stored (issue 25, item 4); only a recorded candidate stores it."""
    claim = running(db)
    _agent_request(db, claim)
    assert _submit(db, "k1", {"x": 1}, "s1") == "new"
    base = _blob_count(db)
    assert _submit(db, "k2", {"refused": "busy"}, "s2") == "rejected"
    assert _submit(db, "k1", {"refused": "conflict"}, "s3") == "conflict"
    with db.write() as tx:
        settle_submission(
            tx, submission_id="s1", accepted=False, error={"code": "c", "message": "m"}
        )
    after_settle = _blob_count(db)  # the rejection's receipt
    raw_edit(db, "UPDATE runs SET paused = 1")
    assert _submit(db, "k4", {"refused": "paused"}, "s4") == "rejected"
    raw_edit(db, "UPDATE runs SET paused = 0")
    assert _submit(db, "k5", {"x": 5}, "s5") == "new"
    with db.write() as tx:
        settle_submission(tx, submission_id="s5", accepted=True)
    accepted = _blob_count(db)
    assert _submit(db, "k6", {"refused": "settled"}, "s6") == "claimLost"
    assert _submit(db, "k5", {"x": 5}, "s5b") == "adopted"
    assert _blob_count(db) == accepted
    assert after_settle == base + 1
    assert accepted == after_settle + 2, "the accepted candidate's payload and its receipt"
    [(count,)] = db.connection.execute(
        "SELECT count(*) FROM blobs WHERE content LIKE '%refused%'"
    ).fetchall()
    assert count == 0


def test_an_undoable_part_leaves_nothing_when_it_raises(db: Database) -> None:
    """A refused command's change is undone alone; the transaction goes on and commits."""
    with db.write() as tx:
        with pytest.raises(ValueError), tx.undoable():
            put_blob(tx, b"a definition snapshot of a refused start")
            raise ValueError("refused")
        kept = put_blob(tx, b"the refusal's receipt")
    assert _blob_count(db) == 1
    assert db.fetch_value("SELECT digest FROM blobs", {}) == kept
