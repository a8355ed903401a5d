"""Idempotent effects applied again after an interruption, and the operator's reviewed
recovery (confirm / retry) of an ambiguous effect, on a real database."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pi_workflows.storage import (
    Claim,
    Database,
    EffectConflictError,
    EffectDecision,
    EffectRecoveryError,
    EffectReservation,
    EffectState,
    RunnerOutcome,
    RunNotFoundError,
    cancel_run,
    claim_for_launch,
    declare_effect_ambiguous,
    get_effect,
    get_run_summary,
    list_ambiguous_effects,
    list_events,
    mark_runner_live,
    park_run,
    pause_run,
    record_runner_exit,
    recover_ambiguous_effect,
    requeue_run,
    reserve_effect,
    settle_effect,
    start_node_attempt,
    verify,
)
from tests.storage.storage_helpers import running

KEY = "run-1/payment.charge/charge/1"
REQUEST = {"amount": 5}
E1, E2, E3 = "run-1-e1", "run-1-e2", "run-1-e3"


def _start(db: Database, claim: Claim, attempt_id: str) -> None:
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id=attempt_id, node_path="charge", node_type="action")


def _reserve(
    db: Database, claim: Claim, attempt_id: str, epoch: str, *, idempotent: bool = False
) -> EffectReservation:
    with db.write() as tx:
        return reserve_effect(
            tx,
            claim,
            attempt_id=attempt_id,
            effect_type="payment.charge",
            idempotency_key=KEY,
            request=REQUEST,
            executor_epoch=epoch,
            idempotent=idempotent,
        )


def _launch(db: Database, epoch: str) -> Claim:
    with db.write() as tx:
        launch = claim_for_launch(
            tx, "run-1", owner_id="srv", runner_epoch=epoch, launch_envelope_hash="h"
        )
        mark_runner_live(tx, launch.claim, runner_epoch=epoch, pid=2, process_start_time=2)
    return launch.claim


def _relaunch(db: Database, claim: Claim, old_epoch: str, new_epoch: str) -> Claim:
    """The runner died mid-apply; the server requeues the run and launches another."""
    with db.write() as tx:
        record_runner_exit(tx, old_epoch, outcome=RunnerOutcome.CRASHED, signal=9)
        requeue_run(tx, "run-1", reason="workerCrashed", claim=claim)
    return _launch(db, new_epoch)


def _attempts(db: Database) -> list[tuple[int, str, str, str | None]]:
    rows = db.connection.execute(
        "SELECT attempt_number, executor_epoch, state, recovery FROM effect_attempts"
        " ORDER BY attempt_number"
    ).fetchall()
    return [tuple(row) for row in rows]


def _ambiguous(db: Database) -> Claim:
    """A run parked with `effectAmbiguous`: its non-idempotent apply was interrupted."""
    claim = running(db)
    _start(db, claim, "a1")
    _reserve(db, claim, "a1", E1)
    claim = _relaunch(db, claim, E1, E2)
    _start(db, claim, "a2")
    assert _reserve(db, claim, "a2", E2).decision is EffectDecision.UNCERTAIN
    with db.write() as tx:
        declare_effect_ambiguous(tx, claim, idempotency_key=KEY, reason="no read-back")
        park_run(tx, claim, reason="effectAmbiguous")
        record_runner_exit(tx, E2, outcome=RunnerOutcome.EXITED, exit_code=0)
    return claim


def _recover(db: Database, action: Any, **fields: Any) -> Any:
    with db.write() as tx:
        return recover_ambiguous_effect(tx, "run-1", action=action, actor="cli-7", **fields)


# --- Idempotent effects ----------------------------------------------------------------


def test_an_interrupted_idempotent_effect_is_applied_again_with_the_same_key(
    db: Database,
) -> None:
    claim = running(db)
    _start(db, claim, "a1")
    assert _reserve(db, claim, "a1", E1, idempotent=True).attempt_number == 1
    claim = _relaunch(db, claim, E1, E2)
    _start(db, claim, "a2")
    again = _reserve(db, claim, "a2", E2, idempotent=True)
    assert (again.decision, again.attempt_number, again.changed) == (
        EffectDecision.PROCEED,
        2,
        True,
    )
    assert again.effect.idempotency_key == KEY and again.effect.idempotent
    assert _attempts(db) == [(1, E1, "interrupted", None), (2, E2, "applying", None)]
    events = [
        json.loads(e.payload)
        for e in list_events(db, "run-1")
        if e.event_type == "effect_reapplied"
    ]
    assert [(e["interruptedAttempt"], e["attemptNumber"]) for e in events] == [(1, 2)]
    # A retried reservation by the same executor does not open a third attempt.
    assert _reserve(db, claim, "a2", E2, idempotent=True).changed is False
    with db.write() as tx:
        settle_effect(
            tx, claim, idempotency_key=KEY, outcome="applied", result={"ok": 1}, executor_epoch=E2
        )
    assert _attempts(db)[-1] == (2, E2, "applied", None)
    assert verify(db) == []


def test_the_idempotent_declaration_cannot_change_for_a_key(db: Database) -> None:
    claim = running(db)
    _start(db, claim, "a1")
    _reserve(db, claim, "a1", E1, idempotent=True)
    with pytest.raises(EffectConflictError) as caught:
        _reserve(db, claim, "a1", E1, idempotent=False)
    assert caught.value.reason == "idempotencyMismatch"


def test_a_default_effect_still_becomes_uncertain(db: Database) -> None:
    _ambiguous(db)
    (effect,) = list_ambiguous_effects(db, "run-1")
    assert (effect.effect_type, effect.node_path, effect.attempt_number) == (
        "payment.charge",
        "charge",
        1,
    )
    assert verify(db) == []


# --- Operator recovery -----------------------------------------------------------------


def test_confirm_settles_the_effect_applied_and_queues_the_run(db: Database) -> None:
    _ambiguous(db)
    recovery = _recover(db, "confirm", result={"charged": 5})
    assert recovery.transition.phase.value == "queued"
    effect = get_effect(db, KEY)
    assert effect is not None
    assert (effect.state, effect.result) == (EffectState.APPLIED, {"charged": 5})
    assert _attempts(db) == [(1, E1, "applied", "confirmed")]
    (event,) = [
        json.loads(e.payload)
        for e in list_events(db, "run-1")
        if e.event_type == "effect_recovered"
    ]
    assert event["action"] == "confirm"
    assert event["actor"] == {"kind": "operator", "clientId": "cli-7"}
    assert event["nodePath"] == "charge"
    summary = get_run_summary(db, "run-1")
    assert summary is not None and summary.park_reason is None
    assert verify(db) == []
    # The next runner adopts the confirmed receipt: it never applies again.
    claim = _launch(db, E3)
    _start(db, claim, "a3")
    adopted = _reserve(db, claim, "a3", E3)
    assert (adopted.decision, adopted.effect.result) == (EffectDecision.ADOPT, {"charged": 5})
    assert verify(db) == []


def test_retry_reopens_the_effect_for_a_new_numbered_attempt(db: Database) -> None:
    _ambiguous(db)
    recovery = _recover(db, "retry")
    assert recovery.next_attempt_number == 2
    effect = get_effect(db, KEY)
    assert effect is not None and effect.state is EffectState.PENDING
    assert _attempts(db) == [(1, E1, "ambiguous", "retried")]
    assert verify(db) == []
    claim = _launch(db, E3)
    _start(db, claim, "a3")
    proceed = _reserve(db, claim, "a3", E3)
    assert (proceed.decision, proceed.attempt_number) == (EffectDecision.PROCEED, 2)
    with db.write() as tx:
        settle_effect(
            tx, claim, idempotency_key=KEY, outcome="applied", result=None, executor_epoch=E3
        )
    assert _attempts(db) == [(1, E1, "ambiguous", "retried"), (2, E3, "applied", None)]
    assert verify(db) == []


def test_a_retried_effect_of_a_cancelled_run_is_cancelled(db: Database) -> None:
    _ambiguous(db)
    _recover(db, "retry")
    with db.write() as tx:
        cancel_run(tx, "run-1", reason="user")
    effect = get_effect(db, KEY)
    assert effect is not None and effect.state is EffectState.CANCELLED
    assert verify(db) == []


def test_a_paused_ambiguous_run_is_recovered_and_unpaused(db: Database) -> None:
    _ambiguous(db)
    with db.write() as tx:
        pause_run(tx, "run-1")
    _recover(db, "confirm")
    summary = get_run_summary(db, "run-1")
    assert summary is not None and not summary.paused
    assert verify(db) == []


def test_recovery_refusals_change_nothing(db: Database) -> None:
    with pytest.raises(RunNotFoundError):
        _recover(db, "confirm")
    claim = running(db)
    with pytest.raises(EffectRecoveryError) as caught:
        _recover(db, "confirm")
    assert caught.value.code == "runNotAmbiguous"
    with db.write() as tx:
        park_run(tx, claim, reason="effectAmbiguous")  # parked, but nothing is ambiguous
    with pytest.raises(EffectRecoveryError) as caught:
        _recover(db, "retry")
    assert caught.value.code == "noAmbiguousEffect"
    assert verify(db) == []


def test_recovery_checks_its_arguments(db: Database) -> None:
    _ambiguous(db)
    with pytest.raises(EffectRecoveryError) as caught:
        _recover(db, "retry", result={"x": 1})
    assert caught.value.code == "resultNotAllowed"
    with pytest.raises(EffectRecoveryError) as caught:
        _recover(db, "confirm", effect_id="effect-other")
    assert caught.value.code == "noAmbiguousEffect"
    with pytest.raises(ValueError):
        _recover(db, "undo")
    # Once recovered, the run is no longer ambiguous: a second recovery is refused.
    _recover(db, "confirm")
    with pytest.raises(EffectRecoveryError) as caught:
        _recover(db, "confirm")
    assert caught.value.code == "runNotAmbiguous"
    assert verify(db) == []
