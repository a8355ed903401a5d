"""Startup recovery records: processes to reap, stale runner epochs, stale run claims.

Implements the storage side of workflow-server.md § Recovery steps 2, 3 and 6 and the
expired-row takeover of § Pause and cancellation; the server sends the signals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pi_workflows.storage._claims import (
    TERMINAL_STATUSES,
    Claim,
    OwnerType,
    grant_claim,
    read_head,
)
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._errors import ClaimHeldError, InvalidTransitionError
from pi_workflows.storage._execution import record_runner_exit
from pi_workflows.storage._lifecycle import TransitionResult, park_run, requeue_run
from pi_workflows.storage._phases import ParkReason, RunnerOutcome, RunPhase, phase_of
from pi_workflows.storage._rows import RunnerEpochRow

__all__ = [
    "RecordedProcess",
    "RecoveredRun",
    "close_stale_runner_epoch",
    "forget_recorded_process",
    "forget_recorded_processes",
    "record_process",
    "recorded_processes",
    "recover_expired_runs",
    "recover_stale_run",
    "server_deaths_in_flight",
    "stale_runner_epochs",
    "stale_running_runs",
    "take_over_claim",
]

_INSERT_PROCESS = """
INSERT OR REPLACE INTO runner_processes (
    runner_epoch, pid, start_ticks, boot_id, role, recorded_at
) VALUES (:runner_epoch, :pid, :start_ticks, :boot_id, :role, :now)
"""
_DELETE_PROCESS = "DELETE FROM runner_processes WHERE runner_epoch = :runner_epoch AND pid = :pid"
_DELETE_EPOCH_PROCESSES = "DELETE FROM runner_processes WHERE runner_epoch = :runner_epoch"
_DELETE_ALL_PROCESSES = "DELETE FROM runner_processes"
_SELECT_PROCESSES = """
SELECT runner_epoch, pid, start_ticks, boot_id, role FROM runner_processes
ORDER BY role DESC, runner_epoch, pid
"""
_SELECT_ACTIVE_RUNNER_EPOCHS = """
SELECT runner_epoch, run_id, generation, launch_envelope_hash, pid, process_start_time, status,
       started_at, ready_at, ready_revision, finished_at, exit_code, signal, diagnostic_hash
FROM runner_epochs WHERE status IN ('starting', 'ready') ORDER BY started_at, runner_epoch
"""
_SELECT_STALE_RUNS = """
SELECT run_id FROM run_queue WHERE state IN ('starting', 'running') ORDER BY updated_at, run_id
"""
# Claimed runs whose claim lapsed and that no live runner of this server holds: a live
# server's own recovery (its claims expired during a stall, its runner exited on
# `claimLost`), or a run that another server (dead, or fenced after a stall) claimed.
_SELECT_EXPIRED_RUNS = """
SELECT q.run_id FROM run_queue q LEFT JOIN leases l ON l.resource = q.run_id
WHERE q.state IN ('starting', 'running')
  AND (l.resource IS NULL OR l.expires_at <= :now)
  AND (l.owner_id IS NOT :owner_id OR NOT EXISTS (
      SELECT 1 FROM runner_epochs e WHERE e.run_id = q.run_id AND e.status IN ('starting', 'ready')
  ))
ORDER BY q.updated_at, q.run_id
"""
_SELECT_RUN_LIVE_EPOCHS = """
SELECT runner_epoch, run_id, generation, launch_envelope_hash, pid, process_start_time, status,
       started_at, ready_at, ready_revision, finished_at, exit_code, signal, diagnostic_hash
