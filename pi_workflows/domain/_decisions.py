"""`decision.answer` and `decision.list`: people answer protected human decisions.

Implements issue 15 item 1 and workflow-server.md § Interactive Pi execution ("a person
answers it with /workflow answer through decision.answer"). Units of work for the
database actor (`decision.answer`) and the reader actor (`decision.list`); the storage
core (`storage/_decisions.py::answer_protected_decision`) does the answer itself, the
same function a channel adapter's answer goes through.

A command answer is stored as a client receipt (accepted, adopted or rejected), so a
retry of the same request adopts it; a different answer under a new key meets the
decision's own fence: the same answer is `adopted`, another is a `conflict`.
"""

from __future__ import annotations

from typing import Any, Final

from pi_workflows.domain._operations import rejected, response, stored_answer
from pi_workflows.storage import (
    CommandRequest,
    Database,
    ProtectedAnswer,
    ReceiptOutcome,
    Tx,
    answer_protected_decision,
    lookup_receipt,
    pending_protected_decisions,
    protected_decision_row,
    record_receipt,
    run_protected_decision,
)
from pi_workflows.wire.protocol import RequestMessage

__all__ = ["CLIENT_SOURCES", "answer_decision_command", "list_decisions"]

CLIENT_SOURCES: Final = ("cli", "pi")
"""Where a client's person answers (other channels answer inside the server)."""

# storage reason -> (outcome, error code) of the client answer
_REFUSALS: Final = {
    "notFound": ("notFound", "decisionNotFound"),
    "expired": ("rejected", "decisionExpired"),
    "paused": ("rejected", "runPaused"),
    "invalid": ("rejected", "answerInvalid"),
    "settled": ("rejected", "decisionSettled"),
    "answeredDifferently": ("conflict", "decisionAnswered"),
    "keyReused": ("conflict", "idempotencyConflict"),
}


def answer_decision_command(db: Database, request: RequestMessage) -> dict[str, Any]:
    """`decision.answer` (`runId`; `payload: {answer, decisionId?, sourceChannel?}`).

    The decision is the run's pending protected decision unless `decisionId` names it
    (it must belong to the run). `expectedRevision` is its answer revision (1 while
    pending; pause and resume keep it). Answers the first valid answer `accepted`
    with `{runId, decisionId, continuationRunId, provenance}`; see the module docstring
    for repeats.
    """
    payload = request["payload"]
    run_id = request.get("runId")
    source = payload.get("sourceChannel", "cli")
    if not isinstance(run_id, str) or "answer" not in payload or source not in CLIENT_SOURCES:
        return rejected(
            request,
            "rejected",
            "payloadInvalid",
            "decision.answer needs a runId and payload.answer (sourceChannel: cli or pi)",
        )
    command = CommandRequest(
        request_id=request["requestId"],
        client_id=request["clientId"],
        operation=request["operation"],
        idempotency_key=request["idempotencyKey"],
        payload={**payload, "runId": run_id, "expectedRevision": request.get("expectedRevision")},
    )
    with db.write() as tx:
        stored = stored_answer(request, lookup_receipt(tx, command))
        if stored is not None:
            return stored
        decision_id = payload.get("decisionId") or run_protected_decision(tx, run_id)
        found = protected_decision_row(tx, decision_id) if decision_id else None
        if found is None or found.run_id != run_id:
            return rejected(
                request, "notFound", "decisionNotFound", "the run has no such protected decision"
            )
        expected = request.get("expectedRevision")
        if expected is not None and expected != found.revision:
            return rejected(
                request,
                "conflict",
                "revisionConflict",
                f"the decision is at answer revision {found.revision}, not {expected}",
            )
        answered = answer_protected_decision(
            tx,
            str(decision_id),
            payload["answer"],
            source_channel=str(source),
            idempotency_key=f"{source}:{request['clientId']}:{request['idempotencyKey']}",
        )
        return _answer(tx, request, command, answered)


def _answer(
    tx: Tx, request: RequestMessage, command: CommandRequest, answered: ProtectedAnswer
) -> dict[str, Any]:
    if answered.outcome in ("accepted", "adopted"):
        body = {
            "runId": answered.run_id,
            "decisionId": answered.decision_id,
            "continuationRunId": answered.continuation_run_id,
            "provenance": answered.provenance,
        }
        record_receipt(
            tx,
            command,
            outcome=ReceiptOutcome.ACCEPTED,
            receipt=body,
            run_id=answered.run_id,
            accepted_revision=answered.revision,
        )
        return response(request, answered.outcome, receipt=body, revision=answered.revision)
    outcome, code = _REFUSALS.get(answered.reason or "", ("rejected", "answerRefused"))
    message = answered.message or "the answer was refused"
    if answered.pointer is not None:
        message = f"{message} (at {answered.pointer or '/'})"
    if outcome == "rejected":
        # A definite rejection is stored, so a retry of this request gets the same.
        error = {"code": code, "message": message[:1000]}
        record_receipt(tx, command, outcome=ReceiptOutcome.REJECTED, receipt=error)
    return rejected(request, outcome, code, message)


def list_decisions(db: Database, request: RequestMessage) -> dict[str, Any]:
    """`decision.list` (`payload: {runId?, audience?}`): pending protected decisions,
    oldest first: `{items: [{decisionId, runId, workflow, node, audience, revision,
    createdAt, expiresAt, hasDefault, paused, summary, choices, answerSchema?}]}`."""
    payload = request["payload"]
    run_id = payload.get("runId")
    audience = payload.get("audience")
    if (run_id is not None and not isinstance(run_id, str)) or (
        audience is not None and not isinstance(audience, str)
    ):
        return rejected(
            request, "rejected", "payloadInvalid", "runId and audience are strings when given"
        )
    items = [d.to_wire() for d in pending_protected_decisions(db, run_id=run_id, audience=audience)]
    return response(request, "accepted", receipt={"items": items})
