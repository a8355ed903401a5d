"""The run lifecycle model: status and queue enums, the nine phases and the lettered table.

Implements workflow-server.md § Run lifecycle (the run/queue state table) and § Failure
classification. docs/storage.md draws the table; `_lifecycle` performs the transitions.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from pi_workflows.storage._errors import InvalidTransitionError

__all__ = [
    "NONTERMINAL_PHASES",
    "TRANSITIONS",
    "EventType",
    "ExecutionMode",
    "FailureClass",
    "ParkReason",
    "QueueKind",
    "QueueState",
    "RunPhase",
    "RunStatus",
    "RunnerOutcome",
    "check_transition",
    "is_transition_allowed",
    "phase_of",
]


class RunStatus(enum.StrEnum):
    """`runs.status`."""

    QUEUED = "queued"  # admitted, not started
    RUNNING = "running"  # has (or is recovering) an execution generation
    WAITING = "waiting"  # a checkpoint or interactive request needs input
    COMPLETED = "completed"  # terminal: success
    FAILED = "failed"  # terminal: durable error
    TIMED_OUT = "timed_out"  # terminal: a declared timeout passed
    CANCELLED = "cancelled"  # terminal: cancellation completed


class QueueState(enum.StrEnum):
    """`run_queue.state`."""

    QUEUED = "queued"  # waiting for admission
    STARTING = "starting"  # a runner launch is being recorded
    RUNNING = "running"  # a live runner executes
    PARKED = "parked"  # stopped at a durable boundary, no runner, no claim
    DONE = "done"  # terminal: completed
    FAILED = "failed"  # terminal: failed or timed out
    CANCELLED = "cancelled"  # terminal: cancelled


class QueueKind(enum.StrEnum):
    """What a queued run needs; the scheduler alternates kinds when both wait."""

    WORKFLOW = "workflow"  # a workflow runner
    RESOURCE = "resource"  # a resource-manager reconcile runner


class ExecutionMode(enum.StrEnum):
    """`run_bindings.execution_mode`."""

    INTERACTIVE = "interactive"  # agent steps run in the origin Pi session (reserved)
    HEADLESS = "headless"  # agent steps run in `pi --mode rpc`; no session reserved


class FailureClass(enum.StrEnum):
    """workflow-server.md § Failure classification; `runs.failure_class`."""

    CLAIM_LOST = "claimLost"
    WORKER_CRASHED = "workerCrashed"
    RUNNER_NO_PROGRESS = "runnerNoProgress"
    WORKER_TIMED_OUT = "workerTimedOut"
    HOST_UNAVAILABLE = "hostUnavailable"
    SOURCE_CHANGED = "sourceChanged"
    EFFECT_AMBIGUOUS = "effectAmbiguous"
    NODE_FAILED = "nodeFailed"
    PROTOCOL_REJECTED = "protocolRejected"
    RESOURCE_LIMIT = "resourceLimit"
    """A node went over its memory or process limit (issue 11); not a crash, not an
    ordinary node failure."""


class ParkReason(enum.StrEnum):
    """Known `run_queue.park_reason` values of a running/parked run (any short code is allowed).

    The scheduler never admits a parked run; `resume_run` requeues it. Only the first
    (`paused`) clears by itself with resume; the others need the operator to fix the cause
    first, then resume or cancel.
    """

    PAUSED = "paused"
    """An explicit pause (`pause_run`)."""
    RUNNER_NO_PROGRESS = "runnerNoProgress"
    """The runner exited before the run revision advanced past its ready revision."""
    WORKFLOW_SOURCE_CHANGED = "workflowSourceChanged"
    """The workflow source no longer matches the run's saved source identity."""
    EFFECT_AMBIGUOUS = "effectAmbiguous"
    """A managed effect may have applied without a receipt; the operator must inspect it."""
    SERVER_CRASH_LOOP = "serverCrashLoop"
    """The server died while the run was in flight, again and again, with no node finishing
    in between (startup recovery counts it): the run may be what kills the server."""


class RunnerOutcome(enum.StrEnum):
    """The one terminal outcome recorded for a runner epoch (`runner_epochs.status`)."""

    EXITED = "exited"
    CANCELLED = "cancelled"
    TIMED_OUT = "timedOut"
    CRASHED = "crashed"
    CLAIM_LOST = "claimLost"
    ORPHANED = "orphaned"


class EventType(enum.StrEnum):
    """Event types the lifecycle transitions append (protected writes add their own)."""

    RUN_QUEUED = "run_queued"
    RUN_CLAIMED = "run_claimed"
    RUNNER_LIVE = "runner_live"
    NODE_STARTED = "node_started"
    NODE_FINISHED = "node_finished"
    NODE_FAILED = "node_failed"
    RUN_PARKED = "run_parked"
    RUN_WAITING = "run_waiting"
    RUN_PAUSED = "run_paused"
    RUN_RESUMED = "run_resumed"
    RUN_REQUEUED = "run_requeued"
    RUN_COMPLETED = "run_completed"
    RUN_FAILED = "run_failed"
    RUN_TIMED_OUT = "run_timed_out"
    RUN_CANCELLED = "run_cancelled"
    EFFECT_RESERVED = "effect_reserved"
    EFFECT_RETRIED = "effect_retried"
    EFFECT_SETTLED = "effect_settled"
    EFFECT_AMBIGUOUS = "effect_ambiguous"


