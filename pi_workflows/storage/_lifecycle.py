"""Run lifecycle transitions: one function per lettered transition of docs/storage.md.

Implements workflow-server.md § Run lifecycle and § Pause and cancellation. Each call
runs inside the caller's `write()` transaction, checks everything before its first
change, and keeps `runs`, `run_queue`, `node_attempts`, `leases` and `events` consistent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from pi_workflows.storage import _queries as q
from pi_workflows.storage._claims import (
    Claim,
    RunHead,
    append_event,
    check_claim,
    event_text,
    read_head,
)
from pi_workflows.storage._db import Tx
from pi_workflows.storage._deadlines import suspend_run_time
from pi_workflows.storage._errors import (
    ClaimLostError,
    ClaimLostReason,
    InvalidTransitionError,
    RevisionConflictError,
    RunNotFoundError,
)
from pi_workflows.storage._follow_ups import cancel_chain_follow_ups
from pi_workflows.storage._messages import present_terminal
from pi_workflows.storage._phases import (
    NONTERMINAL_PHASES,
    TRANSITIONS,
    EventType,
    ExecutionMode,
    FailureClass,
    QueueKind,
    RunPhase,
    check_transition,
    phase_of,
)
from pi_workflows.storage._resources import enqueue_resource, run_parent_resource
from pi_workflows.storage._rows import QueueRow
from pi_workflows.storage._view_reads import (
    VIEW_JSON_MEDIA_TYPE,
    store_view_text,
)

__all__ = [
    "NewRun",
    "TransitionResult",
    "apply_transition",
    "begin_transition",
    "cancel_run",
    "complete_run",
    "enqueue_run",
    "fail_run",
    "park_run",
    "pause_run",
    "requeue_run",
    "require_phase",
    "resume_run",
    "time_out_run",
    "wait_run",
]


# --- Results and inputs -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TransitionResult:
    """What one lifecycle transition committed (once the enclosing `write()` commits)."""

    run_id: str
    revision: int
    """The run's new revision, equal to the revision of the appended event."""
    phase: RunPhase
    generation: int
    """The run's current claim generation."""
    expires_at: int | None
    """The caller's renewed claim expiry, or None when the run holds no claim now."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NewRun:
    """Everything needed to create a queued run."""

    run_id: str
    workflow_name: str
    project_path: str
    source_identity: Any
    """The resolved source identity (JSON): root kind, path, hash and mounted map."""
    definition_digest: str
    input_hash: str
    input: Any
    """The normalized input (JSON)."""
    title: str | None = None
    kind: QueueKind = QueueKind.WORKFLOW
    priority: int = 0
    """Higher is admitted first; equal priorities are first in, first out."""
    parent_run_id: str | None = None
    restart_of: str | None = None
    continuation_of: str | None = None
    execution_mode: ExecutionMode = ExecutionMode.HEADLESS
    origin_session_id: str | None = None
    """Required for interactive runs; the run reserves this session while nonterminal."""


# --- The transition engine (shared with _execution) -------------------------------

LIFECYCLE_POINTS: Final[Mapping[str, str]] = {
    EventType.RUN_QUEUED: "enqueue",
    EventType.RUN_CLAIMED: "launch",
    EventType.RUNNER_LIVE: "ready",
    EventType.NODE_STARTED: "node_start",
    EventType.NODE_FINISHED: "node_finish",
    EventType.NODE_FAILED: "node_fail",
    EventType.RUN_PARKED: "park",
    EventType.RUN_WAITING: "wait",
    EventType.RUN_PAUSED: "pause",
    EventType.RUN_RESUMED: "resume",
    EventType.RUN_REQUEUED: "requeue",
    EventType.RUN_COMPLETED: "complete",
    EventType.RUN_FAILED: "fail",
    EventType.RUN_TIMED_OUT: "time_out",
    EventType.RUN_CANCELLED: "cancel",
    "effect_recovered": "recover",
}
"""Each transition's name in its crash points, `server.lifecycle.<name>.before_commit` and
`.after_commit` (declared in `supervision/_crash.py` as `LIFECYCLE_TRANSITIONS`)."""


def begin_transition(
    tx: Tx, run_id: str, claim: Claim | None, expected_revision: int | None, operation: str
) -> tuple[RunHead, RunPhase]:
    """Read and check authority, revision and phase consistency; change nothing.

    With a claim, the claim must be the run's live claim. Without one, the run must
    be in a phase that holds no claim and nobody may hold a live claim on it.
    """
    if claim is not None:
        if claim.run_id != run_id:
            raise ValueError("the claim names another run")
        head = check_claim(tx, claim)
    else:
        head = read_head(tx, run_id)
    phase = phase_of(head.status, head.queue_state)
    if phase is None:
        raise InvalidTransitionError(run_id, f"{head.status}/{head.queue_state}", operation)
    if claim is None and (phase.holds_claim or head.lease_is_live(tx.now)):
        raise ClaimLostError(run_id, None, ClaimLostReason.MISSING_AUTHORITY)
    if expected_revision is not None and head.revision != expected_revision:
        raise RevisionConflictError(run_id, expected_revision, head.revision)
    return head, phase


def require_phase(
    head: RunHead, phase: RunPhase, allowed: frozenset[RunPhase], operation: str
) -> None:
    """Raise `InvalidTransitionError` unless the run's phase is one of `allowed`."""
    if phase not in allowed:
        raise InvalidTransitionError(head.run_id, phase.value, operation)


