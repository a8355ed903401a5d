"""Managed effects on a real database: every reservation case, settlement idempotency,
read-back retries, ambiguity as a terminal state, cancellation, and claim fencing."""

from __future__ import annotations

from typing import Any

import pytest

from pi_workflows.storage import (
    Claim,
    ClaimLostError,
    ClaimLostReason,
    Database,
    EffectConflictError,
    EffectDecision,
    EffectReservation,
    EffectState,
    InvalidTransitionError,
    ManualClock,
    RevisionConflictError,
    RunnerOutcome,
    acquire_claim,
    cancel_run,
    claim_for_launch,
    count_ambiguous_effects,
    declare_effect_ambiguous,
    effect_fingerprint,
    get_effect,
    get_run,
    list_effects,
    list_events,
    mark_runner_live,
    read_blob,
    record_runner_exit,
    requeue_run,
    reserve_effect,
    retry_effect_after_read_back,
    settle_effect,
    start_node_attempt,
    status_counts,
    verify,
)
from pi_workflows.wire.canonical import dumps
from tests.storage.storage_helpers import raw_edit, running

KEY = "run-1/payment.charge/charge/1"
REQUEST = {"amount": 5}
E1, E2, E3 = "run-1-e1", "run-1-e2", "run-1-e3"


def _start(db: Database, claim: Claim, attempt_id: str = "a1", node_path: str = "charge") -> None:
    with db.write() as tx:
        start_node_attempt(
            tx, claim, attempt_id=attempt_id, node_path=node_path, node_type="action"
        )


def _reserve(
    db: Database,
    claim: Claim,
    *,
    attempt_id: str = "a1",
    key: str = KEY,
    request: Any = REQUEST,
    epoch: str = E1,
    effect_type: str = "payment.charge",
) -> EffectReservation:
    with db.write() as tx:
        return reserve_effect(
            tx,
            claim,
            attempt_id=attempt_id,
            effect_type=effect_type,
            idempotency_key=key,
            request=request,
            executor_epoch=epoch,
        )


def _relaunch(db: Database, claim: Claim, old_epoch: str, new_epoch: str) -> Claim:
    """The runner died mid-apply; the server requeues (progress made) and relaunches."""
    with db.write() as tx:
        record_runner_exit(tx, old_epoch, outcome=RunnerOutcome.CRASHED, signal=9)
        requeue_run(tx, "run-1", reason="workerCrashed", claim=claim)
    with db.write() as tx:
        launch = claim_for_launch(
            tx, "run-1", owner_id="srv", runner_epoch=new_epoch, launch_envelope_hash="h"
        )
        mark_runner_live(tx, launch.claim, runner_epoch=new_epoch, pid=2, process_start_time=2)
    return launch.claim


def _attempts(db: Database) -> list[tuple[int, str, str]]:
    rows = db.connection.execute(
        "SELECT attempt_number, executor_epoch, state FROM effect_attempts"
        " ORDER BY effect_id, attempt_number"
    ).fetchall()
    return [tuple(row) for row in rows]


def _revision(db: Database) -> int:
    run = get_run(db, "run-1")
    assert run is not None
    return run.revision


def _event_types(db: Database) -> list[str]:
    return [e.event_type for e in list_events(db, "run-1")]


# --- Reservation cases --------------------------------------------------------------


def test_new_key_reserves_applying_with_attempt_one(db: Database) -> None:
    claim = running(db)
    _start(db, claim)
    before = _revision(db)
    reservation = _reserve(db, claim)
    assert reservation.decision is EffectDecision.PROCEED
    assert (reservation.attempt_number, reservation.changed) == (1, True)
    assert reservation.revision == before + 1 == _revision(db)
    effect = reservation.effect
    assert effect.state is EffectState.APPLYING
    assert (effect.run_id, effect.attempt_id, effect.effect_type) == (
        "run-1",
        "a1",
        "payment.charge",
    )
    assert (effect.attempt_count, effect.last_executor_epoch) == (1, E1)
    assert effect.request_fingerprint == effect_fingerprint("payment.charge", REQUEST)
    assert effect.result is None and effect.error is None and effect.revision == before + 1
    assert _attempts(db) == [(1, E1, "applying")]
    assert _event_types(db)[-1] == "effect_reserved"
    request_hash = db.fetch_value("SELECT request_hash FROM effects", {})
    assert read_blob(db, request_hash) == dumps(REQUEST)
    assert reservation.to_wire()["decision"] == "proceed"
    assert verify(db) == []


