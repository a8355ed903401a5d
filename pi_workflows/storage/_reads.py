"""Typed read helpers over runs, queue, events, attempts and runner epochs.

Implements the reads that workflow-server.md § Worker scheduling, § Recovery and
§ Status and privacy need. Every function takes a `Reader` (a `Database` or an open
`Tx`) and changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pi_workflows.storage import _queries as q
from pi_workflows.storage._db import Reader
from pi_workflows.storage._phases import QueueKind, RunPhase, phase_of
from pi_workflows.storage._rows import (
    EventRow,
    NodeAttemptRow,
    QueueRow,
    RunnerEpochRow,
    RunRow,
    RunSummary,
)

__all__ = [
    "STATE_COUNT_NAMES",
    "RunListFilter",
    "StateSize",
    "StatusCounts",
    "active_queue_count",
    "active_runner",
    "active_runners",
    "admissible_runs",
    "count_runner_outcomes",
    "expired_claimed_runs",
    "get_attempt",
    "get_phase",
    "get_queue_row",
    "get_run",
    "get_run_summary",
    "get_runner",
    "list_attempts",
    "list_events",
    "list_runner_epochs",
    "list_runs",
    "list_runs_filtered",
    "run_list_revision",
    "run_paused",
    "run_unfinished_unpaused",
    "run_view_revision",
    "server_has_work",
    "state_counts",
    "state_size",
    "status_counts",
    "unfinished_attempt",
]

# Keyset start for the newest page: larger than any epoch-millisecond time.
_NEWEST = 2**62


def get_run(reader: Reader, run_id: str) -> RunRow | None:
    """Return the complete run row, or None."""
    return reader.fetch_one(q.SELECT_RUN, {"run_id": run_id}, RunRow)


def run_paused(reader: Reader, run_id: str) -> bool:
    """Whether the run is paused (an unknown run is not)."""
    return bool(reader.fetch_value(q.SELECT_RUN_PAUSED, {"run_id": run_id}))


def run_unfinished_unpaused(reader: Reader, run_id: str) -> bool:
    """Whether the run exists, is not finished and is not paused."""
    paused = reader.fetch_value(q.SELECT_UNFINISHED_RUN_PAUSED, {"run_id": run_id})
    return paused is not None and int(paused) == 0


def get_queue_row(reader: Reader, run_id: str) -> QueueRow | None:
    """Return the run's queue row, or None."""
    return reader.fetch_one(q.SELECT_QUEUE_ROW, {"run_id": run_id}, QueueRow)


def get_phase(reader: Reader, run_id: str) -> RunPhase | None:
    """Return the run's lifecycle phase; None if it is missing or inconsistent."""
    run = get_run(reader, run_id)
    queue = get_queue_row(reader, run_id)
    if run is None or queue is None:
        return None
    return phase_of(run.status, queue.state)


def list_runs(
    reader: Reader,
    *,
    limit: int = 256,
    before: tuple[int, str] | None = None,
) -> list[RunSummary]:
    """Return one page of the run list, newest first (status facts only).

    Args:
        limit: page size.
        before: the `(created_at, run_id)` of the last row of the previous page.
    """
    created_at, run_id = before if before is not None else (_NEWEST, "")
    return reader.fetch_all(
        q.SELECT_RUN_SUMMARIES,
        {"before_created_at": created_at, "before_run_id": run_id, "limit": limit},
        RunSummary,
    )


@dataclass(frozen=True, slots=True)
class RunListFilter:
    """Which runs a run-list page holds; None turns a filter off."""

    statuses: tuple[str, ...] | None = None
    """Display statuses (`queued`, `running`, ... `ambiguous`)."""
    workflow: str | None = None
    project: str | None = None
    """The exact project path the run was started with."""
    since: int | None = None
    """Created at or after this epoch-millisecond time."""
    until: int | None = None
    """Created before this epoch-millisecond time."""


