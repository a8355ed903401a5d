"""Interactive requests and their submissions (workflow-server.md § Interactive requests).

A runner proposes a request for its agent attempt under its live claim. A submission is
checked for binding and kind before any receipt lookup, then recorded `validating` until a
validation child settles it; a repeated key adopts it, another payload is a conflict.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from pi_workflows.storage import _queries as q
from pi_workflows.storage._claims import Claim, WriteResult, append_event, protected_write
from pi_workflows.storage._content import content_digest, put_blob, put_json_blob, read_json_blob
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._errors import InvalidTransitionError
from pi_workflows.storage._lifecycle import requeue_run
from pi_workflows.storage._messages import cancel_step_messages
from pi_workflows.storage._reads import run_paused
from pi_workflows.wire.canonical import dumps

__all__ = [
    "MAX_TURN_ERROR_CHARS",
    "UNPRODUCTIVE_TURN_LIMIT",
    "CarriedTurns",
    "InteractionRequestRow",
    "SubmissionOutcome",
    "SubmissionRow",
    "SubmitResult",
    "TurnOutcome",
    "adoptable_submission",
    "binding_refusal",
    "cancel_pending_request",
    "carry_turn_count",
    "continue_waiting_run",
    "interrupted_request_turns",
    "read_request",
    "read_request_for_attempt",
    "read_submission",
    "record_interaction_event",
    "record_submission",
    "record_unproductive_turn",
    "request_interaction",
    "set_unproductive_turn_ends",
    "settle_submission",
    "submission_receipt",
    "submission_run_status",
    "submission_validating",
    "submission_value",
    "unproductive_turn_ends",
    "validating_submissions",
]

UNPRODUCTIVE_TURN_LIMIT = 2
"""Unproductive turns that get a reminder; the next one fails the attempt."""

MAX_TURN_ERROR_CHARS = 2048
"""The bound of a kept provider error (the schema checks it too)."""

EVENT_INTERACTION_REQUESTED = "interaction_requested"
EVENT_UNPRODUCTIVE_TURN = "interaction_unproductive_turn"
EVENT_SUBMITTED = "interaction_submitted"
EVENT_SETTLED = "interaction_submission_settled"


class SubmissionOutcome(enum.StrEnum):
    VALIDATING = "validating"
    ACCEPTED = "accepted"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class InteractionRequestRow:
    request_id: str
    run_id: str
    attempt_id: str
    target_session_id: str | None
    kind: str
    contract_hash: str
    revision: int
    status: str
    accepted_submission_id: str | None
    unproductive_turn_ends: int
    last_turn_error: str | None


@dataclass(frozen=True, slots=True)
class SubmissionRow:
    submission_id: str
    request_id: str
    idempotency_key: str
    request_revision: int
    payload_hash: str
    outcome: str
    receipt_hash: str | None


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """What a submission resolved to: a new candidate, an adopted one, or a refusal."""

    status: str
    """`new` (validate it), `adopted` (an earlier one with this key), or a refusal code:
    `notFound`, `conflict`, `rejected` (not pending, wrong kind, paused, busy)."""
    submission: SubmissionRow | None
    request: InteractionRequestRow | None
    message: str = ""


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    """After one unproductive turn: remind the model, or fail the attempt."""

    count: int
    fail: bool


_SELECT_REQUEST = """
SELECT request_id, run_id, attempt_id, target_session_id, kind, contract_hash, revision,
       status, accepted_submission_id, unproductive_turn_ends, last_turn_error
FROM interactive_requests WHERE {where}
"""
_SELECT_SUBMISSION = """
SELECT submission_id, request_id, idempotency_key, request_revision, payload_hash, outcome,
       receipt_hash