def test_same_executor_retry_proceeds_without_a_second_write(db: Database) -> None:
    claim = running(db)
    _start(db, claim)
    first = _reserve(db, claim)
    events = _event_types(db)
    again = _reserve(db, claim)
    assert again.decision is EffectDecision.PROCEED
    assert (again.attempt_number, again.changed, again.revision) == (1, False, first.revision)
    assert _event_types(db) == events
    assert _attempts(db) == [(1, E1, "applying")]


@pytest.mark.parametrize(
    ("effect_type", "request_"),
    [("payment.charge", {"amount": 6}), ("payment.refund", REQUEST)],
    ids=["other-request", "other-effect-type"],
)
def test_key_reuse_with_another_request_conflicts_and_changes_nothing(
    db: Database, effect_type: str, request_: Any
) -> None:
    claim = running(db)
    _start(db, claim)
    _reserve(db, claim)
    with db.write() as tx:
        changes = tx.connection.total_changes
        with pytest.raises(EffectConflictError) as caught:
            reserve_effect(
                tx,
                claim,
                attempt_id="a1",
                effect_type=effect_type,
                idempotency_key=KEY,
                request=request_,
                executor_epoch=E1,
            )
        assert tx.connection.total_changes == changes
    assert caught.value.reason == "requestMismatch"
    assert caught.value.idempotency_key == KEY
    assert _attempts(db) == [(1, E1, "applying")]


def test_a_key_of_another_run_conflicts(db: Database) -> None:
    claim = running(db)
    _start(db, claim)
    _reserve(db, claim)
    other = running(db, "run-2")
    with db.write() as tx:
        start_node_attempt(tx, other, attempt_id="b1", node_path="charge", node_type="action")
    with pytest.raises(EffectConflictError) as caught:
        _reserve(db, other, attempt_id="b1", epoch="run-2-e1")
    assert caught.value.reason == "otherRun"


def test_applied_effect_is_adopted_by_a_later_runner(db: Database) -> None:
    claim = running(db)
    _start(db, claim)
    _reserve(db, claim)
    with db.write() as tx:
        settle_effect(
            tx, claim, idempotency_key=KEY, outcome="applied", result={"id": 7}, executor_epoch=E1
        )
    claim2 = _relaunch(db, claim, E1, E2)
    _start(db, claim2, attempt_id="a2")
    events = _event_types(db)
    adopted = _reserve(db, claim2, attempt_id="a2", epoch=E2)
    assert adopted.decision is EffectDecision.ADOPT
    assert adopted.effect.state is EffectState.APPLIED
    assert adopted.effect.result == {"id": 7}
    assert (adopted.changed, adopted.attempt_number) == (False, 1)
    assert _event_types(db) == events
    assert _attempts(db) == [(1, E1, "applied")]
    assert verify(db) == []


def test_rejected_effect_is_adopted_with_its_error(db: Database) -> None:
    claim = running(db)
    _start(db, claim)
    _reserve(db, claim)
    with db.write() as tx:
        rejected = settle_effect(
            tx, claim, idempotency_key=KEY, outcome="rejected", error="card declined",
            executor_epoch=E1,
        )  # fmt: skip
    assert (rejected.state, rejected.error) == (EffectState.REJECTED, "card declined")
    adopted = _reserve(db, claim)
    assert adopted.decision is EffectDecision.ADOPT
    assert (adopted.effect.state, adopted.effect.error) == (EffectState.REJECTED, "card declined")
    assert verify(db) == []


def test_cancelled_effect_is_adopted(db: Database) -> None:
    claim = running(db)
    _start(db, claim)
    raw_edit(
        db,
        "INSERT INTO effects (effect_id, run_id, attempt_id, effect_type, idempotency_key,"
        " request_fingerprint, state, created_at, updated_at, settled_at)"
        " VALUES ('e-x', 'run-1', 'a1', 'payment.charge', :key, :fp, 'cancelled', 1, 1, 1)",
        params={"key": KEY, "fp": effect_fingerprint("payment.charge", REQUEST)},
    )
    adopted = _reserve(db, claim)
    assert adopted.decision is EffectDecision.ADOPT
    assert adopted.effect.state is EffectState.CANCELLED
    assert adopted.attempt_number is None
    assert verify(db) == []