def apply_transition(
    tx: Tx,
    head: RunHead,
    source: RunPhase,
    target: RunPhase,
    claim: Claim | None,
    *,
    operation: str,
    event_type: str,
    payload: Any,
    paused: bool = False,
    park_reason: str | None = None,
    failure_class: str | None = None,
    failure_reason: str | None = None,
    change: Callable[[Tx], None] | None = None,
) -> TransitionResult:
    """Write one checked transition: lease, run, queue, `change`, then the event."""
    check_transition(head.run_id, source, target, operation)
    run_id, now = head.run_id, tx.now
    revision = head.revision + 1
    generation = claim.generation if claim is not None else head.generation
    expires_at: int | None = None
    if target.holds_claim:
        assert claim is not None, "a claimed phase is entered only with a claim"
        expires_at = now + claim.ttl_ms
        tx.execute(
            q.UPDATE_LEASE_RENEW,
            {
                "run_id": run_id,
                "generation": claim.generation,
                "now": now,
                "expires_at": expires_at,
            },
        )
    elif head.lease_generation is not None:
        tx.execute(q.DELETE_LEASE, {"run_id": run_id})
    if target.is_terminal:
        tx.execute(
            q.UPDATE_RUN_TERMINAL,
            {
                "run_id": run_id,
                "status": target.run_status.value,
                "revision": revision,
                "now": now,
                "failure_class": failure_class,
                "failure_reason": failure_reason,
            },
        )
        store_view_text(tx, run_id, failure_reason)  # a long reason: `reasonContent`
    elif head.status == target.run_status.value and head.paused == int(paused):
        # A step within the phase (a node started or finished): setting an unchanged
        # status would still rewrite its index entry, a WAL page of every commit.
        tx.execute(q.UPDATE_RUN_REVISION, {"run_id": run_id, "revision": revision, "now": now})
    else:
        tx.execute(
            q.UPDATE_RUN_STATUS,
            {
                "run_id": run_id,
                "status": target.run_status.value,
                "paused": int(paused),
                "revision": revision,
                "now": now,
            },
        )
    if target is RunPhase.QUEUED and source is not RunPhase.QUEUED:
        tx.execute(q.UPDATE_QUEUE_REQUEUE, {"run_id": run_id, "now": now})
    elif source is target is RunPhase.RUNNING and park_reason is None:
        # Running stays running (its park reason was cleared on entry): the queue row
        # and its active index keep their pages; `updated_at` is when it began running.
        pass
    else:
        tx.execute(
            q.UPDATE_QUEUE_STATE,
            {
                "run_id": run_id,
                "state": target.queue_state.value,
                "park_reason": park_reason,
                "now": now,
            },
        )
    if change is not None:
        change(tx)
    append_event(
        tx,
        run_id,
        revision=revision,
        event_type=event_type,
        generation=generation,
        payload=payload,
    )
    tx.lifecycle.append(LIFECYCLE_POINTS.get(str(event_type), str(event_type)))
    return TransitionResult(run_id, revision, target, generation, expires_at)


