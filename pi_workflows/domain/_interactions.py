"""`interaction.submit` and `interaction.update`: the units of database work.

Implements workflow-server.md § Interactive Pi execution (submissions) and
client-protocol.md § Commands and uncertain results for the bridge's two operations.
Each function here is one unit for the database actor: it takes data, opens its own
transaction and returns data; the validations actor (`actors/_validations.py`) holds
the responses and the validation children. The wire shapes are those of
`/work/briefs/i12-contract.md`:

- submit: `payload = {interactionId, submissionId, value}` → held until the durable
  outcome: `accepted` (new), `adopted` (a repeat of an accepted one), `rejected`
  (`submissionRejected`, with the actionable message), `conflict`, `claimLost`,
  `notFound`;
- update: `payload = {interactionId, update: {type, key, data}}` → `accepted`, recorded
  as a run event (the run's history), never the step's result.

An interactive run's request (its step waits in the origin Pi session) takes both from
that session's coordinator only: the payload adds `sessionId` and `coordinatorEpoch`
(the epoch of the coordinator's `sessionView` grant), and the request must come on the
connection that holds that active epoch. Session ownership, authority and request kind
are checked before any receipt lookup or change; a wrong session or a fenced epoch is
`rejected` (`submissionRefused`, `coordinatorFenced`). An accepted origin-session
output requeues the waiting run in the settlement's transaction
(`storage/_interactions.py` `continue_waiting_run`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import msgspec

from pi_workflows.domain._epochs import ActiveEpochs
from pi_workflows.domain._operations import (
    OperationContext,
    handle_operation,
    rejected,
    response,
    stored_answer,
)
from pi_workflows.domain._runner_launch import launch_state
from pi_workflows.storage import (
    MAX_FOLLOW_UP_CHARS,
    CommandRequest,
    Database,
    ReceiptOutcome,
    SubmissionRow,
    Tx,
    add_follow_up,
    binding_refusal,
    chain_leaf,
    decision_audience,
    get_attempt,
    get_run,
    interactive_origin_session,
    lookup_receipt,
    read_json_blob,
    read_request,
    record_interaction_event,
    record_receipt,
    record_submission,
    run_paused,
    settle_submission,
    submission_receipt,
    submission_run_status,
    validating_submissions,
)
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.framing import MAX_FRAME_BYTES
from pi_workflows.wire.protocol import RequestMessage

__all__ = [
    "MAX_REJECTION_CHARS",
    "PROTECTED_REFUSAL",
    "SUBMISSION_REJECTED",
    "SessionAuthority",
    "SettledSubmission",
    "SubmitStep",
    "ValidationJob",
    "add_follow_up_command",
    "answer_from_session",
    "held_answer",
    "settle_validation",
    "submit_interaction",
    "update_interaction",
    "validations_to_resume",
]

SUBMISSION_REJECTED = "submissionRejected"
MAX_REJECTION_CHARS = 1000
"""The bound of the actionable message returned to the model (a safe error's bound)."""
EVENT_UPDATE = "interaction_update"
_MAX_ID = 256


@dataclass(frozen=True, slots=True)
class ValidationJob:
    """Everything a validation child needs, as one frame (it never opens the database)."""

    submission_id: str
    frame: dict[str, Any] = field(repr=False)
    """The `validation.request` frame: holds the submitted output (never logged)."""


@dataclass(frozen=True, slots=True)
class SubmitStep:
    """What the actor does with one `interaction.submit`: answer now, or hold it until
    `wait_for` settles (and start `job`'s child when the submission is new)."""

    answer: dict[str, Any] | None = None
    wait_for: str | None = None
    adopted: bool = False
    job: ValidationJob | None = None


@dataclass(frozen=True, slots=True)
class SettledSubmission:
    submission_id: str
    receipt: dict[str, Any] = field(repr=False)
    requeued: bool = False
    """The acceptance put an origin-session step's waiting run back in the line."""


def _id(payload: dict[str, Any], name: str) -> str | None:
    value = payload.get(name)
    if isinstance(value, str) and 0 < len(value) <= _MAX_ID and value.isprintable():
        return value
    return None


@dataclass(frozen=True, slots=True)
class SessionAuthority:
    """Who sends a submission or update: the connection, and what it may hold."""

    connection_id: str
    epochs: ActiveEpochs = field(repr=False)


class _RefusedError(Exception):
    """A request the sender may not make (the answer is ready)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__(answer.get("error", {}).get("code", "refused"))
        self.answer = answer


def _sender_session(request: RequestMessage, authority: SessionAuthority | None) -> str | None:
    """The origin session a request speaks for, once its coordinator authority is
    checked; None when it names none (a headless bridge).

    Raises:
        _RefusedError: a malformed authority, or a connection without that active epoch.
    """
    payload = request["payload"]
    if "sessionId" not in payload and "coordinatorEpoch" not in payload:
        return None
    session = _id(payload, "sessionId")
    epoch = payload.get("coordinatorEpoch")
    if session is None or isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise _RefusedError(
            rejected(
                request,
                "rejected",
                "payloadInvalid",
                "an origin-session request needs sessionId and a positive coordinatorEpoch",
            )
        )
    if authority is None or not authority.epochs.is_active(session, authority.connection_id, epoch):
        raise _RefusedError(
            rejected(
                request,
                "rejected",
                "coordinatorFenced",
                "this connection does not hold the session's active coordinator epoch; "
                "subscribe to the session view as its coordinator and use that epoch",
            )
        )
    return session


def held_answer(
    request: RequestMessage, receipt: dict[str, Any], *, adopted: bool
) -> dict[str, Any]:
    """The response a settled submission gives `request` (new or a repeat)."""
    if receipt.get("outcome") == "accepted":
        wire = {"submissionId": receipt["submissionId"], "status": "accepted"}
        return response(request, "adopted" if adopted else "accepted", receipt=wire)
    error = receipt.get("error") or {}
    return rejected(
        request,
        "rejected",
        str(error.get("code") or SUBMISSION_REJECTED),
        str(error.get("message") or "the submission was rejected"),
    )


def submit_interaction(
    db: Database,
    request: RequestMessage,
    agent_dir: Path,
    authority: SessionAuthority | None = None,
) -> SubmitStep:
    """Resolve the request, check binding, session authority and kind, then adopt,
    refuse or record a `validating` candidate (and the event) in one transaction."""
    payload = request["payload"]
    interaction_id, submission_id = _id(payload, "interactionId"), _id(payload, "submissionId")
    if interaction_id is None or submission_id is None or "value" not in payload:
        return SubmitStep(
            rejected(
                request,
                "rejected",
                "payloadInvalid",
                "interaction.submit needs interactionId, submissionId and value",
            )
        )
    try:
        session = _sender_session(request, authority)
    except _RefusedError as refused:
        return SubmitStep(refused.answer)
    with db.write() as tx:
        found = read_request(tx, interaction_id)
        if found is not None and request.get("runId", found.run_id) != found.run_id:
            found = None  # another run's request is no request of this run
        if found is None:
            return SubmitStep(
                rejected(request, "notFound", "requestNotFound", "no such interactive request")
            )
        try:
            # Undone as a whole when the candidate turns out too large to validate: a
            # refused submission stores nothing (no row, no payload blob, no event).
            with tx.undoable():
                result = record_submission(
                    tx,
                    request_id=interaction_id,
                    submission_id=submission_id,
                    idempotency_key=request["idempotencyKey"],
                    value=payload["value"],
                    origin_session_id=session,
                )
                new = result.submission if result.status == "new" else None
                job = None if new is None else _validation_job(tx, new, agent_dir)
        except _TooLargeError:
            return SubmitStep(
                rejected(
                    request,
                    "rejected",
                    SUBMISSION_REJECTED,
                    "the output and the run's state are too large to validate",
                )
            )
        if result.status == "adopted":
            assert result.submission is not None
            receipt = submission_receipt(tx, result.submission)
            if receipt is None:
                # Still validating: wait on the stored submission's outcome. The job lets
                # the actor start a child if none validates it (one per candidate).
                row = result.submission
                return SubmitStep(
                    wait_for=row.submission_id, adopted=True, job=_job(tx, row, agent_dir)
                )
            return SubmitStep(held_answer(request, receipt, adopted=True))
        if result.status != "new" or job is None:
            return SubmitStep(_refusal(request, result.status, result.message))
    return SubmitStep(wait_for=submission_id, job=job)


class _TooLargeError(Exception):
    """The validation request (the output and the run's state) would not fit one frame."""


def _refusal(request: RequestMessage, status: str, message: str) -> dict[str, Any]:
    codes = {
        "notFound": ("notFound", "requestNotFound"),
        "conflict": ("conflict", "idempotencyConflict"),
        "claimLost": ("claimLost", "requestNotPending"),
    }
    outcome, code = codes.get(status, ("rejected", "submissionRefused"))
    return rejected(request, outcome, code, message)


def _validation_job(tx: Tx, row: SubmissionRow, agent_dir: Path) -> ValidationJob:
    """A new candidate's job, measured.

    Raises:
        _TooLargeError: its frame (the output and the run's state) is over the frame cap.
    """
    job = _job(tx, row, agent_dir)
    if len(dumps(job.frame)) > MAX_FRAME_BYTES:
        raise _TooLargeError
    return job


def _job(tx: Tx, row: SubmissionRow, agent_dir: Path) -> ValidationJob:
    """The child's request: the run's workflow, the node, its committed state, the value."""
    request = read_request(tx, row.request_id)
    assert request is not None
    run = get_run(tx, request.run_id)
    assert run is not None
    attempt = get_attempt(tx, request.attempt_id)
    assert attempt is not None
    state, _ = launch_state(tx, request.run_id)
    frame = {
        "kind": "validation.request",
        "runId": request.run_id,
        "interactionId": request.request_id,
        "submissionId": row.submission_id,
        "workflowSource": json.loads(run.source_identity),
        "definitionDigest": run.definition_digest,
        "projectPath": run.project_path,
        "agentDir": str(agent_dir),
        "nodePath": attempt.node_path,
        "visit": attempt.visit,
        "state": msgspec.to_builtins(state),
        "value": read_json_blob(tx, row.payload_hash),
    }
    return ValidationJob(row.submission_id, frame)


def settle_validation(
    db: Database, submission_id: str, report: dict[str, Any] | None, reason: str
) -> SettledSubmission:
    """Settle a candidate from its child's report; None (the child stopped first, or
    overran) rejects it with `reason`. Acceptance settles the request, same transaction."""
    accepted, error, value, has_value = False, None, None, False
    body = report.get("payload") if isinstance(report, dict) else None
    if isinstance(body, dict) and body.get("submissionId") == submission_id:
        if report is not None and report.get("kind") == "interaction.accepted":
            accepted, has_value, value = True, "value" in body, body.get("value")
        elif report is not None and report.get("kind") == "interaction.rejected":
            message = (body.get("error") or {}).get("message")
            error = {
                "code": SUBMISSION_REJECTED,
                "message": str(message or "the output was rejected")[:MAX_REJECTION_CHARS],
            }
    if not accepted and error is None:
        error = {"code": SUBMISSION_REJECTED, "message": reason[:MAX_REJECTION_CHARS]}
    with db.write() as tx:
        before = submission_run_status(tx, submission_id)
        if accepted and has_value:
            row = settle_submission(tx, submission_id=submission_id, accepted=True, value=value)
        else:
            row = settle_submission(tx, submission_id=submission_id, accepted=accepted, error=error)
        receipt = submission_receipt(tx, row)
        assert receipt is not None
        requeued = before == "waiting" and submission_run_status(tx, submission_id) == "queued"
    return SettledSubmission(submission_id, receipt, requeued)


def validations_to_resume(db: Database, agent_dir: Path) -> list[ValidationJob]:
    """Recovery step 9: every candidate a dead server left `validating`, as a new job."""
    # A read (the reader actor's snapshot), not a write: a start commits nothing more.
    # `launch_state` and `_job` only read, so the snapshot may stand in for a `Tx`.
    reader = cast(Tx, db)
    return [_job(reader, row, agent_dir) for row in validating_submissions(db)]


def update_interaction(
    db: Database, request: RequestMessage, authority: SessionAuthority | None = None
) -> dict[str, Any]:
    """Record a progress update as a run event, with a stored receipt (a retry adopts).

    The binding and the sender's session authority are checked before the receipt
    lookup; the request's state after it (so a retry of a recorded update adopts)."""
    payload = request["payload"]
    interaction_id = _id(payload, "interactionId")
    update = payload.get("update")
    if interaction_id is None or not isinstance(update, dict):
        return rejected(
            request,
            "rejected",
            "payloadInvalid",
            "interaction.update needs interactionId and update",
        )
    command = CommandRequest(
        request_id=request["requestId"],
        client_id=request["clientId"],
        operation=request["operation"],
        idempotency_key=request["idempotencyKey"],
        # The epoch is transport authority, like the request ID: a retry after a
        # reconnect carries a newer one and must still adopt.
        payload=_without_epoch(payload),
    )
    try:
        session = _sender_session(request, authority)
    except _RefusedError as refused:
        return refused.answer
    with db.write() as tx:
        row = read_request(tx, interaction_id)
        if row is None or request.get("runId", row.run_id) != row.run_id:
            return rejected(request, "notFound", "requestNotFound", "no such interactive request")
        bound = binding_refusal(tx, row, session)
        if bound is not None:
            return _refusal(request, "rejected", bound)
        stored = stored_answer(request, lookup_receipt(tx, command))
        if stored is not None:
            return stored
        refusal = _update_refusal(tx, row.run_id, row.status, row.attempt_id)
        if refusal is not None:
            return _refusal(request, refusal[0], refusal[1])
        revision = record_interaction_event(
            tx,
            row.run_id,
            EVENT_UPDATE,
            {
                "requestId": interaction_id,
                "type": update.get("type"),
                "key": update.get("key"),
                "data": update.get("data"),
            },
        )
        body = {"interactionId": interaction_id, "recorded": True}
        record_receipt(
            tx,
            command,
            outcome=ReceiptOutcome.ACCEPTED,
            receipt=body,
            run_id=row.run_id,
            accepted_revision=revision,
        )
    result = response(request, "accepted", receipt=body)
    result["revision"] = revision
    return result


def _without_epoch(payload: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in payload.items() if key != "coordinatorEpoch"}


# --- run.answer from an origin session -----------------------------------------------

PROTECTED_REFUSAL = (
    "a protected human decision is answered only by a person, with /workflow answer or "
    "`pi-workflows decision answer`; the workflow tool cannot answer it"
)


def answer_from_session(
    db: Database,
    request: RequestMessage,
    ctx: OperationContext,
    authority: SessionAuthority | None = None,
) -> dict[str, Any]:
    """`run.answer` with an origin session's coordinator authority (the model-facing
    `answer` of an ordinary checkpoint).

    Authority, the run's session binding and the decision's kind are checked before the
    receipt lookup; then it is the CLI's `run.answer` (`answer_checkpoint`: one
    resolution, the continuation run, the parent settled by it, one transaction), with
    the epoch left out of the stored fingerprint so a retry with a newer epoch adopts.
    """
    try:
        session = _sender_session(request, authority)
    except _RefusedError as refused:
        return refused.answer
    run_id = request.get("runId")
    if session is None or not isinstance(run_id, str):
        return rejected(
            request,
            "rejected",
            "payloadInvalid",
            "an origin-session answer names its runId, sessionId and coordinatorEpoch",
        )
    bound = interactive_origin_session(db, run_id)
    if get_run(db, run_id) is None:
        return rejected(request, "notFound", "runNotFound", "no such run")
    if bound != session:
        return rejected(
            request,
            "rejected",
            "answerRefused",
            "the run does not belong to this origin session",
        )
    # A protected decision (`human_decision`) is answered only by a person, through
    # decision.answer: the model's tool is refused before anything is looked up.
    audience = decision_audience(db, run_id)
    if audience is not None and audience != "checkpoint":
        return rejected(request, "rejected", "protectedDecision", PROTECTED_REFUSAL)
    stripped = cast(RequestMessage, {**request, "payload": _without_epoch(request["payload"])})
    return handle_operation(db, stripped, ctx)


def _update_refusal(tx: Tx, run_id: str, status: str, attempt_id: str) -> tuple[str, str] | None:
    if status != "pending":
        return "claimLost", f"the request is {status}"
    attempt = get_attempt(tx, attempt_id)
    if attempt is None or attempt.status not in ("running", "waiting"):
        return "claimLost", "the request's attempt is no longer running"
    if run_paused(tx, run_id):
        return "rejected", "the run is paused"
    return None


# --- followUp.add ----------------------------------------------------------------------

EVENT_FOLLOW_UP_ADDED = "follow_up_added"
_NOT_COMPLETED = frozenset({"failed", "timed_out", "cancelled"})
"""The terminal statuses after which a follow-up is never delivered."""


def add_follow_up_command(db: Database, request: RequestMessage) -> dict[str, Any]:
    """`followUp.add` (`payload: {text}`, `runId`): queue text for the run's origin
    session, delivered after its chain's final completed outcome and terminal turn, in
    order (`storage/_follow_ups.py`). A user command with a stored receipt; the text is
    a blob and appears in no event."""
    payload = request["payload"]
    text = payload.get("text")
    run_id = request.get("runId")
    if not isinstance(run_id, str) or not isinstance(text, str) or not text.strip():
        return rejected(
            request, "rejected", "payloadInvalid", "followUp.add needs a runId and payload.text"
        )
    if len(text) > MAX_FOLLOW_UP_CHARS:
        return rejected(
            request,
            "rejected",
            "followUpTooLong",
            f"a follow-up is at most {MAX_FOLLOW_UP_CHARS} characters",
        )
    command = CommandRequest(
        request_id=request["requestId"],
        client_id=request["clientId"],
        operation=request["operation"],
        idempotency_key=request["idempotencyKey"],
        payload=dict(payload),
    )
    with db.write() as tx:
        stored = stored_answer(request, lookup_receipt(tx, command))
        if stored is not None:
            return stored
        if get_run(tx, run_id) is None:
            return rejected(request, "notFound", "runNotFound", "no such run")
        session = interactive_origin_session(tx, run_id)
        if session is None:
            return rejected(
                request,
                "rejected",
                "noOriginSession",
                "a follow-up goes to the run's origin Pi session; a headless run has none",
            )
        last = get_run(tx, chain_leaf(tx, run_id))
        ended = last.status if last is not None and last.status in _NOT_COMPLETED else None
        if ended is not None:
            return rejected(
                request,
                "rejected",
                "runNotCompleted",
                f"the run is {ended}: follow-ups are delivered only after a completed outcome",
            )
        row = add_follow_up(tx, run_id, str(session), text)
        revision = record_interaction_event(
            tx, run_id, EVENT_FOLLOW_UP_ADDED, {"followUpId": row.follow_up_id}
        )
        if row.message_id is not None:  # everything it waits for was done: presented now
            leaf = chain_leaf(tx, run_id)
            created = record_interaction_event(
                tx,
                leaf,
                "workflow_message_created",
                {"messageId": row.message_id, "kind": "follow_up"},
            )
            if leaf == run_id:
                revision = created
        body = {"followUpId": row.follow_up_id, "state": row.state}
        record_receipt(
            tx,
            command,
            outcome=ReceiptOutcome.ACCEPTED,
            receipt=body,
            run_id=run_id,
            accepted_revision=revision,
        )
    result = response(request, "accepted", receipt=body)
    result["revision"] = revision
    return result