def test_pending_effect_starts_its_first_attempt(db: Database) -> None:
    claim = running(db)
    _start(db, claim)
    raw_edit(
        db,
        "INSERT INTO effects (effect_id, run_id, attempt_id, effect_type, idempotency_key,"
        " request_fingerprint, state, created_at, updated_at)"
        " VALUES ('e-p', 'run-1', 'a1', 'payment.charge', :key, :fp, 'pending', 1, 1)",
        params={"key": KEY, "fp": effect_fingerprint("payment.charge", REQUEST)},
    )
    reservation = _reserve(db, claim)
    assert (reservation.decision, reservation.attempt_number) == (EffectDecision.PROCEED, 1)
    assert (reservation.changed, reservation.effect.state) == (True, EffectState.APPLYING)
    assert _attempts(db) == [(1, E1, "applying")]
    assert verify(db) == []


def test_reservation_needs_the_runs_running_attempt(db: Database) -> None:
    claim = running(db)
    with pytest.raises(InvalidTransitionError):
        _reserve(db, claim)  # no attempt at all
    _start(db, claim)
    with pytest.raises(InvalidTransitionError):
        _reserve(db, claim, attempt_id="other")
    assert list_effects(db, "run-1") == []


# --- An executor died mid-apply: uncertain, read-back, ambiguity --------------------


def _uncertain(db: Database) -> Claim:
    claim = running(db)
    _start(db, claim)
    _reserve(db, claim)
    claim2 = _relaunch(db, claim, E1, E2)
    _start(db, claim2, attempt_id="a2")
    reservation = _reserve(db, claim2, attempt_id="a2", epoch=E2)
    assert reservation.decision is EffectDecision.UNCERTAIN
    assert (reservation.attempt_number, reservation.changed) == (1, False)
    assert reservation.effect.last_executor_epoch == E1
    return claim2


def test_applying_by_a_dead_executor_is_uncertain_and_the_rerun_keeps_its_visit(
    db: Database,
) -> None:
    _uncertain(db)
    visits = db.connection.execute(
        "SELECT attempt_id, visit, status FROM node_attempts ORDER BY rowid"
    ).fetchall()
    assert [tuple(v) for v in visits] == [("a1", 1, "interrupted"), ("a2", 1, "running")]
    assert verify(db) == []


def test_uncertain_effect_cannot_be_settled_without_read_back(db: Database) -> None:
    claim2 = _uncertain(db)
    with db.write() as tx:
        changes = tx.connection.total_changes
        with pytest.raises(InvalidTransitionError):
            settle_effect(
                tx, claim2, idempotency_key=KEY, outcome="applied", result={"id": 1},
                executor_epoch=E2,
            )  # fmt: skip
        assert tx.connection.total_changes == changes


def test_read_back_proves_the_stale_attempt_applied(db: Database) -> None:
    claim2 = _uncertain(db)
    with db.write() as tx:
        record = settle_effect(
            tx, claim2, idempotency_key=KEY, outcome="applied", result={"id": 1},
            executor_epoch=E2, proven_by_read_back=True,
        )  # fmt: skip
    assert (record.state, record.result, record.attempt_count) == (
        EffectState.APPLIED,
        {"id": 1},
        1,
    )
    assert _attempts(db) == [(1, E1, "applied")]
    settled = list_events(db, "run-1")[-1]
    assert settled.event_type == "effect_settled" and '"provenByReadBack":true' in settled.payload
    assert verify(db) == []


def test_read_back_retry_numbers_attempts_and_cancels_the_stale_ones(db: Database) -> None:
    claim2 = _uncertain(db)
    with db.write() as tx:
        retry = retry_effect_after_read_back(tx, claim2, idempotency_key=KEY, executor_epoch=E2)
    assert (retry.decision, retry.attempt_number, retry.changed) == (
        EffectDecision.PROCEED,
        2,
        True,
    )
    assert _attempts(db) == [(1, E1, "cancelled"), (2, E2, "applying")]
    assert verify(db) == []
    # The second executor dies too; a third proves "not applied" again.
    claim3 = _relaunch(db, claim2, E2, E3)
    _start(db, claim3, attempt_id="a3")
    assert _reserve(db, claim3, attempt_id="a3", epoch=E3).decision is EffectDecision.UNCERTAIN
    with db.write() as tx:
        third = retry_effect_after_read_back(tx, claim3, idempotency_key=KEY, executor_epoch=E3)
        settle_effect(
            tx, claim3, idempotency_key=KEY, outcome="applied", result={"id": 3},
            executor_epoch=E3,
        )  # fmt: skip
    assert third.attempt_number == 3
    assert _attempts(db) == [(1, E1, "cancelled"), (2, E2, "cancelled"), (3, E3, "applied")]
    effect = get_effect(db, KEY)
    assert effect is not None and effect.attempt_count == 3 and effect.last_executor_epoch == E3
    assert "effect_retried" in _event_types(db)
    assert verify(db) == []