def _cancel_pending_messages(tx: Tx, run_id: str, kinds: tuple[str, ...]) -> None:
    tx.execute(
        q.UPDATE_PENDING_MESSAGES_CANCEL,
        {"run_id": run_id, "kinds": orjson.dumps(list(kinds)).decode(), "now": tx.now},
    )


def _close_run_work(tx: Tx, run_id: str, attempt_status: str, reason: str, *, failed: bool) -> None:
    """Settle everything a terminal run leaves pending, in its terminal transaction."""
    params = {"run_id": run_id, "now": tx.now}
    tx.execute(q.UPDATE_UNFINISHED_ATTEMPTS_CLOSE, {**params, "status": attempt_status})
    tx.execute(q.UPDATE_PENDING_REQUESTS_CANCEL, params)
    tx.execute(q.INSERT_PENDING_DECISION_CANCELLATIONS, {**params, "reason": reason})
    tx.execute(q.UPDATE_PENDING_DECISIONS_CANCEL, params)
    tx.execute(q.UPDATE_APPLYING_EFFECT_ATTEMPTS_AMBIGUOUS, params)
    tx.execute(q.UPDATE_APPLYING_EFFECTS_AMBIGUOUS, params)
    tx.execute(q.UPDATE_PENDING_EFFECTS_CANCEL, params)
    kinds = ("step", "decision", "follow_up") if failed else ("step", "decision")
    _cancel_pending_messages(tx, run_id, kinds)
    # Its open origin-session turns end as `lost`; a late matching end adopts that.
    tx.execute(
        "UPDATE workflow_turns SET status = 'lost', ended_at = :now "
        "WHERE run_id = :run_id AND status = 'open'",
        params,
    )
    tx.execute(q.UPDATE_BINDING_RELEASE, params)


# --- (a) enqueue --------------------------------------------------------------------


def enqueue_run(tx: Tx, run: NewRun) -> TransitionResult:
    """(a) Create a queued run, its queue row, its binding and its first event.

    **Durability:** the run exists, at revision 1, once the enclosing `write()` commits.

    Raises:
        InvalidTransitionError: the run ID exists, or the origin session is reserved.
        RunNotFoundError: a lineage run (parent, restart or continuation) is missing.
        ValueError: an interactive run without an origin session, or the reverse.
    """
    mode, kind = ExecutionMode(run.execution_mode), QueueKind(run.kind)
    interactive = mode is ExecutionMode.INTERACTIVE
    if interactive != (run.origin_session_id is not None):
        raise ValueError("an interactive run needs an origin session; a headless one has none")
    if tx.fetch_value(q.SELECT_RUN_ROOT, {"run_id": run.run_id}) is not None:
        raise InvalidTransitionError(run.run_id, "existing", "enqueue")
    if interactive:
        holder = tx.fetch_value(
            q.SELECT_SESSION_RESERVATION, {"origin_session_id": run.origin_session_id}
        )
        if holder is not None:
            raise InvalidTransitionError(run.run_id, f"session reserved by {holder}", "enqueue")
    root = run.run_id
    lineage = run.continuation_of or run.restart_of or run.parent_run_id
    if lineage is not None:
        root = tx.fetch_value(q.SELECT_RUN_ROOT, {"run_id": lineage})
        if root is None:
            raise RunNotFoundError(lineage)
    now = tx.now
    input_text = orjson.dumps(run.input).decode()
    tx.execute(
        q.INSERT_RUN,
        {
            "run_id": run.run_id,
            "workflow_name": run.workflow_name,
            "title": run.title,
            "project_path": run.project_path,
            "source_identity": orjson.dumps(run.source_identity).decode(),
            "definition_digest": run.definition_digest,
            "input_hash": run.input_hash,
            "input": input_text,
            "root_run_id": root,
            "parent_run_id": run.parent_run_id,
            "restart_of": run.restart_of,
            "continuation_of": run.continuation_of,
            "now": now,
        },
    )
    tx.execute(
        q.INSERT_QUEUE_ROW,
        {"run_id": run.run_id, "kind": kind.value, "priority": run.priority, "now": now},
    )
    tx.execute(
        q.INSERT_RUN_BINDING,
        {
            "run_id": run.run_id,
            "execution_mode": mode.value,
            "origin_session_id": run.origin_session_id,
            "reserved": int(interactive),
            "now": now,
        },
    )
    # The run view's reference to its input when large (the definition snapshot is read
    # in place from its blob: `_view_location`).
    store_view_text(tx, run.run_id, input_text, VIEW_JSON_MEDIA_TYPE)
    payload = {"workflowName": run.workflow_name, "kind": kind.value}
    append_event(
        tx, run.run_id, revision=1, event_type=EventType.RUN_QUEUED, generation=0, payload=payload
    )
    tx.lifecycle.append("enqueue")  # (a) is a lifecycle commit: it passes its crash points
    return TransitionResult(run.run_id, 1, RunPhase.QUEUED, 0, None)


