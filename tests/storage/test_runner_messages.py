"""Runner-facing storage: message receipts (adopt, conflict, cascade), node outputs and
routes, the resume state a new runner continues from, and runner-outcome parking."""

from __future__ import annotations

import sqlite3

import pytest

from pi_workflows.storage import (
    Claim,
    ClaimLostError,
    Database,
    EffectDecision,
    FailureClass,
    InvalidTransitionError,
    ManualClock,
    ParkReason,
    RunnerMessageConflictError,
    RunnerOutcome,
    RunNotFoundError,
    RunPhase,
    acquire_claim,
    claim_for_launch,
    declare_effect_ambiguous,
    fail_node_attempt,
    fail_run,
    finish_node_attempt,
    get_phase,
    get_queue_row,
    list_attempts,
    list_events,
    lookup_runner_reply,
    mark_runner_live,
    park_run,
    put_json_blob,
    read_json_blob,
    read_resume_state,
    record_runner_exit,
    record_runner_reply,
    requeue_run,
    reserve_effect,
    resume_run,
    runner_made_progress,
    runner_message_fingerprint,
    start_node_attempt,
    verify,
    wait_run,
)
from tests.storage.storage_helpers import enqueue, launch, running

MESSAGE = {
    "schema": "pi-workflows.worker-launch.v1",
    "kind": "node.started",
    "runId": "run-1",
    "generation": 1,
    "runnerEpoch": "run-1-e1",
    "attemptId": "a1",
    "expectedRevision": 3,
    "messageId": "m-1",
    "payload": {"nodePath": "n", "nodeKind": "compute", "visit": 1},
}
REPLY = {"kind": "reply", "replyTo": "m-1", "outcome": "accepted", "revision": 4}


# --- Runner message receipts --------------------------------------------------------


def test_a_retried_message_gets_the_stored_reply(db: Database) -> None:
    claim = running(db)
    fingerprint = runner_message_fingerprint(MESSAGE)
    assert fingerprint == runner_message_fingerprint(dict(reversed(MESSAGE.items())))
    with db.write() as tx:
        assert lookup_runner_reply(tx, "run-1-e1", "m-1", fingerprint) is None
        start_node_attempt(tx, claim, attempt_id="a1", node_path="n", node_type="compute")
        record_runner_reply(tx, "run-1-e1", "m-1", "node.started", fingerprint, REPLY)
    assert lookup_runner_reply(db, "run-1-e1", "m-1", fingerprint) == REPLY
    # The same message ID under another runner epoch is another message.
    assert lookup_runner_reply(db, "run-1-e2", "m-1", fingerprint) is None
    assert verify(db) == []


def test_a_message_id_reused_for_another_message_conflicts(db: Database) -> None:
    running(db)
    fingerprint = runner_message_fingerprint(MESSAGE)
    with db.write() as tx:
        record_runner_reply(tx, "run-1-e1", "m-1", "node.started", fingerprint, REPLY)
    changed = runner_message_fingerprint({**MESSAGE, "expectedRevision": 4})
    with pytest.raises(RunnerMessageConflictError) as caught:
        lookup_runner_reply(db, "run-1-e1", "m-1", changed)
    assert (caught.value.runner_epoch, caught.value.message_id) == ("run-1-e1", "m-1")
    with db.write() as tx:
        changes = tx.connection.total_changes
        with pytest.raises(RunnerMessageConflictError):
            record_runner_reply(tx, "run-1-e1", "m-1", "node.started", fingerprint, REPLY)
        assert tx.connection.total_changes == changes


def test_replies_need_a_known_epoch_and_a_body(db: Database) -> None:
    running(db)
    with pytest.raises(InvalidTransitionError), db.write() as tx:
        record_runner_reply(tx, "ghost", "m-1", "node.started", "sha256:f", REPLY)
    with pytest.raises(ValueError, match="null"), db.write() as tx:
        record_runner_reply(tx, "run-1-e1", "m-1", "node.started", "sha256:f", None)


def test_replies_are_deleted_with_their_run(db: Database) -> None:
    running(db)
    with db.write() as tx:
        record_runner_reply(tx, "run-1-e1", "m-1", "node.started", "sha256:f", REPLY)
    with db.write() as tx:
        tx.execute("DELETE FROM runs WHERE run_id = 'run-1'")
    assert db.fetch_value("SELECT count(*) FROM runner_messages", {}) == 0
    assert verify(db) == []


# --- Node outputs and routes --------------------------------------------------------


