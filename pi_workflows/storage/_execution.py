"""Execution transitions: launching a runner, its ready message and exit, node attempts.

Implements workflow-server.md § Runner lifecycle ((b) claim for launch, (c) runner live,
one recorded runner outcome) and the node-attempt progress (k) of § Run lifecycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pi_workflows.storage import _queries as q
from pi_workflows.storage._claims import (
    DEFAULT_CLAIM_TTL_MS,
    Claim,
    OwnerType,
    event_text,
    grant_claim,
    read_head,
)
from pi_workflows.storage._content import put_json_blob
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._errors import (
    ClaimHeldError,
    InvalidTransitionError,
    RevisionConflictError,
)
from pi_workflows.storage._lifecycle import (
    TransitionResult,
    apply_transition,
    begin_transition,
    require_phase,
)
from pi_workflows.storage._phases import EventType, RunnerOutcome, RunPhase, phase_of
from pi_workflows.storage._rows import RunnerEpochRow
from pi_workflows.storage._view_reads import store_view_blob, store_view_text

__all__ = [
    "AttemptStarted",
    "LaunchResult",
    "claim_for_launch",
    "close_attempt",
    "fail_node_attempt",
    "finish_node_attempt",
    "mark_runner_live",
    "record_runner_exit",
    "runner_made_progress",
    "start_node_attempt",
]

# The default of `finish_node_attempt(output=...)`: no output given (None is JSON null).
_NO_OUTPUT: Any = object()


@dataclass(frozen=True, slots=True)
class LaunchResult:
    """A run claimed for launch: the host claim and the recorded runner epoch."""

    claim: Claim
    revision: int
    runner_epoch: str


@dataclass(frozen=True, slots=True)
class AttemptStarted:
    """A started node attempt and the run revision that recorded it."""

    attempt_id: str
    visit: int
    """1 + finished attempts of this node path: the effect idempotency key's visit."""
    revision: int
    expires_at: int | None


# --- (b) claim for launch, (c) runner live, runner exit -----------------------------


def claim_for_launch(
    tx: Tx,
    run_id: str,
    *,
    owner_id: str,
    runner_epoch: str,
    launch_envelope_hash: str,
    owner_type: str = OwnerType.HOST,
    ttl_ms: int = DEFAULT_CLAIM_TTL_MS,
    expected_revision: int | None = None,
) -> LaunchResult:
    """(b) queued → running/starting: take the host claim and record the runner epoch.

    The run gets a new generation; the runner epoch row (`starting`) is recorded before
    the server spawns the runner.

    Raises:
        InvalidTransitionError: the run is not queued, is paused, or has an active runner.
        ClaimHeldError: a live claim is held on the run (e.g. a recovery control claim).
        RevisionConflictError: the run is not at `expected_revision`.
    """
    head = read_head(tx, run_id)
    phase = phase_of(head.status, head.queue_state)
    if phase is not RunPhase.QUEUED:
        raise InvalidTransitionError(run_id, phase.value if phase else head.status, "launch")
    if head.lease_is_live(tx.now):
        assert head.lease_generation is not None and head.lease_expires_at is not None
        raise ClaimHeldError(run_id, head.lease_generation, head.lease_expires_at)
    if expected_revision is not None and head.revision != expected_revision:
        raise RevisionConflictError(run_id, expected_revision, head.revision)
    if head.paused:
        raise InvalidTransitionError(run_id, "paused", "claim for launch")
    if tx.fetch_one(q.SELECT_ACTIVE_RUNNER_EPOCH, {"run_id": run_id}, RunnerEpochRow) is not None:
        raise InvalidTransitionError(run_id, "active runner", "claim for launch")
    claim = grant_claim(tx, head, owner_type, owner_id, ttl_ms)
    tx.execute(
        q.INSERT_RUNNER_EPOCH,
        {
            "runner_epoch": runner_epoch,
            "run_id": run_id,
            "generation": claim.generation,
            "launch_envelope_hash": launch_envelope_hash,
            "now": tx.now,
        },
    )
    result = apply_transition(
        tx,
        head,
        phase,
        RunPhase.STARTING,
        claim,
        operation="claim for launch",
        event_type=EventType.RUN_CLAIMED,
        payload={"generation": claim.generation, "runnerEpoch": runner_epoch},
    )
    return LaunchResult(claim, result.revision, runner_epoch)


