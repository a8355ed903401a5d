"""Startup recovery: after the epoch, before any actor, client or runner.

Implements workflow-server.md § Recovery steps 2–6 (and the hook for 7–12) for the parts
built so far. It runs on the starting thread with the database directly: nothing else
exists yet, so no other write can interleave. Every step is idempotent, so a crash
inside recovery (a crash point sits there) is recovered by the next start:

1. Stop every recorded process (registered groups first, then runners) by exact
   identity (PID, kernel start ticks, boot ID); a reused PID is never signalled.
2. Close each runner epoch left without an outcome as `orphaned`.
3. For each run a dead server held (`starting` or `running`), take a control claim
   (a new generation) and requeue it from its last durable boundary; a paused one parks.
   Effect state is read by the next runner before anything repeats: an applied receipt
   is adopted, an applying effect is proven by read-back or parks the run `ambiguous`.
   A run the server died under `MAX_RUNNER_CRASHES` times with no node finishing in
   between parks with `serverCrashLoop`: it may be what kills the server, and the next
   server must stay up.
4. Design steps 7 and 8: pending interactive requests, workflow messages and turns are
   left as they are (no Pi state changes; the step timers were already stopped at the
   old server's last heartbeat, in the transaction that took the new epoch), and every
   request whose node timeout ran out during reported model turns takes the timeout
   path (`domain/_deadlines.py::expire_due`) before any actor exists, so before
   anything else is scheduled, a validation resumed or a report accepted. The same
   unit first lets the default answer win every protected decision whose deadline
   passed (design step 7: due decision timeouts run first).
5. Later parts plug in at `LATER_STEPS`: first channels (every Telegram attempt a dead
   server left applying becomes `ambiguous`, never sent again automatically:
   `domain/_channel_work.py`), then resource claims (step 7: every claim returns its
   key to the queue, `domain/_resource_work.py`).

Design step 9 (validate every `validating` submission again in a new child) needs the
actors, so it runs after them: `WorkflowServer` tells the validations actor
`ResumeValidations` (`actors/_validations.py`, `domain/_interactions.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pi_workflows.domain._channel_work import recover_channels_at_startup
from pi_workflows.domain._deadlines import expire_due
from pi_workflows.domain._resource_work import recover_reconcile_claims
from pi_workflows.domain._runner_exits import MAX_RUNNER_CRASHES
from pi_workflows.storage import (
    Database,
    OwnerType,
    close_stale_runner_epoch,
    forget_recorded_processes,
    recorded_processes,
    recover_stale_run,
    stale_runner_epochs,
    stale_running_runs,
)
from pi_workflows.supervision import ProcessIdentity, crash_point

__all__ = ["LATER_STEPS", "RecoveryReport", "StopProcesses", "recover_at_startup"]

StopProcesses = Callable[[tuple[ProcessIdentity, ...]], int]
"""Stops recorded process groups by exact identity and returns how many were alive: the
server passes a call to the process supervisor (`StopRecorded`), the one signaller."""

log = logging.getLogger(__name__)

RECOVERY_CLAIM_TTL_MS = 30_000
RECOVERY_BATCH = 100
"""Runs recovered per transaction."""


def _recover_resource_claims(db: Database) -> None:
    """Design step 7 for resource managers: every claim a dead server's passes held
    returns its key to the queue (this server holds the global lock, so none of those
    passes can still commit)."""
    returned = recover_reconcile_claims(db, every=True)
    if returned:
        log.info(
            "resource claims returned at startup",
            extra={"action": "resource.recovered", "count": len(returned)},
        )


LATER_STEPS: list[Callable[[Database], None]] = [
    recover_channels_at_startup,
    _recover_resource_claims,
]
"""Recovery steps of later parts (design steps 7–12), run in order after the runs."""


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """Counts for the log and for `server.status` (no run IDs, no paths)."""

    processes_stopped: int
    runner_epochs_orphaned: int
    runs_requeued: int
    runs_parked: int
    steps_timed_out: int = 0
    """Runs changed by a due deadline: interactive steps whose node timeout had run out
    (design step 8) and protected decisions whose default answer won."""


def recover_at_startup(
    db: Database, owner_id: str, stop_processes: StopProcesses
) -> RecoveryReport:
    """Recover what a dead server left behind; see the module docstring for the order."""
    crash_point("server.recovery.after_epoch")
    recorded = recorded_processes(db)
    stopped = stop_processes(
        tuple(ProcessIdentity(p.pid, p.start_ticks, p.boot_id) for p in recorded)
    )
    with db.write() as tx:
        stale = stale_runner_epochs(tx)
        for runner_epoch in stale:
            close_stale_runner_epoch(tx, runner_epoch)
        forget_recorded_processes(tx)

    def owner_is_gone(owner_type: str, owner: str) -> bool:
        # Holding the global lock proves every other server, and so every claim a
        # server issued, dead; other owner kinds must wait out their expiry.
        return owner_type in (OwnerType.HOST, OwnerType.CONTROL) and owner != owner_id

    requeued = parked = 0
    crash_looped: list[str] = []
    stale_runs = stale_running_runs(db)
    for start in range(0, len(stale_runs), RECOVERY_BATCH):
        # Each run is recovered whole; a batch shares one commit (one fsync), so a
        # thousand runs take a handful of commits.
        with db.write() as tx:
            for run_id in stale_runs[start : start + RECOVERY_BATCH]:
                recovered = recover_stale_run(
                    tx,
                    run_id,
                    owner_id=owner_id,
                    owner_is_gone=owner_is_gone,
                    ttl_ms=RECOVERY_CLAIM_TTL_MS,
                    crash_limit=MAX_RUNNER_CRASHES,
                )
                requeued += recovered.action == "requeued"
                parked += recovered.action in ("parked", "crashLoop")
                if recovered.action == "crashLoop":
                    crash_looped.append(run_id)
        crash_point("server.recovery.after_first_run")
    for run_id in crash_looped:
        log.warning(
            "the server died under this run again and again; parked for review",
            extra={"action": "run.server_crash_loop", "run_id": run_id},
        )
    timed_out = expire_due(db, owner_id)
    for step in LATER_STEPS:
        step(db)
    report = RecoveryReport(stopped, len(stale), requeued, parked, len(timed_out))
    log.info(
        "startup recovery finished",
        extra={
            "action": "server.recovered",
            "processes_stopped": report.processes_stopped,
            "runner_epochs_orphaned": report.runner_epochs_orphaned,
            "runs_requeued": report.runs_requeued,
            "runs_parked": report.runs_parked,
            "steps_timed_out": report.steps_timed_out,
        },
    )
    return report
