"""The timeout paths that run without a runner: interactive agent steps, and protected
human decisions whose default answer wins at their deadline.

Implements workflow-server.md § Interactive Pi execution ("If the deadline passes, one
control claim atomically closes the stale request and schedules a supervised
timeout-resume child") and § Recovery step 8. Units of database work over data; the
deadlines actor (`actors/_deadlines.py`) decides when to run them, startup recovery
runs `expire_due` before anything else is scheduled.

One transaction per expired request, under a new control claim (a new generation, so
anything still holding the old one is fenced):

1. the waiting attempt ends `timed_out` (the same attempt row, its `deadline_at` kept),
2. the request is closed (`cancelled`) and its pending step messages are cancelled, so
   a late submission, or a validation that reports after this, cannot be accepted,
3. one `interaction_timed_out` event, then the run is requeued (`nodeTimedOut`), which
   releases the control claim.

The timeout-resume child is the next runner the scheduler launches through the process
supervisor: its state names the attempt `timed_out`, so it follows a `$result.outcome`
edge for `timed_out`, or ends the run `timed_out` (terminal: the session reservation is
released in that transaction). This is the same vocabulary and the same runner rule as a
headless node that overran its deadline (`domain/_runner_exits.py`).

A protected decision with `on_timeout` (workflow-server.md § Interactive Pi execution:
"When a protected decision reaches its saved onTimeout deadline ..."): one transaction
each (`storage/_decisions.py::time_out_protected_decision`) takes a control claim on the
waiting parent, records the validated default as the one resolution (provenance
`timeout`), closes the decision and its pending message, queues the continuation and
completes the parent (releasing the claim). Decisions run before requests, and so first
in recovery. A paused run's default waits for its resume.
"""

from __future__ import annotations

import logging
from typing import Final

from pi_workflows.storage import (
    ClaimHeldError,
    ClaimLostError,
    Database,
    DueRequest,
    InvalidTransitionError,
    OwnerType,
    Tx,
    acquire_claim,
    cancel_step_messages,
    close_attempt,
    due_decisions,
    due_requests,
    next_decision_due,
    next_due_at,
    protected_write,
    requeue_run,
    time_out_protected_decision,
    time_out_request,
)
from pi_workflows.storage import suspend_session_time as _suspend_session

__all__ = [
    "EVENT_INTERACTION_TIMED_OUT",
    "TIMED_OUT_ERROR",
    "TIMEOUT_CLAIM_TTL_MS",
    "TIMEOUT_REASON",
    "expire_due",
    "expire_due_decisions",
    "next_deadline",
    "suspend_session",
]

log = logging.getLogger(__name__)

EVENT_INTERACTION_TIMED_OUT: Final = "interaction_timed_out"
TIMEOUT_REASON: Final = "nodeTimedOut"
"""The requeue reason, as for a headless node stopped past its deadline."""
TIMED_OUT_ERROR: Final = (
    "nodeTimedOut: the step used its timeout during model turns of its origin session"
)
TIMEOUT_CLAIM_TTL_MS: Final = 30_000
"""The control claim lives only inside its transaction (the requeue releases it)."""


def next_deadline(db: Database) -> int | None:
    """A read for the deadlines actor: the earliest instant a budget runs out or a
    protected decision's default wins."""
    instants = [next_due_at(db, db.clock.now_ms()), next_decision_due(db)]
    return min((at for at in instants if at is not None), default=None)


def expire_due(db: Database, owner_id: str) -> list[str]:
    """Apply every due deadline; returns the run IDs it changed.

    Protected decisions first (their default wins, provenance `timeout`), then pending
    requests whose budget ran out. Each is its own `write()` (a savepoint of the group
    commit), so one that changed meanwhile (an answer or a submission was accepted
    first, the run was paused or cancelled) is skipped and the others still commit.
    """
    expired = expire_due_decisions(db, owner_id)
    now = db.clock.now_ms()
    for due in due_requests(db):
        if not due.expired(now):
            continue
        try:
            with db.write() as tx:
                if _expire(tx, due, owner_id):
                    expired.append(due.run_id)
        except (InvalidTransitionError, ClaimHeldError, ClaimLostError) as exc:
            log.info(
                "interaction deadline not applied",
                extra={
                    "action": "interaction.timeout_skipped",
                    "run_id": due.run_id,
                    "reason": type(exc).__name__,
                },
            )
    return expired


def _expire(tx: Tx, due: DueRequest, owner_id: str) -> bool:
    """The one transaction: re-check inside it, take the control claim, close, requeue."""
    current = next((row for row in due_requests(tx) if row.request_id == due.request_id), None)
    if current is None or not current.expired(tx.now):
        return False  # settled, paused or resumed since the read: nothing to do
    claim = acquire_claim(
        tx,
        due.run_id,
        owner_type=OwnerType.CONTROL,
        owner_id=owner_id,
        ttl_ms=TIMEOUT_CLAIM_TTL_MS,
    )

    def close(tx: Tx) -> None:
        close_attempt(tx, due.attempt_id, status="timed_out", error=TIMED_OUT_ERROR)
        time_out_request(tx, due.request_id)
        cancel_step_messages(tx, due.request_id)

    protected_write(
        tx,
        claim,
        event_type=EVENT_INTERACTION_TIMED_OUT,
        payload={"requestId": due.request_id, "attemptId": due.attempt_id},
        change=close,
    )
    requeue_run(tx, due.run_id, reason=TIMEOUT_REASON, claim=claim)
    log.info(
        "interactive step timed out",
        extra={"action": "interaction.timed_out", "run_id": due.run_id},
    )
    return True


def expire_due_decisions(db: Database, owner_id: str) -> list[str]:
    """Let the default answer win every protected decision whose deadline passed (one
    transaction each: `time_out_protected_decision`); returns the parents' run IDs."""
    decided: list[str] = []
    now = db.clock.now_ms()
    for due in due_decisions(db):
        if due.expires_at > now:
            break  # earliest first: the rest are not due either
        try:
            with db.write() as tx:
                continuation = time_out_protected_decision(
                    tx, due.decision_id, owner_id=owner_id, ttl_ms=TIMEOUT_CLAIM_TTL_MS
                )
        except (InvalidTransitionError, ClaimHeldError, ClaimLostError) as exc:
            log.info(
                "decision deadline not applied",
                extra={
                    "action": "decision.timeout_skipped",
                    "run_id": due.run_id,
                    "reason": type(exc).__name__,
                },
            )
            continue
        if continuation is None:
            continue
        decided.append(due.run_id)
        log.info(
            "protected decision timed out: its default answer won",
            extra={"action": "decision.timed_out", "run_id": due.run_id},
        )
    return decided


def suspend_session(db: Database, session_id: str) -> int:
    """A unit for the coordinator-epoch actor: the session's epoch ended, so its
    running spans stop (their time so far is kept)."""
    with db.write() as tx:
        return _suspend_session(tx, session_id)
