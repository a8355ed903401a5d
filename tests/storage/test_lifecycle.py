"""The run lifecycle: the whole transition table walked on a real database, and the
consistency each transition keeps across runs, queue, attempts, leases and events."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from pi_workflows.storage import (
    TRANSITIONS,
    Claim,
    ClaimHeldError,
    ClaimLostError,
    ClaimLostReason,
    Database,
    FailureClass,
    InvalidTransitionError,
    ManualClock,
    QueueKind,
    RunnerOutcome,
    RunNotFoundError,
    RunPhase,
    Tx,
    acquire_claim,
    active_queue_count,
    admissible_runs,
    cancel_run,
    claim_for_launch,
    complete_run,
    expired_claimed_runs,
    fail_node_attempt,
    fail_run,
    finish_node_attempt,
    get_lease,
    get_phase,
    get_queue_row,
    get_run,
    get_run_summary,
    get_runner,
    is_transition_allowed,
    list_attempts,
    list_events,
    list_runs,
    mark_runner_live,
    park_run,
    pause_run,
    phase_of,
    put_blob,
    put_json_blob,
    record_runner_exit,
    requeue_run,
    resume_run,
    run_list_revision,
    run_view_revision,
    server_has_work,
    start_node_attempt,
    status_counts,
    time_out_run,
    verify,
    wait_run,
)
from tests.storage.storage_helpers import INTERACTIVE, drive_to, enqueue, launch, running

P = RunPhase

# The lifecycle table of workflow-server.md § Run lifecycle, written out independently.
EXPECTED: dict[RunPhase, set[RunPhase]] = {
    P.QUEUED: {P.STARTING, P.QUEUED, P.FAILED, P.CANCELLED},
    P.STARTING: {P.RUNNING, P.PARKED, P.QUEUED, P.FAILED, P.CANCELLED},
    P.RUNNING: {
        P.RUNNING,
        P.PARKED,
        P.WAITING,
        P.QUEUED,
        P.COMPLETED,
        P.FAILED,
        P.TIMED_OUT,
        P.CANCELLED,
    },
    P.PARKED: {P.QUEUED, P.PARKED, P.FAILED, P.CANCELLED},
    P.WAITING: {P.QUEUED, P.WAITING, P.COMPLETED, P.FAILED, P.TIMED_OUT, P.CANCELLED},
    P.COMPLETED: set(),
    P.FAILED: set(),
    P.TIMED_OUT: set(),
    P.CANCELLED: set(),
}

PAIRS = list(itertools.product(RunPhase, RunPhase))


def test_phase_projection_matches_the_design_table() -> None:
    rows = {(p.run_status.value, p.queue_state.value, p.holds_claim) for p in RunPhase}
    assert rows == {
        ("queued", "queued", False),
        ("running", "starting", True),
        ("running", "running", True),
        ("running", "parked", False),
        ("waiting", "parked", False),
        ("completed", "done", False),
        ("failed", "failed", False),
        ("timed_out", "failed", False),
        ("cancelled", "cancelled", False),
    }
    for phase in RunPhase:
        assert phase_of(phase.run_status, phase.queue_state) is phase
    assert phase_of("completed", "running") is None
    assert phase_of("bogus", "queued") is None


def test_transition_table_is_the_documented_one() -> None:
    assert {src: set(dst) for src, dst in TRANSITIONS.items()} == EXPECTED
    for src, dst in PAIRS:
        assert is_transition_allowed(src, dst) == (dst in EXPECTED[src])


def _operate(tx: Tx, src: RunPhase, dst: RunPhase, claim: Claim | None) -> Any:
    """Attempt the operation that leads to `dst`, with the run's claim or a control one."""
    run_id = "run-1"

    def need_claim() -> Claim:
        return claim or acquire_claim(tx, run_id, owner_type="control", owner_id="recovery")

    if dst is src and dst in (P.QUEUED, P.PARKED, P.WAITING):
        return pause_run(tx, run_id, claim=claim)
    if dst is P.QUEUED:
        return requeue_run(tx, run_id, reason="test", claim=claim)
    if dst is P.STARTING:
        return claim_for_launch(
            tx, run_id, owner_id="srv", runner_epoch="e2", launch_envelope_hash="h"
        )
    if dst is P.RUNNING and src is P.RUNNING:
        return start_node_attempt(
            tx, need_claim(), attempt_id="a-walk", node_path="n", node_type="compute"
        )
    if dst is P.RUNNING:
        return mark_runner_live(
            tx, need_claim(), runner_epoch="run-1-e1", pid=1, process_start_time=1
        )
    if dst is P.PARKED:
        return park_run(tx, need_claim(), reason="test")
    if dst is P.WAITING:
        return wait_run(tx, need_claim(), reason="checkpoint")
    if dst is P.COMPLETED:
        return complete_run(tx, run_id, claim=claim)
    if dst is P.FAILED:
        return fail_run(tx, run_id, claim=claim, failure_class=FailureClass.NODE_FAILED, reason="x")
    if dst is P.TIMED_OUT:
        return time_out_run(tx, run_id, claim=claim, reason="x")
    return cancel_run(tx, run_id, claim=claim)


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{s}->{d}" for s, d in PAIRS])
def test_walk_every_pair_of_the_transition_table(
    db: Database, src: RunPhase, dst: RunPhase
) -> None:
    claim = drive_to(db, src)
    assert get_phase(db, "run-1") is src
    before = get_run(db, "run-1")
    assert before is not None
    if dst not in EXPECTED[src]:
        with pytest.raises(InvalidTransitionError), db.write() as tx:
            _operate(tx, src, dst, claim)
        assert get_run(db, "run-1") == before  # refused: nothing changed
        assert get_phase(db, "run-1") is src
        return
    with db.write() as tx:
        _operate(tx, src, dst, claim)
    after = get_run(db, "run-1")
    assert after is not None
    assert get_phase(db, "run-1") is dst
    assert after.revision == before.revision + 1
    events = list_events(db, "run-1")
    assert [e.revision for e in events] == list(range(1, after.revision + 1))
    lease = get_lease(db, "run-1")
    assert (lease is not None) == dst.holds_claim
    assert verify(db) == []


