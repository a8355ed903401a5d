"""Managed effects: reserve before `apply`, settle after, read-back retry and ambiguity.

Implements workflow-server.md § Effects and retry safety, § Pause and cancellation and
§ Recovery: one effect per key, numbered attempts, no blind re-apply (an idempotent effect
is applied again with its key; an ambiguous one waits for the operator's recovery).
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from pi_workflows.storage import _queries as q
from pi_workflows.storage._claims import Claim, RunHead, protected_write, read_head
from pi_workflows.storage._content import content_digest, put_blob, read_json_blob
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._errors import (
    EffectConflictError,
    EffectRecoveryError,
    InvalidTransitionError,
)
from pi_workflows.storage._lifecycle import (
    TransitionResult,
    apply_transition,
    begin_transition,
    require_phase,
)
from pi_workflows.storage._phases import EventType, RunPhase
from pi_workflows.storage._rows import NodeAttemptRow, QueueRow
from pi_workflows.wire.canonical import dumps, sha256_digest

__all__ = [
    "AmbiguousEffect",
    "EffectDecision",
    "EffectRecord",
    "EffectRecovery",
    "EffectReservation",
    "EffectState",
    "count_ambiguous_effects",
    "declare_effect_ambiguous",
    "effect_fingerprint",
    "get_effect",
    "list_ambiguous_effects",
    "list_effects",
    "recover_ambiguous_effect",
    "reserve_effect",
    "retry_effect_after_read_back",
    "settle_effect",
]

_RUNNING_ONLY = frozenset({RunPhase.RUNNING})
# The attempt error recorded when read-back proved an attempt did not apply.
_NOT_APPLIED = "not applied (proven by read-back)"
# The attempt error recorded when an idempotent effect is applied again after an interruption.
_INTERRUPTED = "interrupted while applying; applied again with the same key (idempotent)"
# The events of an idempotent re-apply and of an operator's recovery.
EFFECT_REAPPLIED = "effect_reapplied"
EFFECT_RECOVERED = "effect_recovered"


class EffectState(enum.StrEnum):
    """`effects.state`. Everything but `pending` and `applying` is terminal."""

    PENDING = "pending"  # reserved, no attempt started
    APPLYING = "applying"  # one attempt is in flight
    APPLIED = "applied"  # terminal: the external work happened (result stored)
    REJECTED = "rejected"  # terminal: the external system refused it
    CANCELLED = "cancelled"  # terminal: its run ended before it started
    AMBIGUOUS = "ambiguous"  # terminal for automatic retry: it may have applied

    @property
    def is_terminal(self) -> bool:
        """Whether no automatic step changes this state again."""
        return self not in (EffectState.PENDING, EffectState.APPLYING)


class EffectDecision(enum.StrEnum):
    """What the runner must do after `reserve_effect`."""

    PROCEED = "proceed"
    """Call `apply` now: this executor owns the in-flight attempt; then `settle_effect`."""
    ADOPT = "adopt"
    """The effect already ended (applied, rejected or cancelled): use the stored state
    and result; never call `apply`."""
    UNCERTAIN = "uncertain"
    """An earlier executor died while applying. Prove the outcome with read-back: then
    `settle_effect(..., proven_by_read_back=True)` if it applied, or
    `retry_effect_after_read_back` if it did not; without read-back,
    `declare_effect_ambiguous`."""
    AMBIGUOUS = "ambiguous"
    """The effect is ambiguous and is never retried automatically: the run parks with
    `effectAmbiguous` (or fails) for operator review."""


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """One managed effect and a summary of its attempts."""

    effect_id: str
    run_id: str
    attempt_id: str | None
    """The node attempt that reserved the effect."""
    effect_type: str
    idempotency_key: str
    state: EffectState
    result: Any
    """The decoded result JSON, or None when none was stored."""
    error: str | None
    attempt_count: int
    """How many execution attempts were opened; the latest is numbered `attempt_count`."""
    last_executor_epoch: str | None
    """The executor (runner epoch) of the latest attempt, if any."""
    idempotent: bool
    """Declared when reserved: the external system deduplicates by the key."""
    request_fingerprint: str
    """`effect_fingerprint(effect_type, request)` of the reserved request."""
    revision: int
    """The run's revision when this record was read (after the returning call's write)."""

    def to_wire(self) -> dict[str, Any]:
        """The record as runner-reply JSON (camelCase; no request, no fingerprint)."""
        return {
            "effectId": self.effect_id,
            "effectType": self.effect_type,
            "idempotencyKey": self.idempotency_key,
            "state": self.state.value,
            "result": self.result,
            "error": self.error,
            "attemptCount": self.attempt_count,
        }


@dataclass(frozen=True, slots=True)
class EffectReservation:
    """The answer to `reserve_effect` or `retry_effect_after_read_back`."""

    decision: EffectDecision
    effect: EffectRecord
    attempt_number: int | None
    """`proceed`: the attempt this executor owns; `uncertain`: the stale in-flight
    attempt; otherwise the latest attempt (None when there is none)."""
    revision: int
    """The run revision after the call (unchanged unless `changed`)."""
    changed: bool
    """Whether the call wrote (an event was appended and the revision went up by one)."""

    def to_wire(self) -> dict[str, Any]:
        """The reservation as runner-reply JSON: decision, attempt number and effect."""
        return {
            "decision": self.decision.value,
            "attemptNumber": self.attempt_number,
            "effect": self.effect.to_wire(),
        }


@dataclass(frozen=True, slots=True)
class _EffectRow:
    effect_id: str
    run_id: str
    attempt_id: str | None
    effect_type: str
    idempotency_key: str
    request_fingerprint: str
    idempotent: int
    state: str
    result_hash: str | None
    error: str | None
    attempt_count: int
    last_attempt_number: int | None
    last_executor_epoch: str | None
    revision: int


def effect_fingerprint(effect_type: str, request: Any) -> str:
    """Return `sha256:<hex>` of the canonical JSON of `{effectType, request}`.

    Raises:
        pi_workflows.wire.canonical.NotSerializableError: the request has no canonical form.
    """
    return sha256_digest({"effectType": effect_type, "request": request})


def _effect_id(idempotency_key: str) -> str:
    """The effect ID of a key: derived, so a retried reservation cannot mint a second one."""
    return "effect-" + hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:32]


def _row(reader: Reader, idempotency_key: str) -> _EffectRow | None:
    return reader.fetch_one(
        q.SELECT_EFFECT_BY_KEY, {"idempotency_key": idempotency_key}, _EffectRow
    )


def _record(reader: Reader, row: _EffectRow) -> EffectRecord:
    return EffectRecord(
        effect_id=row.effect_id,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
        effect_type=row.effect_type,
        idempotency_key=row.idempotency_key,
        state=EffectState(row.state),
        result=None if row.result_hash is None else read_json_blob(reader, row.result_hash),
        error=row.error,
        attempt_count=row.attempt_count,
        last_executor_epoch=row.last_executor_epoch,
        idempotent=bool(row.idempotent),
        request_fingerprint=row.request_fingerprint,
        revision=row.revision,
    )


def _reread(tx: Tx, idempotency_key: str) -> EffectRecord:
    row = _row(tx, idempotency_key)
    assert row is not None, "the effect was written in this transaction"
    return _record(tx, row)


def _begin(tx: Tx, claim: Claim, expected_revision: int | None, operation: str) -> RunHead:
    """Check the claim (first), the revision and that the run is running."""
    head, phase = begin_transition(tx, claim.run_id, claim, expected_revision, operation)
    require_phase(head, phase, _RUNNING_ONLY, operation)
    return head


def _renew(tx: Tx, claim: Claim) -> None:
    """Renew a claim that `_begin` verified, for a call that changes nothing else."""
    tx.execute(
        q.UPDATE_LEASE_RENEW,
        {
            "run_id": claim.run_id,
            "generation": claim.generation,
            "now": tx.now,
            "expires_at": tx.now + claim.ttl_ms,
        },
    )


def _existing(tx: Tx, claim: Claim, idempotency_key: str, operation: str) -> _EffectRow:
    row = _row(tx, idempotency_key)
    if row is None:
        raise InvalidTransitionError(claim.run_id, f"no effect {idempotency_key}", operation)
    if row.run_id != claim.run_id:
        raise EffectConflictError(idempotency_key, "otherRun", "the key belongs to another run")
    return row


def _event(row: _EffectRow, **extra: Any) -> dict[str, Any]:
    return {
        "effectId": row.effect_id,
        "effectType": row.effect_type,
        "idempotencyKey": row.idempotency_key,
        **extra,
    }


# --- Reserve ------------------------------------------------------------------------


def reserve_effect(
    tx: Tx,
    claim: Claim,
    *,
    attempt_id: str,
    effect_type: str,
    idempotency_key: str,
    request: Any,
    executor_epoch: str,
    idempotent: bool = False,
    expected_revision: int | None = None,
) -> EffectReservation:
    """Reserve a managed effect before the runner calls `apply` (a protected write).

    Cases, by the stored effect under `idempotency_key`:

    - none: insert the effect `applying` with attempt 1 `applying` for
      `executor_epoch` (request JSON as a blob) → `proceed` (writes an event);
    - another request fingerprint, or another run → `EffectConflictError`;
    - `pending` (reserved elsewhere, never started): open the next attempt → `proceed`;
    - `applying` by this `executor_epoch` (a retry of the same reservation) → `proceed`;
    - `applying` by another executor epoch (its runner died, was paused or stopped
      mid-apply): an idempotent effect closes that attempt `interrupted` and opens the
      next one for `executor_epoch` → `proceed` (writes `effect_reapplied`); any other
      → `uncertain`;
    - `applied`, `rejected` or `cancelled` → `adopt` (the runner must not apply again);
    - `ambiguous` → `ambiguous` (never retried automatically).

    Only the writing cases append an event and bump the revision; the others renew the
    claim and change nothing else. Checks run first, in this order: the claim
    (`ClaimLostError`), `expected_revision`, the run is running, `attempt_id` is its
    running attempt, the request has a canonical form.

    Args:
        attempt_id: the run's running node attempt performing the effect.
        effect_type: the workflow's effect type, e.g. `payment.charge`.
        idempotency_key: derived by the engine from run ID, effect type, full compiled
            node path and visit number (never from workflow code).
        request: the effect request (JSON).
        executor_epoch: the runner epoch that will call `apply`.
        idempotent: the external system deduplicates by the key, so an interrupted
            apply may run again with it. Stored with the effect; a later reservation
            of the key must declare the same.

    Raises:
        ClaimLostError: the claim is not the run's live claim.
        RevisionConflictError: the run is not at `expected_revision`.
        InvalidTransitionError: the run is not running, or `attempt_id` is not its
            running attempt.
        EffectConflictError: the key is bound to another request or run, or was
            reserved with the other `idempotent` declaration (`idempotencyMismatch`).
        pi_workflows.wire.canonical.NotSerializableError: the request has no canonical form.
    """
    operation = "reserve effect"
    head = _begin(tx, claim, expected_revision, operation)
    current = tx.fetch_one(q.SELECT_UNFINISHED_ATTEMPT, {"run_id": claim.run_id}, NodeAttemptRow)
    if current is None or current.attempt_id != attempt_id or current.status != "running":
        raise InvalidTransitionError(claim.run_id, f"attempt {attempt_id} not running", operation)
    request_bytes = dumps(request)
    fingerprint = effect_fingerprint(effect_type, request)
    row = _row(tx, idempotency_key)
    if row is None:
        return _reserve_new(
            tx,
            claim,
            attempt_id=attempt_id,
            effect_type=effect_type,
            idempotency_key=idempotency_key,
            request_bytes=request_bytes,
            fingerprint=fingerprint,
            executor_epoch=executor_epoch,
            idempotent=idempotent,
        )
    if row.run_id != claim.run_id:
        raise EffectConflictError(idempotency_key, "otherRun", "the key belongs to another run")
    if row.request_fingerprint != fingerprint:
        raise EffectConflictError(
            idempotency_key, "requestMismatch", "the key was reserved for another request"
        )
    if bool(row.idempotent) != idempotent:
        raise EffectConflictError(
            idempotency_key,
            "idempotencyMismatch",
            "the key was reserved with another idempotent declaration",
        )
    state = EffectState(row.state)
    if state is EffectState.PENDING:
        return _open_attempt(tx, claim, row, executor_epoch, EventType.EFFECT_RESERVED)
    if (
        state is EffectState.APPLYING
        and row.idempotent
        and row.last_executor_epoch != executor_epoch
    ):
        # The external system deduplicates by the key: apply again with the same key.
        return _open_attempt(tx, claim, row, executor_epoch, EFFECT_REAPPLIED)
    _renew(tx, claim)
    if state is EffectState.APPLYING:
        decision = (
            EffectDecision.PROCEED
            if row.last_executor_epoch == executor_epoch
            else EffectDecision.UNCERTAIN
        )
    elif state is EffectState.AMBIGUOUS:
        decision = EffectDecision.AMBIGUOUS
    else:
        decision = EffectDecision.ADOPT
    return EffectReservation(
        decision, _record(tx, row), row.last_attempt_number, head.revision, changed=False
    )


def _reserve_new(
    tx: Tx,
    claim: Claim,
    *,
    attempt_id: str,
    effect_type: str,
    idempotency_key: str,
    request_bytes: bytes,
    fingerprint: str,
    executor_epoch: str,
    idempotent: bool,
) -> EffectReservation:
    effect_id = _effect_id(idempotency_key)

    def insert(tx: Tx) -> None:
        request_hash = put_blob(tx, request_bytes)
        tx.execute(
            q.INSERT_EFFECT,
            {
                "effect_id": effect_id,
                "run_id": claim.run_id,
                "attempt_id": attempt_id,
                "effect_type": effect_type,
                "idempotency_key": idempotency_key,
                "request_fingerprint": fingerprint,
                "request_hash": request_hash,
                "idempotent": int(idempotent),
                "now": tx.now,
            },
        )
        tx.execute(
            q.INSERT_EFFECT_ATTEMPT,
            {
                "effect_id": effect_id,
                "attempt_number": 1,
                "executor_epoch": executor_epoch,
                "now": tx.now,
            },
        )

    written = protected_write(
        tx,
        claim,
        event_type=EventType.EFFECT_RESERVED,
        payload={
            "effectId": effect_id,
            "effectType": effect_type,
            "idempotencyKey": idempotency_key,
            "attemptId": attempt_id,
            "attemptNumber": 1,
            "executorEpoch": executor_epoch,
            **({"idempotent": True} if idempotent else {}),
        },
        change=insert,
    )
    record = _reread(tx, idempotency_key)
    return EffectReservation(EffectDecision.PROCEED, record, 1, written.revision, changed=True)


def _open_attempt(
    tx: Tx, claim: Claim, row: _EffectRow, executor_epoch: str, event_type: str
) -> EffectReservation:
    """Start the next numbered attempt, closing a stale in-flight one: `cancelled` when
    read-back proved it did not apply, `interrupted` when an idempotent effect is
    applied again with the same key."""
    number = (row.last_attempt_number or 0) + 1
    stale = row.state == EffectState.APPLYING
    reapplied = event_type == EFFECT_REAPPLIED

    def change(tx: Tx) -> None:
        params = {"effect_id": row.effect_id, "now": tx.now}
        if stale:
            closed = ("interrupted", _INTERRUPTED) if reapplied else ("cancelled", _NOT_APPLIED)
            tx.execute(
                q.UPDATE_EFFECT_ATTEMPT_CLOSE,
                {**params, "state": closed[0], "result_hash": None, "error": closed[1]},
            )
            tx.execute(q.UPDATE_EFFECT_TOUCH, params)
        else:
            tx.execute(q.UPDATE_EFFECT_START, params)
        tx.execute(
            q.INSERT_EFFECT_ATTEMPT,
            {**params, "attempt_number": number, "executor_epoch": executor_epoch},
        )

    payload = _event(row, attemptNumber=number, executorEpoch=executor_epoch)
    if stale:
        key = "interruptedAttempt" if reapplied else "cancelledAttempt"
        payload[key] = row.last_attempt_number
    written = protected_write(tx, claim, event_type=event_type, payload=payload, change=change)
    record = _reread(tx, row.idempotency_key)
    return EffectReservation(EffectDecision.PROCEED, record, number, written.revision, True)


# --- Settle, retry, ambiguity -------------------------------------------------------


def settle_effect(
    tx: Tx,
    claim: Claim,
    *,
    idempotency_key: str,
    outcome: Literal["applied", "rejected"],
    result: Any = None,
    error: str | None = None,
    executor_epoch: str,
    proven_by_read_back: bool = False,
    expected_revision: int | None = None,
) -> EffectRecord:
    """Record the outcome of the in-flight attempt (a protected write); both are terminal.

    The in-flight attempt and the effect become `applied` (with `result`, stored as a
    blob) or `rejected` (with `error`). Only the executor that owns the in-flight attempt
    may settle it, unless `proven_by_read_back`: after an `uncertain` reservation, the
    new executor proved with read-back that the stale attempt applied (or was refused).

    Settling a terminal effect again with the same outcome, result and error changes
    nothing and returns the record (the claim is still checked and renewed).

    Raises:
        ValueError: an unknown outcome, a rejection without an error, or an applied
            outcome with an error.
        ClaimLostError: the claim is not the run's live claim.
        RevisionConflictError: the run is not at `expected_revision`.
        InvalidTransitionError: the run is not running; the key is unknown; the effect
            has no attempt in flight; or another executor owns it and the outcome was
            not proven by read-back.
        EffectConflictError: the effect belongs to another run (`otherRun`), settled
            another way (`outcomeMismatch`), or was cancelled or declared ambiguous
            (`terminal`).
        pi_workflows.wire.canonical.NotSerializableError: the result has no canonical form.
    """
    if outcome not in ("applied", "rejected"):
        raise ValueError(f"an effect settles as applied or rejected, not {outcome!r}")
    if outcome == "rejected" and not error:
        raise ValueError("a rejected effect needs an error")
    if outcome == "applied" and error is not None:
        raise ValueError("an applied effect has no error")
    operation = f"settle effect as {outcome}"
    _begin(tx, claim, expected_revision, operation)
    result_bytes = None if result is None else dumps(result)
    result_hash = None if result_bytes is None else content_digest(result_bytes)
    row = _existing(tx, claim, idempotency_key, operation)
    state = EffectState(row.state)
    if state.is_terminal:
        if state == outcome and row.result_hash == result_hash and row.error == error:
            _renew(tx, claim)
            return _record(tx, row)
        settled = state in (EffectState.APPLIED, EffectState.REJECTED)
        reason = "outcomeMismatch" if settled else "terminal"
        raise EffectConflictError(idempotency_key, reason, f"the effect is already {state}")
    if state is EffectState.PENDING:
        raise InvalidTransitionError(claim.run_id, "effect pending, no attempt", operation)
    if row.last_executor_epoch != executor_epoch and not proven_by_read_back:
        raise InvalidTransitionError(
            claim.run_id,
            f"effect attempt {row.last_attempt_number} applying by another executor",
            operation,
        )

    def settle(tx: Tx) -> None:
        if result_bytes is not None:
            put_blob(tx, result_bytes)
        params = {
            "effect_id": row.effect_id,
            "state": outcome,
            "result_hash": result_hash,
            "error": error,
            "now": tx.now,
        }
        tx.execute(q.UPDATE_EFFECT_ATTEMPT_CLOSE, params)
        tx.execute(q.UPDATE_EFFECT_SETTLE, params)

    payload = _event(
        row,
        state=outcome,
        attemptNumber=row.last_attempt_number,
        executorEpoch=executor_epoch,
        provenByReadBack=proven_by_read_back,
    )
    protected_write(tx, claim, event_type=EventType.EFFECT_SETTLED, payload=payload, change=settle)
    return _reread(tx, idempotency_key)


def retry_effect_after_read_back(
    tx: Tx,
    claim: Claim,
    *,
    idempotency_key: str,
    executor_epoch: str,
    expected_revision: int | None = None,
) -> EffectReservation:
    """Read-back proved the in-flight attempt did NOT apply: start the next attempt.

    A protected write: the in-flight attempt N becomes `cancelled` (error "not applied
    (proven by read-back)") and attempt N+1 opens `applying` for `executor_epoch`. The
    answer is `proceed` with `attempt_number` N+1; call `apply`, then `settle_effect`.

    Raises:
        ClaimLostError: the claim is not the run's live claim.
        RevisionConflictError: the run is not at `expected_revision`.
        InvalidTransitionError: the run is not running, the key is unknown, or the
            effect has no attempt in flight (`pending`: use `reserve_effect`).
        EffectConflictError: the effect belongs to another run (`otherRun`) or is
            terminal (`terminal`; an ambiguous effect is never retried automatically).
    """
    operation = "retry effect after read-back"
    _begin(tx, claim, expected_revision, operation)
    row = _existing(tx, claim, idempotency_key, operation)
    state = EffectState(row.state)
    if state.is_terminal:
        raise EffectConflictError(idempotency_key, "terminal", f"the effect is already {state}")
    if state is EffectState.PENDING:
        raise InvalidTransitionError(claim.run_id, "effect pending, no attempt", operation)
    return _open_attempt(tx, claim, row, executor_epoch, EventType.EFFECT_RETRIED)


def declare_effect_ambiguous(
    tx: Tx,
    claim: Claim,
    *,
    idempotency_key: str,
    reason: str,
    expected_revision: int | None = None,
) -> EffectRecord:
    """Make an applying effect and its in-flight attempt `ambiguous` (a protected write).

    For an effect whose outcome cannot be proven (no read-back, or read-back could not
    tell). Ambiguous is terminal for automatic retry: park the run with
    `ParkReason.EFFECT_AMBIGUOUS` (or fail it with `FailureClass.EFFECT_AMBIGUOUS`) for
    operator review. Declaring an already ambiguous effect again changes nothing.

    Raises:
        ClaimLostError: the claim is not the run's live claim.
        RevisionConflictError: the run is not at `expected_revision`.
        InvalidTransitionError: the run is not running, the key is unknown, or the
            effect never started (`pending`).
        EffectConflictError: the effect belongs to another run, or already ended
            applied, rejected or cancelled (`terminal`).
    """
    operation = "declare effect ambiguous"
    _begin(tx, claim, expected_revision, operation)
    row = _existing(tx, claim, idempotency_key, operation)
    state = EffectState(row.state)
    if state is EffectState.AMBIGUOUS:
        _renew(tx, claim)
        return _record(tx, row)
    if state.is_terminal:
        raise EffectConflictError(idempotency_key, "terminal", f"the effect is already {state}")
    if state is EffectState.PENDING:
        raise InvalidTransitionError(claim.run_id, "effect pending, no attempt", operation)

    def mark(tx: Tx) -> None:
        params = {
            "effect_id": row.effect_id,
            "state": "ambiguous",
            "result_hash": None,
            "error": reason,
            "now": tx.now,
        }
        tx.execute(q.UPDATE_EFFECT_ATTEMPT_CLOSE, params)
        tx.execute(q.UPDATE_EFFECT_SETTLE, params)

    payload = _event(row, attemptNumber=row.last_attempt_number, reason=reason)
    protected_write(tx, claim, event_type=EventType.EFFECT_AMBIGUOUS, payload=payload, change=mark)
    return _reread(tx, idempotency_key)


# --- Operator recovery --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AmbiguousEffect:
    """One ambiguous effect of a run, as an operator reviews it (no request, no key hash)."""

    effect_id: str
    effect_type: str
    idempotency_key: str
    node_path: str | None
    """The compiled path of the node that reserved it."""
    visit: int | None
    attempt_number: int | None
    """Its latest (ambiguous) attempt."""

    def to_wire(self) -> dict[str, Any]:
        """camelCase JSON for receipts and views."""
        return {
            "effectId": self.effect_id,
            "effectType": self.effect_type,
            "nodePath": self.node_path,
            "visit": self.visit,
            "attemptNumber": self.attempt_number,
        }


@dataclass(frozen=True, slots=True)
class EffectRecovery:
    """What `recover_ambiguous_effect` committed."""

    effect: AmbiguousEffect
    """The effect as it was before the recovery."""
    action: Literal["confirm", "retry"]
    next_attempt_number: int | None
    """`retry`: the number the next execution attempt gets; `confirm`: None."""
    transition: TransitionResult
    """The run's transition parked → queued (its revision and the event's)."""


def list_ambiguous_effects(reader: Reader, run_id: str) -> list[AmbiguousEffect]:
    """Return the ambiguous effects of a run, in reservation order, with their node."""
    return reader.fetch_all(q.SELECT_RUN_AMBIGUOUS_EFFECTS, {"run_id": run_id}, AmbiguousEffect)


def recover_ambiguous_effect(
    tx: Tx,
    run_id: str,
    *,
    action: Literal["confirm", "retry"],
    actor: str,
    result: Any = None,
    effect_id: str | None = None,
    expected_revision: int | None = None,
) -> EffectRecovery:
    """An operator's reviewed recovery of an ambiguous effect; the run continues.

    One lifecycle transition (no claim: a parked run holds none) of a run parked with
    `effectAmbiguous` (or paused after that), parked → queued, with one
    `effect_recovered` event that names the effect, its attempt, the action and `actor`
    (the client identity; the event's time is when):

    - `confirm`: the operator saw that the external work happened. The ambiguous
      attempt and the effect become `applied` with `result` (recovery `confirmed`). The
      next runner adopts that receipt and never applies the effect again.
    - `retry`: the operator decided to apply it once more (a duplicate is possible).
      The ambiguous attempt is marked `retried` and the effect is `pending` again, so
      the next runner's reservation opens the next numbered attempt and applies it.

    A pause on the run is cleared, as `resume_run` does.

    Raises:
        RunNotFoundError: no such run.
        ClaimLostError: someone holds a live claim on the run.
        RevisionConflictError: the run is not at `expected_revision`.
        EffectRecoveryError: `runNotAmbiguous`, `noAmbiguousEffect`, `effectRequired`
            or `resultNotAllowed` (see its codes).
        ValueError: an unknown action.
        pi_workflows.wire.canonical.NotSerializableError: the result is not plain JSON.
    """
    if action not in ("confirm", "retry"):
        raise ValueError(f"an effect recovery is confirm or retry, not {action!r}")
    operation = f"recover effect ({action})"
    peek = read_head(tx, run_id)  # RunNotFoundError first
    stored = tx.fetch_one(q.SELECT_QUEUE_ROW, {"run_id": run_id}, QueueRow)
    reason = stored.park_reason if stored is not None else None
    # Parked: with `effectAmbiguous`, or with `paused` when a pause came after it.
    if peek.status != "running" or stored is None or stored.state != "parked":
        where = peek.status if reason is None else f"{peek.status} ({reason})"
        raise EffectRecoveryError(
            run_id, "runNotAmbiguous", f"the run is {where}, not parked on an ambiguous effect"
        )
    head, phase = begin_transition(tx, run_id, None, expected_revision, operation)
    if action == "retry" and result is not None:
        raise EffectRecoveryError(run_id, "resultNotAllowed", "a retry takes no result")
    candidates = list_ambiguous_effects(tx, run_id)
    if effect_id is not None:
        candidates = [c for c in candidates if c.effect_id == effect_id]
    if not candidates:
        named = "" if effect_id is None else f" named {effect_id}"
        raise EffectRecoveryError(run_id, "noAmbiguousEffect", f"no ambiguous effect{named}")
    if len(candidates) > 1:
        raise EffectRecoveryError(
            run_id, "effectRequired", f"{len(candidates)} effects are ambiguous; name one"
        )
    effect = candidates[0]
    result_bytes = dumps(result) if action == "confirm" else None
    next_number = (effect.attempt_number or 0) + 1 if action == "retry" else None

    def change(tx: Tx) -> None:
        params = {
            "effect_id": effect.effect_id,
            "attempt_number": effect.attempt_number,
            "now": tx.now,
        }
        if result_bytes is not None:
            result_hash = put_blob(tx, result_bytes)
            tx.execute(q.UPDATE_EFFECT_ATTEMPT_CONFIRM, {**params, "result_hash": result_hash})
            tx.execute(q.UPDATE_EFFECT_CONFIRM, {**params, "result_hash": result_hash})
        else:
            tx.execute(q.UPDATE_EFFECT_ATTEMPT_RETRY, params)
            tx.execute(q.UPDATE_EFFECT_REOPEN, params)

    payload: dict[str, Any] = {
        "effectId": effect.effect_id,
        "effectType": effect.effect_type,
        "idempotencyKey": effect.idempotency_key,
        "nodePath": effect.node_path,
        "action": action,
        "attemptNumber": effect.attempt_number,
        "actor": {"kind": "operator", "clientId": actor},
        "from": phase.value,
    }
    if next_number is not None:
        payload["nextAttemptNumber"] = next_number
    transition = apply_transition(
        tx,
        head,
        phase,
        RunPhase.QUEUED,
        None,
        operation=operation,
        event_type=EFFECT_RECOVERED,
        payload=payload,
        paused=False,
        park_reason=None,
        change=change,
    )
    return EffectRecovery(effect, action, next_number, transition)


# --- Reads --------------------------------------------------------------------------


def get_effect(reader: Reader, idempotency_key: str) -> EffectRecord | None:
    """Return the effect reserved under `idempotency_key`, or None."""
    row = _row(reader, idempotency_key)
    return None if row is None else _record(reader, row)


def list_effects(reader: Reader, run_id: str) -> list[EffectRecord]:
    """Return every effect of a run, in reservation order, with results decoded."""
    rows = reader.fetch_all(q.SELECT_RUN_EFFECTS, {"run_id": run_id}, _EffectRow)
    return [_record(reader, row) for row in rows]


def count_ambiguous_effects(reader: Reader, run_id: str) -> int:
    """Return how many effects of a run are ambiguous (each needs operator review)."""
    return int(reader.fetch_value(q.COUNT_RUN_AMBIGUOUS_EFFECTS, {"run_id": run_id}))