FROM interactive_submissions WHERE {where}
"""


def read_request(reader: Reader, request_id: str) -> InteractionRequestRow | None:
    return reader.fetch_one(
        _SELECT_REQUEST.format(where="request_id = :id"), {"id": request_id}, InteractionRequestRow
    )


def read_request_for_attempt(reader: Reader, attempt_id: str) -> InteractionRequestRow | None:
    return reader.fetch_one(
        _SELECT_REQUEST.format(where="attempt_id = :id"), {"id": attempt_id}, InteractionRequestRow
    )


def read_submission(reader: Reader, submission_id: str) -> SubmissionRow | None:
    return reader.fetch_one(
        _SELECT_SUBMISSION.format(where="submission_id = :id"),
        {"id": submission_id},
        SubmissionRow,
    )


def validating_submissions(reader: Reader) -> list[SubmissionRow]:
    """Provisional candidates left by a crash (recovery step 9 validates them again)."""
    return reader.fetch_all(
        _SELECT_SUBMISSION.format(where="outcome = 'validating' ORDER BY submitted_at"),
        {},
        SubmissionRow,
    )


def request_interaction(
    tx: Tx,
    claim: Claim,
    *,
    attempt_id: str,
    request_id: str,
    kind: str,
    contract: Any,
    target_session_id: str | None = None,
    expected_revision: int | None = None,
) -> WriteResult | InteractionRequestRow:
    """Commit the request of the run's unfinished attempt (one per attempt).

    A repeat for the same attempt returns the stored row instead (a resumed runner
    adopts the request and any accepted submission).

    Raises:
        ClaimLostError: the claim is not the live claim.
        InvalidTransitionError: `attempt_id` is not the run's unfinished attempt.
    """
    existing = read_request_for_attempt(tx, attempt_id)
    if existing is not None:
        return existing
    unfinished = tx.fetch_value(
        "SELECT attempt_id FROM node_attempts WHERE run_id = :run_id "
        "AND status IN ('running', 'waiting')",
        {"run_id": claim.run_id},
    )
    if unfinished != attempt_id:
        raise InvalidTransitionError(claim.run_id, "attempt not unfinished", "request interaction")

    def insert(tx: Tx) -> None:
        tx.execute(
            "INSERT INTO interactive_requests (request_id, run_id, attempt_id, "
            "target_session_id, kind, contract_hash, status, created_at, updated_at) "
            "VALUES (:request_id, :run_id, :attempt_id, :target, :kind, :contract_hash, "
            "'pending', :now, :now)",
            {
                "request_id": request_id,
                "run_id": claim.run_id,
                "attempt_id": attempt_id,
                "target": target_session_id,
                "kind": kind,
                "contract_hash": put_json_blob(tx, contract),
                "now": tx.now,
            },
        )

    return protected_write(
        tx,
        claim,
        event_type=EVENT_INTERACTION_REQUESTED,
        payload={"attemptId": attempt_id, "requestId": request_id, "kind": kind},
        change=insert,
        expected_revision=expected_revision,
    )


def _refuse(status: str, message: str, request: InteractionRequestRow | None) -> SubmitResult:
    return SubmitResult(status, None, request, message)


def record_submission(
    tx: Tx,
    *,
    request_id: str,
    submission_id: str,
    idempotency_key: str,
    value: Any,
    kind: str = "agent",
    origin_session_id: str | None = None,
) -> SubmitResult:
    """Resolve the request, check binding and kind, then adopt or record a candidate.

    Every check comes before the payload is stored: a refusal writes no blob.

    `origin_session_id`: the origin session whose active coordinator sends this
    submission (the caller checked its epoch); None for a headless run's bridge.
    """
    request = read_request(tx, request_id)
    if request is None:
        return _refuse("notFound", "no such interactive request", None)
    refusal = binding_refusal(tx, request, origin_session_id)
    if refusal is not None:
        return _refuse("rejected", refusal, request)
    if request.kind != kind:
        if request.kind == "assistant":
            # The model called the `workflow` tool on an assistant-message step: say what to do.
            message = (
                "this step takes no workflow tool submission: answer with a normal visible "
                "reply, which becomes the step's output"
            )
            return _refuse("rejected", message, request)
        return _refuse("rejected", f"the request takes no {kind} submission", request)
    # Nothing is stored until every check has passed: a blob written here would be
    # committed with the refusal and named by no row. The output is encoded and hashed
    # only for a repeated key, or once it is accepted for validation.
    earlier = tx.fetch_one(
        _SELECT_SUBMISSION.format(where="request_id = :r AND idempotency_key = :k"),
        {"r": request_id, "k": idempotency_key},
        SubmissionRow,
    )
    if earlier is not None:
        if earlier.payload_hash != content_digest(dumps(value)):
            return _refuse("conflict", "the idempotency key was used with another output", request)
        return SubmitResult("adopted", earlier, request)
    if request.status != "pending":
        return _refuse("claimLost", f"the request is {request.status}", request)
    attempt_status = tx.fetch_value(
        "SELECT status FROM node_attempts WHERE attempt_id = :a", {"a": request.attempt_id}
    )
    if attempt_status not in ("running", "waiting"):
        # A stale bridge: its attempt ended (the run was recovered into a new attempt).
        return _refuse("claimLost", "the request's attempt is no longer running", request)
    if run_paused(tx, request.run_id):
        return _refuse("rejected", "the run is paused", request)
    if submission_validating(tx, request_id):
        return _refuse("rejected", "another submission is being validated", request)
    payload_hash = put_blob(tx, dumps(value))  # with the row that names it, in this transaction
    tx.execute(
        "INSERT INTO interactive_submissions (submission_id, request_id, idempotency_key, "
        "request_revision, payload_hash, outcome, submitted_at) VALUES (:s, :r, :k, :rev, "
        ":p, 'validating', :now)",
        {
            "s": submission_id,
            "r": request_id,
            "k": idempotency_key,
            "rev": request.revision,
            "p": payload_hash,
            "now": tx.now,
        },
    )
    record_interaction_event(
        tx,
        request.run_id,
        EVENT_SUBMITTED,
        {"requestId": request_id, "submissionId": submission_id},
    )
    row = read_submission(tx, submission_id)
    assert row is not None
    return SubmitResult("new", row, request)


@dataclass(frozen=True, slots=True)
class _Binding:
    execution_mode: str
    origin_session_id: str | None


def binding_refusal(
    reader: Reader, request: InteractionRequestRow, origin_session_id: str | None
) -> str | None:
    """Why this sender may not answer `request` (None: it may).

    A headless run's request takes its bridge's submission (no session); an interactive
    run's request takes only its origin session's coordinator. The message never names
    another session.
    """
    binding = reader.fetch_one(
        "SELECT execution_mode, origin_session_id FROM run_bindings WHERE run_id = :r",
        {"r": request.run_id},
        _Binding,
    )
    if binding is None:
        return "the request's run has no execution binding"
    if binding.execution_mode == "headless" and request.target_session_id is None:
        if origin_session_id is not None:
            return "the request belongs to a headless run; no origin session answers it"
        return None
    interactive = (
        binding.execution_mode == "interactive"
        and request.target_session_id is not None
        and request.target_session_id == binding.origin_session_id
    )
    if not interactive:
        return "the request is not bound to its run's execution mode"
    if origin_session_id is None:
        return (
            "the request waits in its origin Pi session; only that session's coordinator "
            "answers it (sessionId and coordinatorEpoch)"
        )
    if origin_session_id != request.target_session_id:
        return "the request belongs to another origin session"
    return None


def record_interaction_event(tx: Tx, run_id: str, event_type: str, payload: Any) -> int:
    """Append one run event for an interaction fact, with the run's next revision.

    The bridge holds no claim, so there is no claim check here: the caller checked the
    request (pending, its attempt unfinished) in the same transaction. The event keeps
    the run's current generation. Returns the new revision.
    """
    head = tx.fetch_one(
        "SELECT revision, generation FROM runs WHERE run_id = :id", {"id": run_id}, _Head
    )
    assert head is not None
    revision = head.revision + 1
    tx.execute(q.UPDATE_RUN_REVISION, {"run_id": run_id, "revision": revision, "now": tx.now})
    append_event(
        tx,
        run_id,
        revision=revision,
        event_type=event_type,
        generation=head.generation,
        payload=payload,
    )
    return revision


@dataclass(frozen=True, slots=True)
class _Head:
    revision: int
    generation: int


_NO_VALUE = object()


def settle_submission(
    tx: Tx,
    *,
    submission_id: str,
    accepted: bool,
    error: dict[str, str] | None = None,
    value: Any = _NO_VALUE,
) -> SubmissionRow:
    """Settle a validating candidate; acceptance settles its request in the same step.

    `value` is the accepted value when `validate` returned one (kept in the receipt
    blob; `submission_value` prefers it). A repeat for an already settled submission
    returns it unchanged. Acceptance of a request that is no longer pending (it was
    cancelled meanwhile), or of a paused run's, is recorded as a rejection.
    """
    row = read_submission(tx, submission_id)
    if row is None:
        raise InvalidTransitionError(submission_id, "unknown", "settle submission")
    if row.outcome != SubmissionOutcome.VALIDATING:
        return row
    request = read_request(tx, row.request_id)
    assert request is not None
    if accepted and request.status != "pending":
        accepted = False
        error = {"code": "submissionRejected", "message": f"the request is {request.status}"}
    if accepted and run_paused(tx, request.run_id):
        # Paused while it validated: nothing is accepted while the run is paused.
        accepted = False
        error = {"code": "submissionRejected", "message": "the run is paused; submit again"}
    outcome = SubmissionOutcome.ACCEPTED if accepted else SubmissionOutcome.REJECTED
    receipt: dict[str, Any] = {"submissionId": submission_id, "outcome": outcome.value}
    if error is not None:
        receipt["error"] = error
    if accepted and value is not _NO_VALUE:
        receipt["value"] = value
    tx.execute(
        "UPDATE interactive_submissions SET outcome = :o, receipt_hash = :h, settled_at = :now "
        "WHERE submission_id = :s",
        {"o": outcome.value, "h": put_json_blob(tx, receipt), "now": tx.now, "s": submission_id},
    )
    if accepted:
        tx.execute(
            "UPDATE interactive_requests SET status = 'settled', accepted_submission_id = :s, "
            "settled_at = :now, updated_at = :now WHERE request_id = :r AND status = 'pending'",
            {"s": submission_id, "now": tx.now, "r": row.request_id},
        )
    record_interaction_event(
        tx,
        request.run_id,
        EVENT_SETTLED,
        {"requestId": row.request_id, "submissionId": submission_id, "outcome": outcome.value},
    )
    if accepted and request.target_session_id is not None:
        continue_waiting_run(tx, request)
    settled = read_submission(tx, submission_id)
    assert settled is not None
    return settled


def continue_waiting_run(tx: Tx, request: InteractionRequestRow) -> bool:
    """An origin-session step's output was accepted: in the settlement's transaction,
    cancel the request's pending step messages and put its waiting run back in the
    admission line (`requeue_run` from waiting). The next runner replays, proposes the
    same attempt's request again, gets the accepted value and completes the attempt.

    A run that is not waiting there (a runner is already on its way, or it ended) is
    left as it is: whoever runs it next finds the accepted submission. True: requeued.
    """
    cancel_step_messages(tx, request.request_id)
    tx.execute(
        "UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = :r", {"r": request.run_id}
    )
    waiting = tx.fetch_value(
        "SELECT 1 FROM runs r JOIN run_queue q ON q.run_id = r.run_id "
        "JOIN node_attempts a ON a.attempt_id = :a AND a.status = 'waiting' "
        "WHERE r.run_id = :r AND r.status = 'waiting' AND q.state = 'parked' AND r.paused = 0",
        {"r": request.run_id, "a": request.attempt_id},
    )
    if waiting is None:
        return False
    requeue_run(tx, request.run_id, reason="interactionAccepted")
    return True


def submission_receipt(reader: Reader, row: SubmissionRow) -> dict[str, Any] | None:
    """The stored receipt of a settled submission (None while it validates)."""
    if row.receipt_hash is None:
        return None
    value = read_json_blob(reader, row.receipt_hash)
    assert isinstance(value, dict)
    return value


def submission_value(reader: Reader, row: SubmissionRow) -> Any:
    """The value the step gets: what `validate` returned, else the submitted output."""
    receipt = submission_receipt(reader, row)
    if receipt is not None and "value" in receipt:
        return receipt["value"]
    return read_json_blob(reader, row.payload_hash)


def submission_validating(reader: Reader, request_id: str) -> bool:
    """Whether a submission of the request is being validated."""
    found = reader.fetch_value(q.SELECT_SUBMISSION_VALIDATING, {"request_id": request_id})
    return found is not None


def submission_run_status(reader: Reader, submission_id: str) -> str | None:
    """The status of the run whose request the submission answers (None: no submission)."""
    value = reader.fetch_value(q.SELECT_SUBMISSION_RUN_STATUS, {"submission_id": submission_id})
    return None if value is None else str(value)


def cancel_pending_request(tx: Tx, request_id: str) -> None:
    """Cancel the request if it is still pending (its attempt failed), in the caller's
    transaction, which holds the claim check, event and revision."""
    tx.execute(q.UPDATE_REQUEST_CANCEL, {"request_id": request_id, "now": tx.now})


def unproductive_turn_ends(reader: Reader, request_id: str) -> int | None:
    """The request's unproductive-turn count so far, when a turn that just ended counts:
    the request is pending with nothing accepted or validating, and its run is neither
    paused nor finished. None: the ended turn does not count."""
    value = reader.fetch_value(q.SELECT_UNPRODUCTIVE_TURN_ENDS, {"request_id": request_id})
    return None if value is None else int(value)


def set_unproductive_turn_ends(tx: Tx, request_id: str, count: int) -> None:
    """Store an origin-session step's unproductive-turn count, in the caller's transaction
    (its event and revision are the caller's)."""
    tx.execute(
        q.UPDATE_REQUEST_UNPRODUCTIVE_TURNS,
        {"count": count, "request_id": request_id, "now": tx.now},
    )


@dataclass(frozen=True, slots=True)
class CarriedTurns:
    """An interrupted request's unproductive-turn count, carried to its successor."""

    unproductive_turn_ends: int
    last_turn_error: str | None


def interrupted_request_turns(reader: Reader, run_id: str, attempt_id: str) -> CarriedTurns | None:
    """The turn count of the latest request of an interrupted attempt of the same node
    visit as `attempt_id` (a runner died mid-step), if any."""
    return reader.fetch_one(
        q.SELECT_INTERRUPTED_REQUEST_TURNS,
        {"run_id": run_id, "attempt_id": attempt_id},
        CarriedTurns,
    )


def carry_turn_count(tx: Tx, request_id: str, carried: CarriedTurns) -> None:
    """The new request continues the carried count, in the transaction that inserted it."""
    tx.execute(
        q.UPDATE_REQUEST_TURNS_CARRIED,
        {
            "count": carried.unproductive_turn_ends,
            "last_turn_error": carried.last_turn_error,
            "request_id": request_id,
        },
    )


def record_unproductive_turn(
    tx: Tx,
    claim: Claim,
    *,
    request_id: str,
    error: str | None = None,
    expected_revision: int | None = None,
) -> TurnOutcome:
    """Count one turn that ended with the request pending and no accepted or validating
    submission; 1 and 2 get a reminder, above 2 the attempt fails (the caller fails it)."""
    request = read_request(tx, request_id)
    if request is None or request.run_id != claim.run_id:
        raise InvalidTransitionError(request_id, "unknown", "count unproductive turn")
    count = request.unproductive_turn_ends + 1
    kept = None if error is None else error[:MAX_TURN_ERROR_CHARS]

    def bump(tx: Tx) -> None:
        tx.execute(
            "UPDATE interactive_requests SET unproductive_turn_ends = :c, last_turn_error = :e, "
            "updated_at = :now WHERE request_id = :r",
            {"c": count, "e": kept, "now": tx.now, "r": request_id},
        )

    protected_write(
        tx,
        claim,
        event_type=EVENT_UNPRODUCTIVE_TURN,
        payload={"requestId": request_id, "count": count, "providerError": error is not None},
        change=bump,
        expected_revision=expected_revision,
    )
    return TurnOutcome(count, count > UNPRODUCTIVE_TURN_LIMIT)


def contract_digest(contract: Any) -> bytes:
    """Canonical bytes of a contract (the runner hashes the same bytes)."""
    return dumps(contract)


def adoptable_submission(reader: Reader, attempt_id: str) -> SubmissionRow | None:
    """The accepted submission of an earlier, interrupted attempt of the same step visit.

    A runner that died after its step's output was accepted and before the node result
    was written left that attempt `interrupted`; the next runner starts a new attempt of
    the same node and visit. The accepted output is then the step's output: it is never
    lost, and the step is never asked for again.
    """
    return reader.fetch_one(
        "SELECT s.submission_id, s.request_id, s.idempotency_key, s.request_revision, "
        "s.payload_hash, s.outcome, s.receipt_hash "
        "FROM node_attempts current "
        "JOIN node_attempts earlier ON earlier.run_id = current.run_id "
        "AND earlier.node_path = current.node_path AND earlier.visit = current.visit "
        "AND earlier.attempt_id != current.attempt_id AND earlier.status = 'interrupted' "
        "JOIN interactive_requests r ON r.attempt_id = earlier.attempt_id "
        "JOIN interactive_submissions s ON s.submission_id = r.accepted_submission_id "
        "WHERE current.attempt_id = :attempt AND s.outcome = 'accepted' "
        "ORDER BY earlier.started_at DESC LIMIT 1",
        {"attempt": attempt_id},
        SubmissionRow,
    )


def supersede_earlier_requests(tx: Tx, attempt_id: str) -> int:
    """Cancel the pending requests of earlier, interrupted attempts of the same step visit.

    Called in the transaction that commits the new attempt's request, after
    `adoptable_submission` found nothing accepted. A submission of the old request that
    is still validating (its runner died meanwhile) is then rejected when it settles
    (`settle_submission` accepts only for a pending request): the step is asked again
    exactly once, and no second output is ever accepted for it.
    """
    return tx.execute(
        "UPDATE interactive_requests SET status = 'cancelled', settled_at = :now, "
        "updated_at = :now WHERE status = 'pending' AND attempt_id IN ("
        "SELECT earlier.attempt_id FROM node_attempts current "
        "JOIN node_attempts earlier ON earlier.run_id = current.run_id "
        "AND earlier.node_path = current.node_path AND earlier.visit = current.visit "
        "AND earlier.attempt_id != current.attempt_id AND earlier.status = 'interrupted' "
        "WHERE current.attempt_id = :attempt)",
        {"attempt": attempt_id, "now": tx.now},
    )


def earlier_submission_validating(reader: Reader, attempt_id: str) -> bool:
    """Whether a submission of an earlier, interrupted attempt of the same step visit is
    still validating (its runner, or the server, died meanwhile; recovery step 9 or its
    child settles it). The new attempt waits for that outcome before it asks again, so an
    output that is about to be accepted is adopted, never asked for twice."""
    count = reader.fetch_value(
        "SELECT count(*) FROM node_attempts current "
        "JOIN node_attempts earlier ON earlier.run_id = current.run_id "
        "AND earlier.node_path = current.node_path AND earlier.visit = current.visit "
        "AND earlier.attempt_id != current.attempt_id AND earlier.status = 'interrupted' "
        "JOIN interactive_requests r ON r.attempt_id = earlier.attempt_id "
        "JOIN interactive_submissions s ON s.request_id = r.request_id "
        "WHERE current.attempt_id = :attempt AND s.outcome = 'validating'",
        {"attempt": attempt_id},
    )
    return bool(count)