def test_finish_stores_the_output_as_a_blob_and_the_route(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id="a1", node_path="n", node_type="compute")
        finish_node_attempt(tx, claim, attempt_id="a1", output={"n": 2}, next_node_path="m")
        start_node_attempt(tx, claim, attempt_id="a2", node_path="m", node_type="compute")
        with pytest.raises(ValueError, match="not both"):
            finish_node_attempt(tx, claim, attempt_id="a2", output=1, output_hash="sha256:x")
        finish_node_attempt(tx, claim, attempt_id="a2", output=None)
    first, second = list_attempts(db, "run-1")
    assert first.output_hash is not None and read_json_blob(db, first.output_hash) == {"n": 2}
    assert first.next_node_path == "m"
    assert second.output_hash is not None and read_json_blob(db, second.output_hash) is None
    assert second.next_node_path is None
    finished = [e for e in list_events(db, "run-1") if e.event_type == "node_finished"]
    assert '"nextNodePath":"m"' in finished[0].payload
    assert verify(db) == []


def test_a_route_is_only_recorded_on_a_finished_attempt(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id="a1", node_path="n", node_type="compute")
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"), db.write() as tx:
        tx.execute("UPDATE node_attempts SET next_node_path = 'x' WHERE attempt_id = 'a1'")


# --- Resume state -------------------------------------------------------------------


def _relaunch(db: Database, epoch: str) -> Claim:
    with db.write() as tx:
        launched = claim_for_launch(
            tx, "run-1", owner_id="srv", runner_epoch=epoch, launch_envelope_hash="h"
        )
        mark_runner_live(tx, launched.claim, runner_epoch=epoch, pid=3, process_start_time=3)
    return launched.claim


def test_resume_state_of_a_fresh_run(db: Database) -> None:
    claim = running(db)
    state = read_resume_state(db, "run-1")
    assert state.input == {"topic": "private input"}
    assert (state.outputs, state.visits, state.finished, state.unfinished) == ({}, {}, (), None)
    assert state.completed == ()
    assert state.last_completed_node_path is None and state.next_node_path is None
    assert state.next_visit("a") == 1
    assert state.revision == 3
    with pytest.raises(RunNotFoundError):
        read_resume_state(db, "absent")
    del claim


def test_resume_state_after_a_loop_a_failure_and_a_crash(db: Database) -> None:
    """a → b → a (visit 2) → c fails, routed to b (visit 2) → runner dies in b."""
    claim = running(db)
    with db.write() as tx:
        steps = [
            ("a1", "a", {"i": 1}, "b"),
            ("b1", "b", {"j": 1}, "a"),
            ("a2", "a", {"i": 2}, "c"),
        ]
        for attempt_id, path, output, route in steps:
            start_node_attempt(tx, claim, attempt_id=attempt_id, node_path=path, node_type="x")
            finish_node_attempt(
                tx, claim, attempt_id=attempt_id, output=output, next_node_path=route
            )
        start_node_attempt(tx, claim, attempt_id="c1", node_path="c", node_type="x")
        fail_node_attempt(tx, claim, attempt_id="c1", error="boom", next_node_path="b")
        start_node_attempt(tx, claim, attempt_id="b2", node_path="b", node_type="x")
        record_runner_exit(tx, "run-1-e1", outcome=RunnerOutcome.CRASHED, signal=9)
        requeue_run(tx, "run-1", reason="workerCrashed", claim=claim)
    state = read_resume_state(db, "run-1")
    assert state.outputs == {"a": {"i": 2}, "b": {"j": 1}}
    assert state.visits == {"a": 2, "b": 1, "c": 1}
    assert [(f.attempt_id, f.visit, f.status) for f in state.finished] == [
        ("a1", 1, "completed"),
        ("b1", 1, "completed"),
        ("a2", 2, "completed"),
        ("c1", 1, "failed"),
    ]
    assert [f.node_path for f in state.completed] == ["a", "b", "a"]
    assert state.last_completed_node_path == "a"
    assert state.next_node_path == "b"  # the failure's route
    assert state.unfinished is None  # b2 was interrupted and runs again
    assert state.next_visit("b") == 2
    # The next runner re-runs b at the same visit, and sees it as unfinished.
    claim2 = _relaunch(db, "run-1-e2")
    with db.write() as tx:
        rerun = start_node_attempt(tx, claim2, attempt_id="b3", node_path="b", node_type="x")
    assert rerun.visit == 2
    current = read_resume_state(db, "run-1").unfinished
    assert current is not None
    assert (current.attempt_id, current.node_path, current.visit, current.status) == (
        "b3",
        "b",
        2,
        "running",
    )
    wire = read_resume_state(db, "run-1").to_wire()
    assert wire["nextNodePath"] == "b" and wire["unfinished"]["attemptId"] == "b3"
    assert wire["outputs"]["a"] == {"i": 2}
    assert verify(db) == []