def list_runs_filtered(
    reader: Reader,
    run_filter: RunListFilter,
    *,
    limit: int,
    before: tuple[int, str] | None = None,
) -> list[RunSummary]:
    """Return one filtered page of the run list, newest first (status facts only).

    Each filter that is on drives an index (status, workflow, project, creation time),
    so a filter that few of many runs match still reads about one page of rows.
    """
    created_at, run_id = before if before is not None else (_NEWEST, "")
    params: dict[str, object] = {
        "before_created_at": created_at,
        "before_run_id": run_id,
        "limit": limit,
        "workflow": run_filter.workflow,
        "project": run_filter.project,
        "since": run_filter.since,
        "until": run_filter.until,
    }
    drivers: tuple[str, ...] = ()
    if run_filter.statuses is not None:
        params["statuses"] = json.dumps(list(run_filter.statuses))
        drivers = tuple(
            sorted({d for status in run_filter.statuses for d in q.DRIVERS_OF_DISPLAY[status]})
        )
    sql = q.filtered_run_summaries_sql(
        workflow=run_filter.workflow is not None,
        project=run_filter.project is not None,
        since=run_filter.since is not None,
        until=run_filter.until is not None,
        drivers=drivers,
    )
    return reader.fetch_all(sql, params, RunSummary)


def get_run_summary(reader: Reader, run_id: str) -> RunSummary | None:
    """Return the status facts of one run, or None."""
    return reader.fetch_one(q.SELECT_RUN_SUMMARY, {"run_id": run_id}, RunSummary)


def run_list_revision(reader: Reader) -> int:
    """Return the run list's revision, O(1): a counter that triggers on `runs` raise with
    every inserted, updated or deleted run row (and so with every change a run's view
    shows, which bumps its row). It grows with every committed run change and never goes
    back, not even when runs are pruned.
    """
    return int(reader.fetch_value(q.SELECT_RUN_LIST_REVISION, {}))


def run_view_revision(reader: Reader, run_id: str) -> int | None:
    """Return the presentation revision of one run's view, or None if there is no run.

    The lightweight check an unchanged run subscription makes instead of a rebuild: the
    run's event revision plus `view_changes`, which triggers raise when a row the view
    shows changes without an event (a runner epoch, a queue move, an effect, a request,
    a decision, a restart or continuation of this run). Both only grow.
    """
    value = reader.fetch_value(q.SELECT_RUN_VIEW_REVISION, {"run_id": run_id})
    return None if value is None else int(value)


def list_events(
    reader: Reader, run_id: str, *, after_revision: int = 0, limit: int = 256
) -> list[EventRow]:
    """Return the run's events with revision > `after_revision`, in revision order."""
    return reader.fetch_all(
        q.SELECT_EVENTS,
        {"run_id": run_id, "after_revision": after_revision, "limit": limit},
        EventRow,
    )


def admissible_runs(reader: Reader, kind: QueueKind, *, limit: int = 1) -> list[QueueRow]:
    """Return queued, unpaused runs of `kind`, best first (priority, then age)."""
    return reader.fetch_all(
        q.SELECT_ADMISSIBLE_RUNS, {"kind": kind.value, "limit": limit}, QueueRow
    )


def active_queue_count(reader: Reader) -> int:
    """Return how many runs are starting or running (capacity counts pending launches)."""
    return int(reader.fetch_value(q.COUNT_ACTIVE_QUEUE_ROWS, {}))


def server_has_work(reader: Reader) -> bool:
    """Whether durable state needs the server to stay up (workflow-server.md § Server lifecycle).

    True while a run is admissible (queued, unpaused), starting or running; a claim or
    an active runner epoch exists; a waiting attempt has a deadline; an effect is
    unsettled; a submission is validating; or a pending decision has a deadline or an
    external channel; or a resource key is queued or a reconcile pass holds a claim.
    Connected clients are the caller's part of the rule.
    """
    return bool(reader.fetch_value(q.SELECT_SERVER_HAS_WORK, {}))


def expired_claimed_runs(reader: Reader, now: int) -> list[QueueRow]:
    """Return starting or running runs whose claim is expired or missing at `now`."""
    return reader.fetch_all(q.SELECT_EXPIRED_CLAIMED_RUNS, {"now": now}, QueueRow)


def get_attempt(reader: Reader, attempt_id: str) -> NodeAttemptRow | None:
    """Return one attempt, or None."""
    return reader.fetch_one(q.SELECT_NODE_ATTEMPT, {"attempt_id": attempt_id}, NodeAttemptRow)


def unfinished_attempt(reader: Reader, run_id: str) -> NodeAttemptRow | None:
    """Return the run's unfinished (running or waiting) attempt: its current node."""
    return reader.fetch_one(q.SELECT_UNFINISHED_ATTEMPT, {"run_id": run_id}, NodeAttemptRow)


