"""Admission: which queued runs start now, claimed in the same unit of work.

Implements workflow-server.md § Worker scheduling for the scheduler actor: capacity
counts pending launches and live runners, workflow and resource-manager admissions
alternate when both wait, and each admitted run is claimed for a new runner generation.
"""

from __future__ import annotations

import logging

from pi_workflows.domain._runner_launch import LaunchPlan, prepare_launch
from pi_workflows.errors import PiWorkflowsError
from pi_workflows.storage import (
    Database,
    QueueKind,
    QueueRow,
    active_queue_count,
    admissible_runs,
    count_reconciling,
    holds_server_lease,
)

__all__ = ["admit", "plan_admissions"]

log = logging.getLogger(__name__)


def plan_admissions(
    free_slots: int,
    waiting: dict[QueueKind, list[QueueRow]],
    last_kind: QueueKind | None,
) -> list[QueueRow]:
    """Choose which waiting runs to admit into `free_slots`, alternating kinds.

    The kind admitted last goes after the other when both wait, so neither
    workflows nor resource reconciles can starve the other.
    """
    order = [QueueKind.WORKFLOW, QueueKind.RESOURCE]
    if last_kind is QueueKind.WORKFLOW:
        order.reverse()
    queues = {kind: list(waiting.get(kind, [])) for kind in order}
    chosen: list[QueueRow] = []
    while len(chosen) < free_slots and any(queues.values()):
        for kind in order:
            if queues[kind] and len(chosen) < free_slots:
                chosen.append(queues[kind].pop(0))
    return chosen


def admit(
    db: Database, capacity: int, last_kind: QueueKind | None, owner_id: str
) -> list[tuple[QueueKind, LaunchPlan]]:
    """Choose the runs to admit and claim each for a new runner generation.

    Admission and claim are one unit of database work, so a later planning round always
    counts these launches as `starting` and capacity is never exceeded.
    """
    # One capacity: resource passes in flight (live resource claims) use slots too.
    free = capacity - active_queue_count(db) - count_reconciling(db, db.clock.now_ms())
    if free <= 0:
        return []
    waiting = {kind: admissible_runs(db, kind, limit=free) for kind in QueueKind}
    if any(waiting.values()) and not holds_server_lease(db, owner_id, db.clock.now_ms()):
        return []  # woken from a stall past the lease, or lost it: claim nothing new
    plans: list[tuple[QueueKind, LaunchPlan]] = []
    for row in plan_admissions(free, waiting, last_kind):
        try:
            plan = prepare_launch(db, row.run_id, owner_id)
        except PiWorkflowsError as exc:  # the row changed meanwhile: skip it
            log.info(
                "run not claimed for launch",
                extra={
                    "action": "runner.launch_skipped",
                    "run_id": row.run_id,
                    "reason": type(exc).__name__,
                },
            )
            continue
        if plan is not None:
            plans.append((QueueKind(row.kind), plan))
    return plans