def test_resume_state_of_a_waiting_attempt_and_an_output_given_by_hash(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id="a1", node_path="a", node_type="x")
        digest = put_json_blob(tx, [1, 2])
        finish_node_attempt(tx, claim, attempt_id="a1", output_hash=digest, next_node_path="ask")
        start_node_attempt(tx, claim, attempt_id="q1", node_path="ask", node_type="checkpoint")
        wait_run(tx, claim, reason="checkpoint", attempt_id="q1")
    state = read_resume_state(db, "run-1")
    assert state.outputs == {"a": [1, 2]}
    assert state.unfinished is not None and state.unfinished.status == "waiting"
    assert state.next_node_path == "ask"


# --- Runner outcomes: record the exit, then requeue, park or fail -------------------


def test_a_runner_without_progress_parks_and_waits_for_resume(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        assert runner_made_progress(tx, "run-1-e1") is False
        record_runner_exit(tx, "run-1-e1", outcome=RunnerOutcome.CRASHED, exit_code=1)
        park_run(tx, claim, reason=ParkReason.RUNNER_NO_PROGRESS, detail="exit code 1")
    queue = get_queue_row(db, "run-1")
    assert queue is not None and (queue.state, queue.park_reason) == ("parked", "runnerNoProgress")
    assert '"detail":"exit code 1"' in list_events(db, "run-1")[-1].payload
    with db.write() as tx:
        resume_run(tx, "run-1")
    assert get_phase(db, "run-1") is RunPhase.QUEUED
    assert verify(db) == []


def test_a_runner_that_never_became_ready_made_no_progress(db: Database) -> None:
    enqueue(db)
    claim = launch(db, epoch="run-1-e1")
    with db.write() as tx:
        assert runner_made_progress(tx, "run-1-e1") is False
        record_runner_exit(tx, "run-1-e1", outcome=RunnerOutcome.TIMED_OUT)
        park_run(tx, claim, reason=ParkReason.RUNNER_NO_PROGRESS)
    assert get_phase(db, "run-1") is RunPhase.PARKED
    with pytest.raises(InvalidTransitionError):
        runner_made_progress(db, "ghost")


def test_a_runner_with_progress_is_requeued(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id="a1", node_path="a", node_type="x")
        assert runner_made_progress(tx, "run-1-e1") is True
        record_runner_exit(tx, "run-1-e1", outcome=RunnerOutcome.CRASHED, signal=9)
        requeue_run(tx, "run-1", reason="workerCrashed", claim=claim)
    assert get_phase(db, "run-1") is RunPhase.QUEUED
    assert verify(db) == []


def test_an_ambiguous_effect_parks_the_run_after_an_expired_claim(
    db: Database, clock: ManualClock
) -> None:
    stale = running(db)
    with db.write() as tx:
        start_node_attempt(tx, stale, attempt_id="a1", node_path="pay", node_type="action")
        reserve_effect(
            tx, stale, attempt_id="a1", effect_type="pay", idempotency_key="k",
            request={}, executor_epoch="run-1-e1",
        )  # fmt: skip
    clock.advance(60_000)  # the runner and the server both died; the claim expired
    with db.write() as tx:
        record_runner_exit(tx, "run-1-e1", outcome=RunnerOutcome.ORPHANED)
        control = acquire_claim(tx, "run-1", owner_type="control", owner_id="recovery")
        declare_effect_ambiguous(tx, control, idempotency_key="k", reason="runner lost")
        park_run(tx, control, reason=ParkReason.EFFECT_AMBIGUOUS)
    with pytest.raises(ClaimLostError), db.write() as tx:
        park_run(tx, stale, reason="late")
    queue = get_queue_row(db, "run-1")
    assert queue is not None and queue.park_reason == "effectAmbiguous"
    # An explicit resume runs again, and the reservation answers `ambiguous` again.
    with db.write() as tx:
        resume_run(tx, "run-1")
    claim = _relaunch(db, "run-1-e2")
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id="a2", node_path="pay", node_type="action")
        again = reserve_effect(
            tx, claim, attempt_id="a2", effect_type="pay", idempotency_key="k",
            request={}, executor_epoch="run-1-e2",
        )  # fmt: skip
        assert again.decision is EffectDecision.AMBIGUOUS
        fail_run(tx, "run-1", claim=claim, failure_class=FailureClass.EFFECT_AMBIGUOUS, reason="k")
    assert get_phase(db, "run-1") is RunPhase.FAILED
    assert verify(db) == []


def test_a_changed_workflow_source_parks_the_run(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        park_run(tx, claim, reason=ParkReason.WORKFLOW_SOURCE_CHANGED)
        record_runner_exit(tx, "run-1-e1", outcome=RunnerOutcome.EXITED, exit_code=0)
    queue = get_queue_row(db, "run-1")
    assert queue is not None and queue.park_reason == "workflowSourceChanged"
    assert verify(db) == []
