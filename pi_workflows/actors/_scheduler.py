"""The scheduler: durable admission of queued runs within the runner capacity.

Implements workflow-server.md § Worker scheduling. Requests stay durable in
`run_queue` while capacity is full; capacity counts pending launches (`starting`)
and live runners (`running`); workflow and resource-manager admissions alternate
when both wait. Each admitted run goes to the runner-host actor as `Launch`; with no
runner host (a server that only records runs), nothing is admitted.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Reply, ServerActor, tell_if_alive
from pi_workflows.actors._database import Transact
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import LaunchPlan, prepare_launch
from pi_workflows.errors import PiWorkflowsError
from pi_workflows.storage import (
    Database,
    QueueKind,
    QueueRow,
    active_queue_count,
    admissible_runs,
    holds_server_lease,
)

__all__ = ["AdmissionPlan", "Launch", "SchedulerActor", "Wake", "plan_admissions"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Launch:
    """To the runner host: a run was admitted and claimed; start its runner."""

    plan: LaunchPlan


@dataclass(frozen=True, slots=True)
class Wake:
    """Something became admissible (a start, resume or runner exit): plan now."""


@dataclass(frozen=True, slots=True)
class AdmissionPlan:
    """What one planning round found (the reply of its database read)."""

    reply: Reply
    """A list of `LaunchPlan`s (admitted and claimed, in order), or the read's error."""


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


class SchedulerActor(ServerActor):
    """Owns: the admission decision and the alternation between queue kinds.

    Receives: `Tick`, `Wake`, `AdmissionPlan`.
    Sends: `Transact` to the database actor; `Launch` to the runner host.
    Invariants: one planning round at a time, so two rounds never admit the same
        slot; a full capacity leaves every request queued and durable.
    On failure: reported to the server; queued runs stay queued in SQLite.
    """

    name = "scheduler"

    def __init__(
        self,
        database: pykka.ActorRef[Any],
        capacity: int,
        runner_host: pykka.ActorRef[Any] | None,
        on_actor_failure: ActorFailureHandler,
        owner_id: str = "server",
    ) -> None:
        super().__init__(on_actor_failure)
        self._owner_id = owner_id
        self._database = database
        self._capacity = capacity
        self._runner_host = runner_host
        self._planning = False
        self._last_kind: QueueKind | None = None

    def on_receive(self, message: Any) -> Any:
        match message:
            case Tick() | Wake():
                if not self._planning and self._runner_host is not None:
                    self._plan()
            case AdmissionPlan(reply=reply):
                self._planning = False
                if reply.error is not None:
                    log.warning(
                        "admission read failed",
                        extra={"action": "scheduler.error", "reason": type(reply.error).__name__},
                    )
                    return None
                for kind, plan in reply.value:
                    assert self._runner_host is not None
                    self._last_kind = kind
                    self._runner_host.tell(Launch(plan))
            case _:
                raise TypeError(f"scheduler got {type(message).__name__}")
        return None

    def _plan(self) -> None:
        me = self.actor_ref
        work = functools.partial(
            admit, capacity=self._capacity, last_kind=self._last_kind, owner_id=self._owner_id
        )
        self._planning = True
        self._database.tell(
            Transact(
                work,
                lambda reply: tell_if_alive(me, AdmissionPlan(reply)),
                "plan",
                hold_when_full=True,  # a full disk delays admission; it is not an error
            )
        )


def admit(
    db: Database, capacity: int, last_kind: QueueKind | None, owner_id: str
) -> list[tuple[QueueKind, LaunchPlan]]:
    """Choose the runs to admit and claim each for a new runner generation.

    Admission and claim are one unit of database work, so a later planning round always
    counts these launches as `starting` and capacity is never exceeded.
    """
    free = capacity - active_queue_count(db)
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