FROM runner_epochs WHERE run_id = :run_id AND status IN ('starting', 'ready')
"""
# Orphaned runner epochs (the server died while they were live) since the generation of
# the run's last finished node attempt, that generation's runner included: the server
# deaths with no node finishing in between. Uses `runner_epochs_by_run`.
_COUNT_SERVER_DEATHS = """
SELECT count(*) FROM runner_epochs
WHERE run_id = :run_id AND status = 'orphaned' AND generation >= coalesce((
    SELECT max(generation) FROM node_attempts
    WHERE run_id = :run_id AND status IN ('completed', 'failed', 'timed_out')
), 0)
"""


@dataclass(frozen=True, slots=True)
class RecordedProcess:
    """A process recorded for stopping: a runner, or a group its runner registered."""

    runner_epoch: str
    pid: int
    start_ticks: int
    boot_id: str
    role: str
    """`runner` or `registered`."""


@dataclass(frozen=True, slots=True)
class RecoveredRun:
    """What recovery did with one stale run."""

    run_id: str
    action: str
    """`requeued`, `parked`, `crashLoop` (parked `serverCrashLoop`) or `untouched`
    (already settled, or held by a live claim)."""
    revision: int | None = None


def record_process(
    tx: Tx, runner_epoch: str, *, pid: int, start_ticks: int, boot_id: str, role: str
) -> None:
    """Record a process of a runner epoch, so a later server can stop it after a crash.

    **Durability:** recorded once the enclosing `write()` commits; no run revision change.
    """
    tx.execute(
        _INSERT_PROCESS,
        {
            "runner_epoch": runner_epoch,
            "pid": pid,
            "start_ticks": start_ticks,
            "boot_id": boot_id,
            "role": role,
            "now": tx.now,
        },
    )


def forget_recorded_process(tx: Tx, runner_epoch: str, pid: int) -> None:
    """The process was unregistered or stopped: nothing left to reap for it."""
    tx.execute(_DELETE_PROCESS, {"runner_epoch": runner_epoch, "pid": pid})


def forget_recorded_processes(tx: Tx, runner_epoch: str | None = None) -> None:
    """Forget every recorded process of one epoch, or of all epochs (after recovery)."""
    if runner_epoch is None:
        tx.execute(_DELETE_ALL_PROCESSES)
    else:
        tx.execute(_DELETE_EPOCH_PROCESSES, {"runner_epoch": runner_epoch})


def recorded_processes(reader: Reader) -> list[RecordedProcess]:
    """Every recorded process, registered groups first (they are stopped before runners)."""
    return reader.fetch_all(_SELECT_PROCESSES, {}, RecordedProcess)


def stale_runner_epochs(reader: Reader) -> list[RunnerEpochRow]:
    """Runner epochs without a terminal outcome: at startup, all belong to a dead server."""
    return reader.fetch_all(_SELECT_ACTIVE_RUNNER_EPOCHS, {}, RunnerEpochRow)


@dataclass(frozen=True, slots=True)
class _RunId:
    run_id: str


def stale_running_runs(reader: Reader) -> list[str]:
    """Runs whose queue row says a runner holds or is taking them (starting or running)."""
    return [row.run_id for row in reader.fetch_all(_SELECT_STALE_RUNS, {}, _RunId)]


def server_deaths_in_flight(reader: Reader, run_id: str) -> int:
    """How many times the server died while this run had a live runner, since a node of
    the run last finished (the runner that finished it counts, if it was orphaned too).

    A death is a runner epoch that startup recovery closed as `orphaned`: it was live
    when its server epoch ended without a clean stop (a clean stop hands every run back
    and closes its runner epochs first).
    """
    return int(reader.fetch_value(_COUNT_SERVER_DEATHS, {"run_id": run_id}))


def take_over_claim(
    tx: Tx,
    run_id: str,
    *,
    owner_id: str,
    owner_is_gone: Callable[[str, str], bool],
    ttl_ms: int,
) -> Claim:
    """Take a control claim on a run whose lease is absent, expired, or proven dead.

    `owner_is_gone(owner_type, owner_id)` is the caller's proof that a still-unexpired
    lease's owner no longer exists (the server holding the global lock proves every other
    host dead). A live claim of a live owner is never taken: this is the only path by
    which recovery or a cancel of an expired row gets authority, and it increases the
    generation, fencing the old holder.

    Raises:
        InvalidTransitionError: the run is terminal.
        ClaimHeldError: a live claim whose owner is not proven gone.
    """
    head = read_head(tx, run_id)
    if head.status in TERMINAL_STATUSES:
        raise InvalidTransitionError(run_id, head.status, "take over a claim")
    if head.lease_is_live(tx.now):
        assert head.lease_owner_type is not None and head.lease_owner_id is not None
        if not owner_is_gone(head.lease_owner_type, head.lease_owner_id):
            assert head.lease_generation is not None and head.lease_expires_at is not None
            raise ClaimHeldError(run_id, head.lease_generation, head.lease_expires_at)
    return grant_claim(tx, head, OwnerType.CONTROL, owner_id, ttl_ms)


def recover_stale_run(
    tx: Tx,
    run_id: str,
    *,
    owner_id: str,
    owner_is_gone: Callable[[str, str], bool],
    ttl_ms: int,
    crash_limit: int | None = None,
) -> RecoveredRun:
    """Make one run a dead server held claimable again, from its last durable boundary.

    Takes a control claim (a new generation), then requeues the run: the running attempt
    is interrupted (a pure node may run again; an effect's stored state decides on the
    next runner: an applied receipt is adopted, an applying effect is proven by read-back
    or becomes `ambiguous` and parks the run). Claim loss is a handoff: no terminal event.
    A paused run is parked instead of requeued. With `crash_limit`, a run the server died
    under that many times (`server_deaths_in_flight`; its runner epochs are closed first)
    parks with `serverCrashLoop` instead, so a run that kills the server cannot kill
    every next one; `resume_run` or a cancel is the operator's.
    """
    head = read_head(tx, run_id)
    phase = phase_of(head.status, head.queue_state)
    if phase not in (RunPhase.STARTING, RunPhase.RUNNING):
        return RecoveredRun(run_id, "untouched")
    try:
        claim = take_over_claim(
            tx, run_id, owner_id=owner_id, owner_is_gone=owner_is_gone, ttl_ms=ttl_ms
        )
    except ClaimHeldError:
        return RecoveredRun(run_id, "untouched")
    result: TransitionResult
    if head.paused:
        result = park_run(tx, claim, reason="serverRecovered")
        return RecoveredRun(run_id, "parked", result.revision)
    if crash_limit is not None:
        deaths = server_deaths_in_flight(tx, run_id)
        if deaths >= crash_limit:
            detail = f"the server died {deaths} times while this run was in flight"
            result = park_run(tx, claim, reason=ParkReason.SERVER_CRASH_LOOP, detail=detail)
            return RecoveredRun(run_id, "crashLoop", result.revision)
    result = requeue_run(tx, run_id, reason="serverRecovered", claim=claim)
    return RecoveredRun(run_id, "requeued", result.revision)


def recover_expired_runs(tx: Tx, *, owner_id: str, ttl_ms: int) -> list[RecoveredRun]:
    """A live server's recovery of claimed runs whose claim expired with no runner of its
    own left to write (a stall outlived the claims, and the runner exited on `claimLost`;
    or another server claimed the run and is gone): the same as startup recovery does
    for them. A live runner epoch of another server is closed as `orphaned` first.

    Only expired (or missing) claims are taken over, so a live claim is never touched;
    cheap when there is nothing to do (the claim renewer calls it every round).
    """
    recovered: list[RecoveredRun] = []
    for row in tx.fetch_all(_SELECT_EXPIRED_RUNS, {"now": tx.now, "owner_id": owner_id}, _RunId):
        for runner in tx.fetch_all(_SELECT_RUN_LIVE_EPOCHS, {"run_id": row.run_id}, RunnerEpochRow):
            close_stale_runner_epoch(tx, runner)
        result = recover_stale_run(
            tx, row.run_id, owner_id=owner_id, owner_is_gone=_never, ttl_ms=ttl_ms
        )
        if result.action != "untouched":
            recovered.append(result)
    return recovered


def _never(owner_type: str, owner_id: str) -> bool:
    return False


def close_stale_runner_epoch(tx: Tx, runner: RunnerEpochRow) -> None:
    """Record `orphaned`, the one terminal outcome of a runner whose server died."""
    record_runner_exit(tx, runner.runner_epoch, outcome=RunnerOutcome.ORPHANED)