def test_ambiguous_is_terminal_for_automatic_retry(db: Database) -> None:
    claim2 = _uncertain(db)
    with db.write() as tx:
        record = declare_effect_ambiguous(tx, claim2, idempotency_key=KEY, reason="no read-back")
    assert (record.state, record.error) == (EffectState.AMBIGUOUS, "no read-back")
    assert _attempts(db) == [(1, E1, "ambiguous")]
    assert _event_types(db)[-1] == "effect_ambiguous"
    assert count_ambiguous_effects(db, "run-1") == 1
    assert _reserve(db, claim2, attempt_id="a2", epoch=E2).decision is EffectDecision.AMBIGUOUS
    with db.write() as tx:
        changes = tx.connection.total_changes
        with pytest.raises(EffectConflictError) as retry:
            retry_effect_after_read_back(tx, claim2, idempotency_key=KEY, executor_epoch=E2)
        with pytest.raises(EffectConflictError) as settle:
            settle_effect(
                tx, claim2, idempotency_key=KEY, outcome="applied", executor_epoch=E2,
                proven_by_read_back=True,
            )  # fmt: skip
        assert tx.connection.total_changes == changes
        again = declare_effect_ambiguous(tx, claim2, idempotency_key=KEY, reason="again")
    assert retry.value.reason == settle.value.reason == "terminal"
    assert (again.state, again.error) == (EffectState.AMBIGUOUS, "no read-back")
    assert verify(db) == []


def test_settled_effects_cannot_be_declared_ambiguous(db: Database) -> None:
    claim = running(db)
    _start(db, claim)
    _reserve(db, claim)
    with db.write() as tx:
        settle_effect(tx, claim, idempotency_key=KEY, outcome="applied", executor_epoch=E1)
    with pytest.raises(EffectConflictError) as caught, db.write() as tx:
        declare_effect_ambiguous(tx, claim, idempotency_key=KEY, reason="late")
    assert caught.value.reason == "terminal"


# --- Settlement ---------------------------------------------------------------------


def test_settle_is_idempotent_and_a_different_settlement_conflicts(db: Database) -> None:
    claim = running(db)
    _start(db, claim)
    _reserve(db, claim)
    with db.write() as tx:
        first = settle_effect(
            tx, claim, idempotency_key=KEY, outcome="applied", result={"id": 1}, executor_epoch=E1
        )
    events = _event_types(db)
    with db.write() as tx:
        again = settle_effect(
            tx, claim, idempotency_key=KEY, outcome="applied", result={"id": 1}, executor_epoch=E1
        )
    assert again == first
    assert _event_types(db) == events
    for outcome, result, error in (("applied", {"id": 2}, None), ("rejected", None, "no")):
        with db.write() as tx:
            changes = tx.connection.total_changes
            with pytest.raises(EffectConflictError) as caught:
                settle_effect(
                    tx, claim, idempotency_key=KEY, outcome=outcome,  # type: ignore[arg-type]
                    result=result, error=error, executor_epoch=E1,
                )  # fmt: skip
            assert tx.connection.total_changes == changes
        assert caught.value.reason == "outcomeMismatch"
    assert _attempts(db) == [(1, E1, "applied")]
    assert verify(db) == []


def test_settle_validates_its_arguments_and_the_key(db: Database) -> None:
    claim = running(db)
    _start(db, claim)
    _reserve(db, claim)
    with db.write() as tx:
        with pytest.raises(ValueError, match="needs an error"):
            settle_effect(tx, claim, idempotency_key=KEY, outcome="rejected", executor_epoch=E1)
        with pytest.raises(ValueError, match="no error"):
            settle_effect(
                tx, claim, idempotency_key=KEY, outcome="applied", error="x", executor_epoch=E1
            )
        with pytest.raises(ValueError, match="applied or rejected"):
            settle_effect(
                tx, claim, idempotency_key=KEY, outcome="ambiguous",  # type: ignore[arg-type]
                executor_epoch=E1,
            )  # fmt: skip
        with pytest.raises(InvalidTransitionError):
            settle_effect(tx, claim, idempotency_key="nope", outcome="applied", executor_epoch=E1)
        with pytest.raises(InvalidTransitionError):
            retry_effect_after_read_back(tx, claim, idempotency_key="nope", executor_epoch=E1)
        with pytest.raises(InvalidTransitionError):
            declare_effect_ambiguous(tx, claim, idempotency_key="nope", reason="x")
    with pytest.raises(RevisionConflictError), db.write() as tx:
        settle_effect(
            tx, claim, idempotency_key=KEY, outcome="applied", executor_epoch=E1,
            expected_revision=1,
        )  # fmt: skip
    assert _attempts(db) == [(1, E1, "applying")]