def mark_runner_live(
    tx: Tx,
    claim: Claim,
    *,
    runner_epoch: str,
    pid: int | None,
    process_start_time: int | None,
    expected_revision: int | None = None,
) -> TransitionResult:
    """(c) running/starting → running/running: the runner sent its ready message.

    Records the process identity and the run revision at ready time (`ready_revision`),
    which `runnerNoProgress` detection compares against later.

    Raises:
        ClaimLostError: the claim is not the live claim.
        InvalidTransitionError: not starting, or the epoch is not this generation's
            starting runner.
    """
    head, phase = begin_transition(tx, claim.run_id, claim, expected_revision, "mark runner live")
    require_phase(head, phase, frozenset({RunPhase.STARTING}), "mark runner live")
    runner = tx.fetch_one(q.SELECT_RUNNER_EPOCH, {"runner_epoch": runner_epoch}, RunnerEpochRow)
    if (
        runner is None
        or runner.run_id != claim.run_id
        or runner.generation != claim.generation
        or runner.status != "starting"
    ):
        raise InvalidTransitionError(claim.run_id, "starting", f"ready from epoch {runner_epoch}")

    def record_ready(tx: Tx) -> None:
        tx.execute(
            q.UPDATE_RUNNER_EPOCH_READY,
            {
                "runner_epoch": runner_epoch,
                "pid": pid,
                "process_start_time": process_start_time,
                "ready_revision": head.revision + 1,
                "now": tx.now,
            },
        )

    return apply_transition(
        tx,
        head,
        phase,
        RunPhase.RUNNING,
        claim,
        operation="mark runner live",
        event_type=EventType.RUNNER_LIVE,
        payload={"runnerEpoch": runner_epoch},
        change=record_ready,
    )


def record_runner_exit(
    tx: Tx,
    runner_epoch: str,
    *,
    outcome: RunnerOutcome,
    exit_code: int | None = None,
    signal: int | None = None,
    diagnostic_hash: str | None = None,
) -> RunnerEpochRow:
    """Record the one terminal outcome of a runner epoch (no run revision change).

    Needs no claim: the server records exits after claim loss and terminal states too.
    The epoch's stored replies go in the same transaction: the runner host refuses every
    frame of an ended epoch (`claimLost`) before it reaches the database, so none of
    them can answer anyone again.
    Compare the returned `ready_revision` with the run's revision to detect
    `runnerNoProgress`.

    Raises:
        InvalidTransitionError: the epoch is unknown or already has an outcome.
    """
    runner = tx.fetch_one(q.SELECT_RUNNER_EPOCH, {"runner_epoch": runner_epoch}, RunnerEpochRow)
    if runner is None or runner.status not in ("starting", "ready"):
        status = "unknown" if runner is None else runner.status
        raise InvalidTransitionError(runner_epoch, status, "record runner exit")
    tx.execute(
        q.UPDATE_RUNNER_EPOCH_FINISH,
        {
            "runner_epoch": runner_epoch,
            "status": outcome.value,
            "exit_code": exit_code,
            "signal": signal,
            "diagnostic_hash": diagnostic_hash,
            "now": tx.now,
        },
    )
    tx.execute(q.DELETE_RUNNER_MESSAGES, {"runner_epoch": runner_epoch})
    done = tx.fetch_one(q.SELECT_RUNNER_EPOCH, {"runner_epoch": runner_epoch}, RunnerEpochRow)
    assert done is not None
    return done


@dataclass(frozen=True, slots=True)
class _Progress:
    ready_revision: int | None
    revision: int