# --- (d) park, (e) wait, pause, resume, (f) requeue ---------------------------------


def park_run(
    tx: Tx,
    claim: Claim,
    *,
    reason: str,
    detail: str | None = None,
    expected_revision: int | None = None,
    change: Callable[[Tx], None] | None = None,
) -> TransitionResult:
    """(d) running/starting|running → running/parked at the last durable boundary.

    A running attempt becomes `interrupted` (a pure node may run again); a waiting
    attempt stays. The claim is released; the runner must stop. Reasons include the
    `ParkReason` codes `workflowSourceChanged`, `runnerNoProgress`, `effectAmbiguous`
    and `serverCrashLoop` (startup recovery, under its control claim); the scheduler
    never admits a parked run, so each waits for an explicit `resume_run` (or a cancel).
    `detail` (bounded text, no payloads) goes into the event only. After a runner exits,
    use the host claim if it is still live, or a new control claim from `acquire_claim`
    once it expired.

    Raises:
        ClaimLostError: the claim is not the live claim.
        InvalidTransitionError: the run is not starting or running.
    """
    operation = "park"
    head, phase = begin_transition(tx, claim.run_id, claim, expected_revision, operation)
    require_phase(head, phase, frozenset({RunPhase.STARTING, RunPhase.RUNNING}), operation)

    def interrupt(tx: Tx) -> None:
        tx.execute(q.UPDATE_RUNNING_ATTEMPTS_INTERRUPTED, {"run_id": claim.run_id, "now": tx.now})
        if change is not None:
            change(tx)

    return apply_transition(
        tx,
        head,
        phase,
        RunPhase.PARKED,
        claim,
        operation=operation,
        event_type=EventType.RUN_PARKED,
        payload={"reason": reason} if detail is None else {"reason": reason, "detail": detail},
        paused=bool(head.paused),
        park_reason=reason,
        change=interrupt,
    )


