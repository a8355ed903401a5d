"""Typed rows returned by storage reads: one frozen dataclass per projection.

Field names equal the selected column names, so `Reader.fetch_one(sql, params, Row)`
builds them directly. No row type carries a claim token or token hash. Internal
module; `pi_workflows.storage` exports the row types.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "EventRow",
    "LeaseRow",
    "NodeAttemptRow",
    "QueueRow",
    "RunRow",
    "RunSummary",
    "RunnerEpochRow",
    "ServerLeaseRow",
]


@dataclass(frozen=True, slots=True)
class RunRow:
    """One `runs` row. `source_identity` and `input` are JSON text."""

    run_id: str
    workflow_name: str
    title: str | None
    project_path: str
    source_identity: str
    definition_digest: str
    input_hash: str
    input: str
    status: str
    paused: int
    revision: int
    generation: int
    root_run_id: str
    parent_run_id: str | None
    restart_of: str | None
    continuation_of: str | None
    created_at: int
    updated_at: int
    finished_at: int | None
    failure_class: str | None
    failure_reason: str | None


@dataclass(frozen=True, slots=True)
class RunSummary:
    """The status facts of one run for the run list (no input, no history)."""

    run_id: str
    workflow_name: str
    title: str | None
    status: str
    paused: int
    revision: int
    queue_state: str | None
    park_reason: str | None
    created_at: int
    updated_at: int
    finished_at: int | None
    failure_class: str | None
    execution_mode: str | None
    """`run_bindings.execution_mode` (`headless` or `interactive`); None without a binding."""
    ambiguous_effect: int = 0
    """1 when the run has an effect in state `ambiguous` (an indexed EXISTS, not a load)."""
    runner_active: int = 0
    """1 when the run has a starting or ready runner epoch."""
    turn_open: int = 0
    """1 when an origin-session model turn of the run is open."""
    continuation_of: str | None = None
    """The run this one continues (its checkpoint was answered), if any."""
    continued_by: str | None = None
    """The run that continues this one after its checkpoint, if any (the newest)."""
    current_node: str | None = None
    """The node of the run's unfinished attempt, if any."""
    decision_node: str | None = None
    """The node of the run's pending checkpoint or decision, if any."""


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One `run_queue` row."""

    run_id: str
    state: str
    kind: str
    priority: int
    enqueued_at: int
    park_reason: str | None
    updated_at: int


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """One `leases` row without its token hash."""

    resource: str
    owner_type: str
    owner_id: str
    generation: int
    acquired_at: int
    heartbeat_at: int
    expires_at: int


@dataclass(frozen=True, slots=True)
class EventRow:
    """One immutable `events` row; `payload` is JSON text."""

    run_id: str
    revision: int
    event_type: str
    generation: int
    payload: str
    recorded_at: int


@dataclass(frozen=True, slots=True)
class NodeAttemptRow:
    """One `node_attempts` row."""

    attempt_id: str
    run_id: str
    node_path: str
    node_type: str
    visit: int
    generation: int
    status: str
    started_at: int
    deadline_at: int | None
    finished_at: int | None
    output_hash: str | None
    error: str | None
    next_node_path: str | None
    """The node the runner routed to when this attempt finished, if any."""


@dataclass(frozen=True, slots=True)
class RunnerEpochRow:
    """One `runner_epochs` row (a runner epoch)."""

    runner_epoch: str
    run_id: str
    generation: int
    launch_envelope_hash: str
    pid: int | None
    process_start_time: int | None
    status: str
    started_at: int
    ready_at: int | None
    ready_revision: int | None
    finished_at: int | None
    exit_code: int | None
    signal: int | None
    diagnostic_hash: str | None


@dataclass(frozen=True, slots=True)
class ServerLeaseRow:
    """The `server_lease` row without its token hash."""

    epoch: int
    owner_id: str
    pid: int | None
    acquired_at: int
    heartbeat_at: int
    expires_at: int
    released_at: int | None