def test_every_operation_appends_exactly_one_event(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id="a1", node_path="n", node_type="compute")
        finish_node_attempt(tx, claim, attempt_id="a1", payload={"delta": 1})
        park_run(tx, claim, reason="runnerNoProgress")
    types = [e.event_type for e in list_events(db, "run-1")]
    assert types == [
        "run_queued",
        "run_claimed",
        "runner_live",
        "node_started",
        "node_finished",
        "run_parked",
    ]


def test_claimed_phases_refuse_writes_without_the_claim(db: Database) -> None:
    drive_to(db, P.RUNNING)
    with pytest.raises(ClaimLostError) as caught, db.write() as tx:
        cancel_run(tx, "run-1")
    assert caught.value.reason is ClaimLostReason.MISSING_AUTHORITY


def test_expired_running_row_is_cancelled_through_a_new_control_claim(
    db: Database, clock: ManualClock
) -> None:
    stale = running(db)
    with pytest.raises(ClaimHeldError), db.write() as tx:
        acquire_claim(tx, "run-1", owner_type="control", owner_id="recovery")
    clock.advance(60_000)
    assert [row.run_id for row in expired_claimed_runs(db, clock.now_ms())] == ["run-1"]
    with db.write() as tx:
        control = acquire_claim(tx, "run-1", owner_type="control", owner_id="recovery")
        cancel_run(tx, "run-1", claim=control, reason="operator")
    assert get_phase(db, "run-1") is P.CANCELLED
    with pytest.raises(ClaimLostError) as caught, db.write() as tx:
        complete_run(tx, "run-1", claim=stale)
    assert caught.value.reason is ClaimLostReason.MISSING_AUTHORITY
    assert verify(db) == []