def wait_run(
    tx: Tx,
    claim: Claim,
    *,
    reason: str,
    attempt_id: str | None = None,
    expected_revision: int | None = None,
    change: Callable[[Tx], None] | None = None,
) -> TransitionResult:
    """(e) running/running → waiting/parked: a checkpoint or interactive request waits.

    With `attempt_id`, that running attempt becomes `waiting` (an interactive step keeps
    its attempt and deadline); without it (a completed checkpoint) any running attempt
    is interrupted. The claim is released and the runner exits. `change` lets the caller
    commit the interactive request in the same transaction.

    Raises:
        ClaimLostError: the claim is not the live claim.
        InvalidTransitionError: not running, or `attempt_id` is not the running attempt.
    """
    operation = "wait"
    head, phase = begin_transition(tx, claim.run_id, claim, expected_revision, operation)
    require_phase(head, phase, frozenset({RunPhase.RUNNING}), operation)
    if attempt_id is not None:
        current = tx.fetch_value(q.SELECT_UNFINISHED_ATTEMPT, {"run_id": claim.run_id})
        if current != attempt_id:
            raise InvalidTransitionError(
                claim.run_id, f"attempt {attempt_id} not running", operation
            )

    def park_attempt(tx: Tx) -> None:
        if attempt_id is not None:
            tx.execute(q.UPDATE_ATTEMPT_WAITING, {"attempt_id": attempt_id})
        tx.execute(q.UPDATE_RUNNING_ATTEMPTS_INTERRUPTED, {"run_id": claim.run_id, "now": tx.now})
        if change is not None:
            change(tx)

    return apply_transition(
        tx,
        head,
        phase,
        RunPhase.WAITING,
        claim,
        operation=operation,
        event_type=EventType.RUN_WAITING,
        payload={"reason": reason, "attemptId": attempt_id},
        paused=bool(head.paused),
        park_reason=reason,
        change=park_attempt,
    )


def pause_run(
    tx: Tx,
    run_id: str,
    *,
    claim: Claim | None = None,
    expected_revision: int | None = None,
    change: Callable[[Tx], None] | None = None,
) -> TransitionResult:
    """Set the run's durable pause, park it if it executes, release the claim.

    A starting or running run (claim required) becomes running/parked with reason
    `paused` (its running attempt interrupted); a queued, parked or waiting run keeps
    its phase and only gains the flag, so the scheduler skips it. Pending step messages
    are cancelled. `change` lets the command handler store its receipt here too.

    Raises:
        ClaimLostError: a claimed phase without the live claim, or a live claim is held.
        InvalidTransitionError: the run is terminal or already paused.
    """
    operation = "pause"
    head, phase = begin_transition(tx, run_id, claim, expected_revision, operation)
    require_phase(head, phase, NONTERMINAL_PHASES, operation)
    if head.paused:
        raise InvalidTransitionError(run_id, f"{phase.value} (paused)", operation)
    target = RunPhase.PARKED if phase.holds_claim else phase
    stored = tx.fetch_one(q.SELECT_QUEUE_ROW, {"run_id": run_id}, QueueRow)
    reason = "paused" if target is RunPhase.PARKED else (stored.park_reason if stored else None)

    def stop(tx: Tx) -> None:
        tx.execute(q.UPDATE_RUNNING_ATTEMPTS_INTERRUPTED, {"run_id": run_id, "now": tx.now})
        _cancel_pending_messages(tx, run_id, ("step",))
        suspend_run_time(tx, run_id)  # paused time does not consume a step's timeout
        if change is not None:
            change(tx)

    return apply_transition(
        tx,
        head,
        phase,
        target,
        claim,
        operation=operation,
        event_type=EventType.RUN_PAUSED,
        payload={"from": phase.value},
        paused=True,
        park_reason=reason,
        change=stop,
    )


def resume_run(
    tx: Tx,
    run_id: str,
    *,
    claim: Claim | None = None,
    expected_revision: int | None = None,
    change: Callable[[Tx], None] | None = None,
) -> TransitionResult:
    """Clear the pause and make parked work admissible again.

    A parked run (paused or parked for a reason such as `runnerNoProgress`) becomes
    queued and later takes a new generation. A waiting or queued run keeps its phase:
    a pending interaction continues in place. `change` can add the `resumed` step
    message and the command receipt in the same transaction.

    Raises:
        ClaimLostError: a live claim is held by someone else.
        InvalidTransitionError: the run is neither paused nor parked.
    """
    operation = "resume"
    head, phase = begin_transition(tx, run_id, claim, expected_revision, operation)
    if not (head.paused or phase is RunPhase.PARKED):
        raise InvalidTransitionError(run_id, phase.value, operation)
    require_phase(
        head, phase, frozenset({RunPhase.QUEUED, RunPhase.PARKED, RunPhase.WAITING}), operation
    )
    target = RunPhase.QUEUED if phase is RunPhase.PARKED else phase
    stored = tx.fetch_one(q.SELECT_QUEUE_ROW, {"run_id": run_id}, QueueRow)
    reason = None if target is RunPhase.QUEUED else (stored.park_reason if stored else None)
    return apply_transition(
        tx,
        head,
        phase,
        target,
        claim,
        operation=operation,
        event_type=EventType.RUN_RESUMED,
        payload={"from": phase.value},
        paused=False,
        park_reason=reason,
        change=change,
    )