# --- Cancellation and claim fencing -------------------------------------------------


def test_cancel_turns_applying_into_ambiguous_and_pending_into_cancelled(db: Database) -> None:
    claim = running(db)
    _start(db, claim)
    _reserve(db, claim)
    raw_edit(
        db,
        "INSERT INTO effects (effect_id, run_id, attempt_id, effect_type, idempotency_key,"
        " request_fingerprint, state, created_at, updated_at)"
        " VALUES ('e-p', 'run-1', 'a1', 'notify', 'k-pending', 'sha256:f', 'pending', 1, 1)",
    )
    with db.write() as tx:
        cancel_run(tx, "run-1", claim=claim, reason="user")
    states = {e.idempotency_key: e.state for e in list_effects(db, "run-1")}
    assert states == {KEY: EffectState.AMBIGUOUS, "k-pending": EffectState.CANCELLED}
    assert _attempts(db) == [(1, E1, "ambiguous")]
    assert count_ambiguous_effects(db, "run-1") == 1
    assert status_counts(db, 0).ambiguous_effects == 1
    assert verify(db) == []


def test_a_stale_generation_cannot_reserve_or_settle(db: Database, clock: ManualClock) -> None:
    stale = running(db)
    _start(db, stale)
    _reserve(db, stale)
    clock.advance(60_000)
    with pytest.raises(ClaimLostError) as expired, db.write() as tx:
        settle_effect(tx, stale, idempotency_key=KEY, outcome="applied", executor_epoch=E1)
    assert expired.value.reason is ClaimLostReason.EXPIRED
    with db.write() as tx:
        acquire_claim(tx, "run-1", owner_type="control", owner_id="recovery")
    with db.write() as tx:
        changes = tx.connection.total_changes
        for call in (
            lambda: reserve_effect(
                tx, stale, attempt_id="a1", effect_type="payment.charge",
                idempotency_key="fresh-key", request=REQUEST, executor_epoch=E1,
            ),
            lambda: reserve_effect(
                tx, stale, attempt_id="a1", effect_type="payment.charge",
                idempotency_key=KEY, request={"other": 1}, executor_epoch=E1,
            ),
            lambda: settle_effect(
                tx, stale, idempotency_key=KEY, outcome="applied", executor_epoch=E1
            ),
            lambda: retry_effect_after_read_back(
                tx, stale, idempotency_key=KEY, executor_epoch=E1
            ),
            lambda: declare_effect_ambiguous(tx, stale, idempotency_key=KEY, reason="x"),
        ):  # fmt: skip
            with pytest.raises(ClaimLostError) as caught:
                call()
            assert caught.value.reason is ClaimLostReason.GENERATION_CHANGED
        assert tx.connection.total_changes == changes
    effect = get_effect(db, KEY)
    assert effect is not None and effect.state is EffectState.APPLYING


def test_recovery_with_a_control_claim_declares_the_orphaned_effect_ambiguous(
    db: Database, clock: ManualClock
) -> None:
    stale = running(db)
    _start(db, stale)
    _reserve(db, stale)
    clock.advance(60_000)
    with db.write() as tx:
        control = acquire_claim(tx, "run-1", owner_type="control", owner_id="recovery")
        record = declare_effect_ambiguous(tx, control, idempotency_key=KEY, reason="server crash")
    assert record.state is EffectState.AMBIGUOUS
    assert verify(db) == []


def test_list_effects_in_reservation_order(db: Database) -> None:
    claim = running(db)
    _start(db, claim)
    for key in ("k-b", "k-a", "k-c"):
        _reserve(db, claim, key=key)
    with db.write() as tx:
        settle_effect(tx, claim, idempotency_key="k-a", outcome="applied", executor_epoch=E1)
    effects = list_effects(db, "run-1")
    assert [e.idempotency_key for e in effects] == ["k-b", "k-a", "k-c"]
    assert [e.state for e in effects] == ["applying", "applied", "applying"]
    assert {e.revision for e in effects} == {_revision(db)}
    assert get_effect(db, "absent") is None
    assert list_effects(db, "run-2") == []
    assert verify(db) == []