def test_stale_generation_cannot_write_a_terminal_event(db: Database, clock: ManualClock) -> None:
    stale = running(db)
    clock.advance(60_000)
    with db.write() as tx:
        control = acquire_claim(tx, "run-1", owner_type="control", owner_id="recovery")
    with pytest.raises(ClaimLostError) as caught, db.write() as tx:
        fail_run(tx, "run-1", claim=stale, failure_class=FailureClass.WORKER_CRASHED, reason="x")
    assert caught.value.reason is ClaimLostReason.GENERATION_CHANGED
    assert get_phase(db, "run-1") is P.RUNNING
    with db.write() as tx:
        requeue_run(tx, "run-1", reason="recovered", claim=control)
    assert get_phase(db, "run-1") is P.QUEUED


def test_node_attempts_visits_and_current_node(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        first = start_node_attempt(
            tx, claim, attempt_id="a1", node_path="loop/n", node_type="compute", deadline_at=99
        )
        with pytest.raises(InvalidTransitionError):
            start_node_attempt(tx, claim, attempt_id="a2", node_path="x", node_type="compute")
        finish_node_attempt(tx, claim, attempt_id="a1", output_hash=None)
        second = start_node_attempt(
            tx, claim, attempt_id="a2", node_path="loop/n", node_type="compute"
        )
        fail_node_attempt(tx, claim, attempt_id="a2", error="bad", timed_out=True)
        third = start_node_attempt(
            tx, claim, attempt_id="a3", node_path="loop/n", node_type="compute"
        )
        park_run(tx, claim, reason="crash")  # a crash rerun keeps its visit number
        record_runner_exit(tx, "run-1-e1", outcome=RunnerOutcome.CRASHED, signal=9)
    with db.write() as tx:
        requeue_run(tx, "run-1", reason="resume")
    claim2 = _launch_again(db)
    with db.write() as tx:
        rerun = start_node_attempt(
            tx, claim2, attempt_id="a4", node_path="loop/n", node_type="compute"
        )
    assert (first.visit, second.visit, third.visit, rerun.visit) == (1, 2, 3, 3)
    statuses = {a.attempt_id: a.status for a in list_attempts(db, "run-1")}
    assert statuses == {"a1": "completed", "a2": "timed_out", "a3": "interrupted", "a4": "running"}
    assert verify(db) == []


def _launch_again(db: Database, epoch: str = "run-1-e2") -> Claim:
    with db.write() as tx:
        launch = claim_for_launch(
            tx, "run-1", owner_id="srv", runner_epoch=epoch, launch_envelope_hash="h"
        )
        mark_runner_live(tx, launch.claim, runner_epoch=epoch, pid=2, process_start_time=2)
    return launch.claim


def test_runner_epochs_record_ready_revision_and_one_outcome(db: Database) -> None:
    claim = running(db)
    worker = get_runner(db, "run-1-e1")
    assert worker is not None and worker.status == "ready" and worker.ready_revision == 3
    with pytest.raises(InvalidTransitionError), db.write() as tx:
        claim_for_launch(tx, "run-1", owner_id="srv", runner_epoch="x", launch_envelope_hash="h")
    with db.write() as tx:
        park_run(tx, claim, reason="runnerNoProgress")
        done = record_runner_exit(tx, "run-1-e1", outcome=RunnerOutcome.EXITED, exit_code=0)
    assert done.status == "exited" and done.finished_at is not None
    with pytest.raises(InvalidTransitionError), db.write() as tx:
        record_runner_exit(tx, "run-1-e1", outcome=RunnerOutcome.CRASHED)
    with pytest.raises(ClaimLostError), db.write() as tx:  # parking released the claim
        mark_runner_live(tx, claim, runner_epoch="run-1-e1", pid=1, process_start_time=1)


def test_mark_runner_live_needs_this_generations_starting_epoch(db: Database) -> None:
    enqueue(db)
    with db.write() as tx:
        launch = claim_for_launch(
            tx, "run-1", owner_id="srv", runner_epoch="e1", launch_envelope_hash="h"
        )
    with pytest.raises(InvalidTransitionError), db.write() as tx:
        mark_runner_live(tx, launch.claim, runner_epoch="other", pid=1, process_start_time=1)


def test_pause_parks_and_releases_then_resume_requeues(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id="a1", node_path="n", node_type="compute")
        _add_step_message(tx, "m1", "req-1")
        pause_run(tx, "run-1", claim=claim)
    run, queue = get_run(db, "run-1"), get_queue_row(db, "run-1")
    assert run is not None and queue is not None
    assert (run.status, run.paused, queue.state, queue.park_reason) == (
        "running",
        1,
        "parked",
        "paused",
    )
    assert get_lease(db, "run-1") is None
    assert _message_state(db, "m1") == "cancelled"
    assert admissible_runs(db, QueueKind.WORKFLOW) == []
    with pytest.raises(InvalidTransitionError), db.write() as tx:
        pause_run(tx, "run-1")
    with pytest.raises(InvalidTransitionError), db.write() as tx:
        requeue_run(tx, "run-1", reason="not while paused")
    with db.write() as tx:
        resume_run(tx, "run-1")
    assert get_phase(db, "run-1") is P.QUEUED
    assert get_run(db, "run-1").paused == 0  # type: ignore[union-attr]
    assert [r.run_id for r in admissible_runs(db, QueueKind.WORKFLOW)] == ["run-1"]
    assert verify(db) == []


def test_pause_and_resume_of_a_waiting_run_keep_it_waiting(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        start_node_attempt(
            tx, claim, attempt_id="a1", node_path="ask", node_type="agent", deadline_at=10**13
        )
        wait_run(tx, claim, reason="interaction", attempt_id="a1")
        pause_run(tx, "run-1")
    assert get_phase(db, "run-1") is P.WAITING
    assert get_queue_row(db, "run-1").park_reason == "interaction"  # type: ignore[union-attr]
    assert list_attempts(db, "run-1")[0].status == "waiting"
    with db.write() as tx:
        resume_run(tx, "run-1")
    assert get_phase(db, "run-1") is P.WAITING and get_run(db, "run-1").paused == 0  # type: ignore[union-attr]
    with db.write() as tx:
        requeue_run(tx, "run-1", reason="accepted")  # the waiting attempt continues
    assert list_attempts(db, "run-1")[0].status == "waiting"
    assert verify(db) == []


def test_pause_of_a_queued_run_keeps_it_out_of_admission(db: Database) -> None:
    enqueue(db)
    with db.write() as tx:
        pause_run(tx, "run-1")
    assert get_phase(db, "run-1") is P.QUEUED
    assert admissible_runs(db, QueueKind.WORKFLOW) == []
    with pytest.raises(InvalidTransitionError), db.write() as tx:
        claim_for_launch(tx, "run-1", owner_id="s", runner_epoch="e", launch_envelope_hash="h")


def test_terminal_transition_settles_every_pending_fact(db: Database, clock: ManualClock) -> None:
    enqueue(db, **INTERACTIVE)
    claim = launch(db, epoch="run-1-e1")
    with db.write() as tx:
        mark_runner_live(tx, claim, runner_epoch="run-1-e1", pid=1, process_start_time=1)
        start_node_attempt(tx, claim, attempt_id="a1", node_path="n", node_type="agent")
        _seed_pending_work(tx)
        cancel_run(tx, "run-1", claim=claim, reason="user")
    conn = db.connection
    assert conn.execute("SELECT status FROM node_attempts").fetchall() == [("cancelled",)]
    assert dict(conn.execute("SELECT effect_id, state FROM effects")) == {
        "e-pending": "cancelled",
        "e-applying": "ambiguous",
        "e-applied": "applied",
    }
    assert conn.execute(
        "SELECT state FROM effect_attempts WHERE effect_id = 'e-applying'"
    ).fetchall() == [("ambiguous",)]
    assert conn.execute("SELECT status FROM interactive_requests").fetchall() == [("cancelled",)]
    assert conn.execute("SELECT status FROM human_decisions").fetchall() == [("cancelled",)]
    assert conn.execute("SELECT outcome FROM human_decision_resolutions").fetchall() == [
        ("cancelled",)
    ]
    assert dict(
        conn.execute("SELECT message_id, state FROM workflow_messages WHERE kind != 'terminal'")
    ) == {
        "m-step": "cancelled",
        "m-follow": "cancelled",
        "m-note": "pending",
    }
    # The interactive run is its chain's final leaf: one pending terminal message.
    assert conn.execute(
        "SELECT source_id, state FROM workflow_messages WHERE kind = 'terminal'"
    ).fetchall() == [("run-1", "pending")]
    assert conn.execute("SELECT reserved FROM run_bindings").fetchall() == [(0,)]
    run = get_run(db, "run-1")
    assert run is not None and run.finished_at == clock.now_ms() and run.paused == 0
    assert get_lease(db, "run-1") is None
    assert verify(db) == []


def test_completion_keeps_follow_ups_and_failure_records_its_class(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        _add_message(tx, "m-follow", "follow_up", None, "f1")
        complete_run(tx, "run-1", claim=claim)
    assert _message_state(db, "m-follow") == "pending"
    enqueue(db, "run-2")
    with db.write() as tx:
        fail_run(tx, "run-2", failure_class=FailureClass.SOURCE_CHANGED, reason="source moved")
    run = get_run(db, "run-2")
    assert run is not None and (run.status, run.failure_class, run.failure_reason) == (
        "failed",
        "sourceChanged",
        "source moved",
    )
    assert get_queue_row(db, "run-2").state == "failed"  # type: ignore[union-attr]


def test_origin_session_reservation_is_exclusive_until_terminal(db: Database) -> None:
    enqueue(db, "run-1", **INTERACTIVE)
    with pytest.raises(InvalidTransitionError, match="session reserved"):
        enqueue(db, "run-2", **INTERACTIVE)
    with db.write() as tx:
        cancel_run(tx, "run-1")
    enqueue(db, "run-2", **INTERACTIVE)
    with pytest.raises(ValueError):
        enqueue(db, "run-3", execution_mode="interactive")


def test_enqueue_refuses_duplicates_and_places_lineage(db: Database) -> None:
    enqueue(db, "root")
    with pytest.raises(InvalidTransitionError):
        enqueue(db, "root")
    enqueue(db, "restart", restart_of="root")
    enqueue(db, "cont", continuation_of="restart")
    assert get_run(db, "cont").root_run_id == "root"  # type: ignore[union-attr]
    with pytest.raises(RunNotFoundError):
        enqueue(db, "orphan", parent_run_id="missing")


def test_admission_order_kind_priority_and_age(db: Database, clock: ManualClock) -> None:
    enqueue(db, "old")
    clock.advance(1)
    enqueue(db, "new-high", priority=5)
    clock.advance(1)
    enqueue(db, "resource", kind=QueueKind.RESOURCE)
    assert [r.run_id for r in admissible_runs(db, QueueKind.WORKFLOW, limit=5)] == [
        "new-high",
        "old",
    ]
    assert [r.run_id for r in admissible_runs(db, QueueKind.RESOURCE, limit=5)] == ["resource"]
    with db.write() as tx:
        claim_for_launch(tx, "old", owner_id="s", runner_epoch="e", launch_envelope_hash="h")
    assert active_queue_count(db) == 1


def test_rejection_inside_a_handler_leaves_the_transaction_usable(db: Database) -> None:
    """A command handler may catch a refusal and still commit its receipt."""
    drive_to(db, P.COMPLETED)
    with db.write() as tx:
        with pytest.raises(InvalidTransitionError):
            pause_run(tx, "run-1")
        put_blob(tx, b"receipt")
    assert db.fetch_value("SELECT count(*) FROM blobs", {}) == 1
    assert verify(db) == []


def test_run_summary_and_list_revision(db: Database) -> None:
    # The counter only promises to grow with every committed run change (one
    # transaction may raise it more than once: a run and its queue row).
    assert run_list_revision(db) == 0
    enqueue(db, "a")
    first = run_list_revision(db)
    enqueue(db, "b")
    second = run_list_revision(db)
    assert 0 < first < second
    with db.write() as tx:
        pause_run(tx, "a")
    assert run_list_revision(db) > second
    summary = get_run_summary(db, "a")
    assert summary is not None
    assert (summary.status, summary.paused, summary.queue_state) == ("queued", 1, "queued")
    assert summary.revision == run_view_revision(db, "a"), "the view's revision"
    assert [r.run_id for r in list_runs(db)] == ["b", "a"]
    assert get_run_summary(db, "missing") is None


def test_status_counts_and_server_work(db: Database, clock: ManualClock) -> None:
    assert server_has_work(db) is False
    enqueue(db, "q")
    assert server_has_work(db) is True
    with db.write() as tx:
        pause_run(tx, "q")
    assert server_has_work(db) is False
    running(db, "r")
    clock.advance(60_000)
    counts = status_counts(db, clock.now_ms())
    assert counts.runs_by_status == {"queued": 1, "running": 1}
    assert counts.queue_by_state == {"queued": 1, "running": 1}
    assert counts.expired_claims == 1
    assert (counts.pending_interactions, counts.ambiguous_effects) == (0, 0)


# --- seed rows the later issues will own -------------------------------------------------


def _add_message(tx: Tx, message_id: str, kind: str, reason: str | None, source: str) -> None:
    tx.execute(
        "INSERT INTO workflow_messages (message_id, run_id, target_session_id, kind, reason,"
        " source_id, content_digest, session_order, state, created_at, updated_at)"
        " VALUES (:m, 'run-1', 'session-1', :k, :r, :s, 'sha256:c',"
        " (SELECT count(*) FROM workflow_messages), 'pending', 1, 1)",
        {"m": message_id, "k": kind, "r": reason, "s": source},
    )


def _add_step_message(tx: Tx, message_id: str, request_id: str) -> None:
    _add_message(tx, message_id, "step", "initial", request_id)


def _message_state(db: Database, message_id: str) -> str:
    return str(
        db.fetch_value(
            "SELECT state FROM workflow_messages WHERE message_id = :m", {"m": message_id}
        )
    )


def _seed_pending_work(tx: Tx) -> None:
    blob = put_json_blob(tx, {"contract": 1})
    tx.execute(
        "INSERT INTO interactive_requests (request_id, run_id, attempt_id, target_session_id,"
        " kind, contract_hash, status, created_at, updated_at)"
        " VALUES ('req-1', 'run-1', 'a1', 'session-1', 'agent', :b, 'pending', 1, 1)",
        {"b": blob},
    )
    tx.execute(
        "INSERT INTO human_decisions (decision_id, run_id, attempt_id, node_path, audience,"
        " request_digest, request_hash, status, created_at, updated_at)"
        " VALUES ('d1', 'run-1', 'a1', 'n', 'ops', 'sha256:r', :b, 'pending', 1, 1)",
        {"b": blob},
    )
    for effect_id, state in (
        ("e-pending", "pending"),
        ("e-applying", "applying"),
        ("e-applied", "applied"),
    ):
        settled = None if state in ("pending", "applying") else 1
        tx.execute(
            "INSERT INTO effects (effect_id, run_id, attempt_id, effect_type, idempotency_key,"
            " request_fingerprint, state, created_at, updated_at, settled_at)"
            " VALUES (:e, 'run-1', 'a1', 'http', :e, 'sha256:f', :s, 1, 1, :settled)",
            {"e": effect_id, "s": state, "settled": settled},
        )
    tx.execute(
        "INSERT INTO effect_attempts (effect_id, attempt_number, executor_epoch, state,"
        " started_at) VALUES ('e-applying', 1, 'run-1-e1', 'applying', 1)"
    )
    tx.execute(
        "INSERT INTO effect_attempts (effect_id, attempt_number, executor_epoch, state,"
        " started_at, finished_at) VALUES ('e-applied', 1, 'run-1-e1', 'applied', 1, 2)"
    )
    _add_step_message(tx, "m-step", "req-1")
    _add_message(tx, "m-follow", "follow_up", None, "f1")
    _add_message(tx, "m-note", "notification", None, "n1")