def requeue_run(
    tx: Tx,
    run_id: str,
    *,
    reason: str,
    claim: Claim | None = None,
    expected_revision: int | None = None,
    change: Callable[[Tx], None] | None = None,
) -> TransitionResult:
    """(f) Put unpaused work back in the admission line (one admission path).

    From waiting (an accepted response, a validation candidate, an expired deadline)
    or parked (recovery made it claimable), no claim is needed. From starting or
    running (recovery after a crash, with a control claim) the running attempt is
    interrupted and the claim released. A waiting attempt stays waiting.

    Raises:
        ClaimLostError: a claimed phase without the live claim, or a live claim is held.
        InvalidTransitionError: the run is paused (resume it), queued or terminal.
    """
    operation = "requeue"
    head, phase = begin_transition(tx, run_id, claim, expected_revision, operation)
    allowed = frozenset({RunPhase.STARTING, RunPhase.RUNNING, RunPhase.PARKED, RunPhase.WAITING})
    require_phase(head, phase, allowed, operation)
    if head.paused:
        raise InvalidTransitionError(run_id, f"{phase.value} (paused)", operation)

    def interrupt(tx: Tx) -> None:
        tx.execute(q.UPDATE_RUNNING_ATTEMPTS_INTERRUPTED, {"run_id": run_id, "now": tx.now})
        if change is not None:
            change(tx)

    return apply_transition(
        tx,
        head,
        phase,
        RunPhase.QUEUED,
        claim,
        operation=operation,
        event_type=EventType.RUN_REQUEUED,
        payload={"reason": reason, "from": phase.value},
        change=interrupt,
    )


# --- (g) complete, (h) fail, (i) time out, (j) cancel -------------------------------


def _wake_parent_resource(tx: Tx, run_id: str) -> None:
    """A resource's child run ended: enqueue its resource in the same transaction (a
    wake-up hint, not a transition), so its manager reads the outcome."""
    parent = run_parent_resource(tx, run_id)
    if parent is not None:
        enqueue_resource(tx, parent.uid, reason="childRunFinished")


def _finish(
    tx: Tx,
    run_id: str,
    claim: Claim | None,
    target: RunPhase,
    *,
    operation: str,
    event_type: str,
    attempt_status: str,
    payload: Any,
    reason: str,
    failure_class: str | None,
    expected_revision: int | None,
    change: Callable[[Tx], None] | None,
) -> TransitionResult:
    head, phase = begin_transition(tx, run_id, claim, expected_revision, operation)
    sources = frozenset(s for s in NONTERMINAL_PHASES if target in TRANSITIONS[s])
    require_phase(head, phase, sources, operation)
    failed = target is not RunPhase.COMPLETED

    def close(tx: Tx) -> None:
        _close_run_work(tx, run_id, attempt_status, reason, failed=failed)
        if failed:  # its chain ends without a completed outcome
            cancel_chain_follow_ups(tx, run_id)
        # An interactive run's final leaf tells its origin session, same transaction.
        present_terminal(tx, run_id, target.value, reason=reason, event_payload=payload)
        _wake_parent_resource(tx, run_id)
        if change is not None:
            change(tx)

    return apply_transition(
        tx,
        head,
        phase,
        target,
        claim,
        operation=operation,
        event_type=event_type,
        payload=payload,
        failure_class=failure_class,
        failure_reason=reason if failed else None,
        change=close,
    )