def list_attempts(reader: Reader, run_id: str) -> list[NodeAttemptRow]:
    """Return every attempt of a run in start order."""
    return reader.fetch_all(q.SELECT_RUN_ATTEMPTS, {"run_id": run_id}, NodeAttemptRow)


def get_runner(reader: Reader, runner_epoch: str) -> RunnerEpochRow | None:
    """Return one runner epoch."""
    return reader.fetch_one(q.SELECT_RUNNER_EPOCH, {"runner_epoch": runner_epoch}, RunnerEpochRow)


def list_runner_epochs(reader: Reader, run_id: str) -> list[RunnerEpochRow]:
    """Return every runner epoch of a run, in launch order."""
    return reader.fetch_all(q.SELECT_RUN_RUNNER_EPOCHS, {"run_id": run_id}, RunnerEpochRow)


def active_runner(reader: Reader, run_id: str) -> RunnerEpochRow | None:
    """Return the run's active (starting or ready) runner epoch, if any."""
    return reader.fetch_one(q.SELECT_ACTIVE_RUNNER_EPOCH, {"run_id": run_id}, RunnerEpochRow)


def count_runner_outcomes(reader: Reader, run_id: str, outcome: str) -> int:
    """Return how many runner epochs of the run ended with `outcome` (e.g. `crashed`)."""
    return int(reader.fetch_value(q.COUNT_RUNNER_OUTCOMES, {"run_id": run_id, "outcome": outcome}))


def active_runners(reader: Reader) -> list[RunnerEpochRow]:
    """Return every active runner epoch (orphan checks after a restart)."""
    return reader.fetch_all(q.SELECT_ACTIVE_RUNNER_EPOCHS, {}, RunnerEpochRow)


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """Safe counts for `server status`: no IDs, paths, payloads or tokens."""

    runs_by_status: dict[str, int]
    queue_by_state: dict[str, int]
    expired_claims: int
    pending_interactions: int
    ambiguous_effects: int
    active_runners: int
    """Runner epochs launched and not yet exited: startup recovery closed every epoch of
    an earlier server, so these are this server's."""


@dataclass(frozen=True, slots=True)
class _Count:
    kind: str
    key: str
    n: int


def status_counts(reader: Reader, now: int) -> StatusCounts:
    """Return the safe counts of `server status`; `now` decides which claims expired.

    One statement, so the counts are one consistent snapshot even outside a read
    transaction.
    """
    by_kind: dict[str, dict[str, int]] = {}
    for row in reader.fetch_all(q.SELECT_STATUS_COUNTS, {"now": now}, _Count):
        by_kind.setdefault(row.kind, {})[row.key] = row.n
    single = {kind: sum(counts.values()) for kind, counts in by_kind.items()}
    return StatusCounts(
        runs_by_status=by_kind.get("runs", {}),
        queue_by_state=by_kind.get("queue", {}),
        expired_claims=single.get("expired", 0),
        pending_interactions=single.get("pending", 0),
        ambiguous_effects=single.get("ambiguous", 0),
        active_runners=single.get("runners", 0),
    )


@dataclass(frozen=True, slots=True)
class _Named:
    kind: str
    n: int


STATE_COUNT_NAMES = (
    "runs",
    "nonterminalRuns",
    "pendingDecisions",
    "pendingInteractions",
    "pendingFollowUps",
    "pendingWorkflowMessages",
    "activeLeases",
    "unsettledEffects",
    "ambiguousEffects",
    "blobs",
    "viewContents",
)
"""The counts of `state status`, in the order the CLI prints them."""


@dataclass(frozen=True, slots=True)
class StateSize:
    """The database file's size in pages, and how much of it is free for reuse."""

    page_size: int
    page_count: int
    freelist_count: int


def state_counts(reader: Reader, now: int) -> dict[str, int]:
    """The safe counts of `state status` (no IDs, paths or payloads); `now` ages claims."""
    counts = dict.fromkeys(STATE_COUNT_NAMES, 0)
    for row in reader.fetch_all(q.SELECT_STATE_COUNTS, {"now": now}, _Named):
        counts[row.kind] = row.n
    return counts


def state_size(reader: Reader) -> StateSize:
    """`PRAGMA page_size`, `page_count` and `freelist_count` of the main database."""
    return StateSize(
        page_size=int(reader.fetch_value("PRAGMA page_size", {})),
        page_count=int(reader.fetch_value("PRAGMA page_count", {})),
        freelist_count=int(reader.fetch_value("PRAGMA freelist_count", {})),
    )
