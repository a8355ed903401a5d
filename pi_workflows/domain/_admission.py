"""Admission: which queued runs and due reconciles start now, claimed in the same unit.

Implements workflow-server.md § Worker scheduling for the scheduler actor, the one
decider: capacity counts pending launches, live runners and live reconcile claims;
workflow and resource-manager admissions alternate when both wait; each admitted run is
claimed for a new runner generation and each admitted reconcile claims its key.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pi_workflows.domain._runner_launch import LaunchPlan, prepare_launch
from pi_workflows.errors import PiWorkflowsError
from pi_workflows.storage import (
    RESOURCE_OWNER,
    ClaimedReconcile,
    Database,
    QueueKind,
    QueueRow,
    active_queue_count,
    admissible_runs,
    claim_next_resource,
    count_due_reconciles,
    count_reconciling,
    holds_server_lease,
)

__all__ = ["DueReconcile", "admit", "plan_admissions"]

_Waiting = TypeVar("_Waiting")

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DueReconcile:
    """A due resource key waiting for a slot (which key is chosen when it is claimed)."""


_DUE = DueReconcile()


def plan_admissions(
    free_slots: int,
    waiting: Mapping[QueueKind, Sequence[_Waiting]],
    last_kind: QueueKind | None,
) -> list[_Waiting]:
    """Choose which waiting runs to admit into `free_slots`, alternating kinds.

    The kind admitted last goes after the other when both wait, so neither
    workflows nor resource reconciles can starve the other.
    """
    order = [QueueKind.WORKFLOW, QueueKind.RESOURCE]
    if last_kind is QueueKind.WORKFLOW:
        order.reverse()
    queues = {kind: list(waiting.get(kind, [])) for kind in order}
    chosen: list[_Waiting] = []
    while len(chosen) < free_slots and any(queues.values()):
        for kind in order:
            if queues[kind] and len(chosen) < free_slots:
                chosen.append(queues[kind].pop(0))
    return chosen


def admit(
    db: Database,
    capacity: int,
    last_kind: QueueKind | None,
    owner_id: str,
    reconcile_ttl_ms: int | None = None,
) -> list[tuple[QueueKind, LaunchPlan | ClaimedReconcile]]:
    """Choose what to admit and claim each: a run for a new runner generation, a due
    resource key for one reconcile pass (`reconcile_ttl_ms` None: reconciles are not
    admitted yet, as before recovery step 7 returned a dead server's claims).

    Admission and claim are one unit of database work, so a later planning round always
    counts these launches as `starting` (and passes as live claims): capacity is never
    exceeded, and the alternation is decided in one place.
    """
    now = db.clock.now_ms()
    free = capacity - active_queue_count(db) - count_reconciling(db, now)
    if free <= 0:
        return []
    waiting: dict[QueueKind, list[QueueRow | DueReconcile]] = {
        kind: list(admissible_runs(db, kind, limit=free)) for kind in QueueKind
    }
    if reconcile_ttl_ms is not None:
        waiting[QueueKind.RESOURCE].extend([_DUE] * min(free, count_due_reconciles(db, now)))
    if any(waiting.values()) and not holds_server_lease(db, owner_id, now):
        return []  # woken from a stall past the lease, or lost it: claim nothing new
    admitted: list[tuple[QueueKind, LaunchPlan | ClaimedReconcile]] = []
    for item in plan_admissions(free, waiting, last_kind):
        if isinstance(item, DueReconcile):
            assert reconcile_ttl_ms is not None
            claimed = _claim_reconcile(db, owner_id, reconcile_ttl_ms)
            if claimed is not None:
                admitted.append((QueueKind.RESOURCE, claimed))
            continue
        plan = _claim_run(db, item, owner_id)
        if plan is not None:
            admitted.append((QueueKind(item.kind), plan))
    return admitted


def _claim_reconcile(db: Database, owner_id: str, ttl_ms: int) -> ClaimedReconcile | None:
    with db.write() as tx:
        return claim_next_resource(tx, owner_id=owner_id, owner_type=RESOURCE_OWNER, ttl_ms=ttl_ms)


def _claim_run(db: Database, row: QueueRow, owner_id: str) -> LaunchPlan | None:
    try:
        return prepare_launch(db, row.run_id, owner_id)
    except PiWorkflowsError as exc:  # the row changed meanwhile: skip it
        log.info(
            "run not claimed for launch",
            extra={
                "action": "runner.launch_skipped",
                "run_id": row.run_id,
                "reason": type(exc).__name__,
            },
        )
        return None