def complete_run(
    tx: Tx,
    run_id: str,
    *,
    claim: Claim | None = None,
    payload: Any = None,
    expected_revision: int | None = None,
    change: Callable[[Tx], None] | None = None,
) -> TransitionResult:
    """(g) running|waiting → completed/done, terminal.

    Like every terminal transition it, in the same transaction: releases the claim,
    clears the pause, closes leftover unfinished attempts (`cancelled` here), cancels
    pending interactive requests and human decisions (with a cancelled resolution),
    makes pending effects `cancelled` and applying effects `ambiguous`, cancels pending
    step and decision messages, and releases the origin-session reservation.

    An interactive run that is the final leaf of its checkpoint-continuation chain gets
    its one `terminal` workflow message in the same transaction (`present_terminal`).

    **Durability:** the run is terminal once the enclosing `write()` commits.

    Raises:
        ClaimLostError: a running run without its live claim.
        InvalidTransitionError: the run is not running or waiting.
    """
    return _finish(
        tx,
        run_id,
        claim,
        RunPhase.COMPLETED,
        operation="complete",
        event_type=EventType.RUN_COMPLETED,
        attempt_status="cancelled",
        payload=payload,
        reason="completed",
        failure_class=None,
        expected_revision=expected_revision,
        change=change,
    )


def fail_run(
    tx: Tx,
    run_id: str,
    *,
    failure_class: FailureClass,
    reason: str,
    claim: Claim | None = None,
    expected_revision: int | None = None,
    change: Callable[[Tx], None] | None = None,
) -> TransitionResult:
    """(h) any nonterminal phase → failed/failed, terminal, with a failure class.

    Unfinished attempts become `failed`; pending follow-up messages are cancelled too.
    Claim loss is never a run failure: do not call this for `claimLost` handoffs.
    Otherwise as `complete_run`.

    Raises:
        ClaimLostError: a starting or running run without its live claim.
        InvalidTransitionError: the run is terminal.
    """
    return _finish(
        tx,
        run_id,
        claim,
        RunPhase.FAILED,
        operation="fail",
        event_type=EventType.RUN_FAILED,
        attempt_status="failed",
        payload={"failureClass": failure_class.value, "reason": event_text(reason)},
        reason=reason,
        failure_class=failure_class.value,
        expected_revision=expected_revision,
        change=change,
    )


def time_out_run(
    tx: Tx,
    run_id: str,
    *,
    reason: str,
    claim: Claim | None = None,
    expected_revision: int | None = None,
    change: Callable[[Tx], None] | None = None,
) -> TransitionResult:
    """(i) running|waiting → timed_out/failed, terminal: a declared timeout passed.

    Unfinished attempts become `timed_out`. Otherwise as `fail_run`.

    Raises:
        ClaimLostError: a running run without its live claim.
        InvalidTransitionError: the run is not running or waiting.
    """
    return _finish(
        tx,
        run_id,
        claim,
        RunPhase.TIMED_OUT,
        operation="time out",
        event_type=EventType.RUN_TIMED_OUT,
        attempt_status="timed_out",
        payload={"reason": event_text(reason)},
        reason=reason,
        failure_class=None,
        expected_revision=expected_revision,
        change=change,
    )


def cancel_run(
    tx: Tx,
    run_id: str,
    *,
    reason: str = "cancelled",
    claim: Claim | None = None,
    expected_revision: int | None = None,
    change: Callable[[Tx], None] | None = None,
) -> TransitionResult:
    """(j) any nonterminal phase → cancelled/cancelled, terminal.

    A live runner's run needs the host claim; an expired running row needs a new
    control claim first (`acquire_claim` proves the old lease absent or expired).
    Unfinished attempts become `cancelled`; pending effects `cancelled`, applying
    effects `ambiguous`; pending follow-ups are cancelled. Otherwise as
    `complete_run`. `change` stores the command receipt in the same transaction.

    Raises:
        ClaimLostError: a starting or running run without its live claim, or a live
            claim held on another phase.
        InvalidTransitionError: the run is terminal.
    """
    return _finish(
        tx,
        run_id,
        claim,
        RunPhase.CANCELLED,
        operation="cancel",
        event_type=EventType.RUN_CANCELLED,
        attempt_status="cancelled",
        payload={"reason": reason},
        reason=reason,
        failure_class=None,
        expected_revision=expected_revision,
        change=change,
    )