def runner_made_progress(reader: Reader, runner_epoch: str) -> bool:
    """Whether the run's revision advanced after this runner epoch's ready message.

    False for a runner that never became ready. Decide right after the runner's exit
    (with `record_runner_exit`, in the same transaction): without progress, park the run
    with `ParkReason.RUNNER_NO_PROGRESS`, which the scheduler does not admit again;
    with progress, requeue it (or fail it, per § Failure classification).

    Raises:
        InvalidTransitionError: the runner epoch is unknown.
    """
    row = reader.fetch_one(q.SELECT_RUNNER_PROGRESS, {"runner_epoch": runner_epoch}, _Progress)
    if row is None:
        raise InvalidTransitionError(runner_epoch, "unknown", "read runner progress")
    return row.ready_revision is not None and row.revision > row.ready_revision


# --- (k) node attempts: progress within running/running -----------------------------

_RUNNING_ONLY = frozenset({RunPhase.RUNNING})


def start_node_attempt(
    tx: Tx,
    claim: Claim,
    *,
    attempt_id: str,
    node_path: str,
    node_type: str,
    deadline_at: int | None = None,
    expected_revision: int | None = None,
) -> AttemptStarted:
    """(k) Start a node attempt of a running run; its visit is 1 + finished visits.

    Raises:
        ClaimLostError: the claim is not the live claim.
        InvalidTransitionError: the run is not running, or another attempt is unfinished.
    """
    head, phase = begin_transition(tx, claim.run_id, claim, expected_revision, "start node")
    require_phase(head, phase, _RUNNING_ONLY, "start node")
    if tx.fetch_value(q.SELECT_UNFINISHED_ATTEMPT, {"run_id": claim.run_id}) is not None:
        raise InvalidTransitionError(claim.run_id, "attempt unfinished", "start node")
    finished = tx.fetch_value(
        q.COUNT_FINISHED_VISITS, {"run_id": claim.run_id, "node_path": node_path}
    )
    visit = int(finished) + 1

    def insert(tx: Tx) -> None:
        tx.execute(
            q.INSERT_NODE_ATTEMPT,
            {
                "attempt_id": attempt_id,
                "run_id": claim.run_id,
                "node_path": node_path,
                "node_type": node_type,
                "visit": visit,
                "generation": claim.generation,
                "deadline_at": deadline_at,
                "now": tx.now,
            },
        )

    payload = {
        "attemptId": attempt_id,
        "nodePath": node_path,
        "nodeType": node_type,
        "visit": visit,
    }
    result = apply_transition(
        tx,
        head,
        phase,
        RunPhase.RUNNING,
        claim,
        operation="start node",
        event_type=EventType.NODE_STARTED,
        payload=payload,
        change=insert,
    )
    return AttemptStarted(attempt_id, visit, result.revision, result.expires_at)


def _end_attempt(
    tx: Tx,
    claim: Claim,
    attempt_id: str,
    status: str,
    *,
    event_type: str,
    payload: Any,
    output_hash: str | None,
    output: Any,
    error: str | None,
    next_node_path: str | None,
    expected_revision: int | None,
) -> TransitionResult:
    operation = f"end node attempt as {status}"
    if output is not _NO_OUTPUT and output_hash is not None:
        raise ValueError("give the output or its blob digest, not both")
    head, phase = begin_transition(tx, claim.run_id, claim, expected_revision, operation)
    require_phase(head, phase, _RUNNING_ONLY, operation)
    current = tx.fetch_value(q.SELECT_UNFINISHED_ATTEMPT, {"run_id": claim.run_id})
    if current != attempt_id:
        raise InvalidTransitionError(
            claim.run_id, f"attempt {attempt_id} not unfinished", operation
        )

    stored_hash = output_hash

    def finish(tx: Tx) -> None:
        nonlocal stored_hash
        if output is not _NO_OUTPUT:
            stored_hash = put_json_blob(tx, output)
        tx.execute(
            q.UPDATE_ATTEMPT_FINISH,
            {
                "attempt_id": attempt_id,
                "status": status,
                "output_hash": stored_hash,
                "error": error,
                "next_node_path": next_node_path,
                "now": tx.now,
            },
        )
        # The run view references a large output or error: stored with it.
        store_view_blob(tx, claim.run_id, stored_hash)
        store_view_text(tx, claim.run_id, error)

    event: dict[str, Any] = {"attemptId": attempt_id, "status": status}
    if next_node_path is not None:
        event["nextNodePath"] = next_node_path
    return apply_transition(
        tx,
        head,
        phase,
        RunPhase.RUNNING,
        claim,
        operation=operation,
        event_type=event_type,
        payload={**event, **(payload or {})},
        change=finish,
    )