class RunPhase(enum.StrEnum):
    """One row of the lifecycle table: a (run status, queue state) pair.

    Only these nine pairs are consistent; `phase_of` maps a stored pair to its phase.
    """

    QUEUED = "queued"  # queued/queued: ready for scheduling; no claim, no runner
    STARTING = "starting"  # running/starting: launch being recorded; host claim
    RUNNING = "running"  # running/running: a live runner executes one node; host claim
    PARKED = "parked"  # running/parked: stopped at a durable boundary; can resume
    WAITING = "waiting"  # waiting/parked: a checkpoint or interactive request needs input
    COMPLETED = "completed"  # completed/done
    FAILED = "failed"  # failed/failed
    TIMED_OUT = "timed_out"  # timed_out/failed
    CANCELLED = "cancelled"  # cancelled/cancelled

    @property
    def run_status(self) -> RunStatus:
        """The `runs.status` of this phase."""
        return _PROJECTION[self][0]

    @property
    def queue_state(self) -> QueueState:
        """The `run_queue.state` of this phase."""
        return _PROJECTION[self][1]

    @property
    def holds_claim(self) -> bool:
        """Whether this phase keeps a host claim (and a runner) between transactions."""
        return self in (RunPhase.STARTING, RunPhase.RUNNING)

    @property
    def is_terminal(self) -> bool:
        """Whether no transition leaves this phase."""
        return self in _TERMINAL


_PROJECTION: Mapping[RunPhase, tuple[RunStatus, QueueState]] = {
    RunPhase.QUEUED: (RunStatus.QUEUED, QueueState.QUEUED),
    RunPhase.STARTING: (RunStatus.RUNNING, QueueState.STARTING),
    RunPhase.RUNNING: (RunStatus.RUNNING, QueueState.RUNNING),
    RunPhase.PARKED: (RunStatus.RUNNING, QueueState.PARKED),
    RunPhase.WAITING: (RunStatus.WAITING, QueueState.PARKED),
    RunPhase.COMPLETED: (RunStatus.COMPLETED, QueueState.DONE),
    RunPhase.FAILED: (RunStatus.FAILED, QueueState.FAILED),
    RunPhase.TIMED_OUT: (RunStatus.TIMED_OUT, QueueState.FAILED),
    RunPhase.CANCELLED: (RunStatus.CANCELLED, QueueState.CANCELLED),
}
_BY_PAIR = {pair: phase for phase, pair in _PROJECTION.items()}
_TERMINAL = frozenset({RunPhase.COMPLETED, RunPhase.FAILED, RunPhase.TIMED_OUT, RunPhase.CANCELLED})
NONTERMINAL_PHASES = frozenset(RunPhase) - _TERMINAL

P = RunPhase
# The transition table; letters match docs/storage.md. (a) enqueue creates QUEUED.
TRANSITIONS: Mapping[RunPhase, frozenset[RunPhase]] = {
    # (b) claim for launch, (k) pause flag, (h) fail, (j) cancel
    P.QUEUED: frozenset({P.STARTING, P.QUEUED, P.FAILED, P.CANCELLED}),
    # (c) runner live, (d) park or pause, (f) requeue, (h) fail, (j) cancel
    P.STARTING: frozenset({P.RUNNING, P.PARKED, P.QUEUED, P.FAILED, P.CANCELLED}),
    # (k) node progress, (d) park or pause, (e) wait, (f) requeue, (g) complete,
    # (h) fail, (i) time out, (j) cancel
    P.RUNNING: frozenset(
        {P.RUNNING, P.PARKED, P.WAITING, P.QUEUED, P.COMPLETED, P.FAILED, P.TIMED_OUT, P.CANCELLED}
    ),
    # (f) resume or requeue, (k) pause flag, (h) fail, (j) cancel
    P.PARKED: frozenset({P.QUEUED, P.PARKED, P.FAILED, P.CANCELLED}),
    # (f) continue, (k) pause flag, (g) settled, (h) fail, (i) deadline, (j) cancel
    P.WAITING: frozenset({P.QUEUED, P.WAITING, P.COMPLETED, P.FAILED, P.TIMED_OUT, P.CANCELLED}),
    P.COMPLETED: frozenset(),
    P.FAILED: frozenset(),
    P.TIMED_OUT: frozenset(),
    P.CANCELLED: frozenset(),
}


def phase_of(run_status: str, queue_state: str | None) -> RunPhase | None:
    """Return the lifecycle phase of a stored (status, queue state) pair, or None."""
    if queue_state is None:
        return None
    try:
        return _BY_PAIR.get((RunStatus(run_status), QueueState(queue_state)))
    except ValueError:
        return None


def is_transition_allowed(source: RunPhase, target: RunPhase) -> bool:
    """Whether the lifecycle table allows `source` → `target`."""
    return target in TRANSITIONS[source]


def check_transition(run_id: str, source: RunPhase, target: RunPhase, operation: str) -> None:
    """Raise `InvalidTransitionError` unless the table allows `source` → `target`."""
    if not is_transition_allowed(source, target):
        raise InvalidTransitionError(run_id, source.value, operation)