def close_attempt(tx: Tx, attempt_id: str, *, status: str, error: str) -> None:
    """End an unfinished attempt with no output and no route (`timed_out`, `failed`)
    when the server, not its runner, ends it. Only inside a change that the caller's
    claim check guards (`protected_write`, `requeue_run`): it writes no event itself."""
    tx.execute(
        q.UPDATE_ATTEMPT_FINISH,
        {
            "attempt_id": attempt_id,
            "status": status,
            "output_hash": None,
            "error": error,
            "next_node_path": None,
            "now": tx.now,
        },
    )


def finish_node_attempt(
    tx: Tx,
    claim: Claim,
    *,
    attempt_id: str,
    output: Any = _NO_OUTPUT,
    output_hash: str | None = None,
    next_node_path: str | None = None,
    payload: Mapping[str, Any] | None = None,
    expected_revision: int | None = None,
) -> TransitionResult:
    """(k) Complete the run's unfinished attempt (a durable boundary).

    The output is stored as a canonical JSON blob, and the attempt row keeps its digest
    (`output_hash`); `read_resume_state` decodes it for a resuming runner.

    Args:
        output: the node output (JSON; `None` is stored as JSON null). It is written to
            the blob store in this transaction. Omit it to store no output.
        output_hash: instead of `output`, the digest of an output already in the blob
            store (the two are exclusive).
        next_node_path: the node the runner routed to (routing is decided in the runner
            and recorded here), or None at the end of the graph; resume continues there.
        payload: extra event fields (the viewer delta), merged into the event payload.

    Raises:
        ClaimLostError: the claim is not the live claim.
        InvalidTransitionError: not running, or `attempt_id` is not the unfinished attempt.
        ValueError: both `output` and `output_hash` were given.
        pi_workflows.wire.canonical.NotSerializableError: the output has no canonical form.
    """
    return _end_attempt(
        tx,
        claim,
        attempt_id,
        "completed",
        event_type=EventType.NODE_FINISHED,
        payload=payload,
        output_hash=output_hash,
        output=output,
        error=None,
        next_node_path=next_node_path,
        expected_revision=expected_revision,
    )


def fail_node_attempt(
    tx: Tx,
    claim: Claim,
    *,
    attempt_id: str,
    error: str,
    timed_out: bool = False,
    next_node_path: str | None = None,
    payload: Mapping[str, Any] | None = None,
    expected_revision: int | None = None,
) -> TransitionResult:
    """(k) End the run's unfinished attempt as `failed` (or `timed_out`).

    The run stays running: the workflow may route the failure (`next_node_path` records
    the `$result.outcome` route the runner took). Failing the run is `fail_run`.

    Raises:
        ClaimLostError: the claim is not the live claim.
        InvalidTransitionError: not running, or `attempt_id` is not the unfinished attempt.
    """
    return _end_attempt(
        tx,
        claim,
        attempt_id,
        "timed_out" if timed_out else "failed",
        event_type=EventType.NODE_FAILED,
        payload={"error": event_text(error), **(payload or {})},
        output_hash=None,
        output=_NO_OUTPUT,
        error=error,
        next_node_path=next_node_path,
        expected_revision=expected_revision,
    )
