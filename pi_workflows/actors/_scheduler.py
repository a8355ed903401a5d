"""The scheduler: durable admission of queued runs within the worker capacity.

Implements workflow-server.md § Worker scheduling. Requests stay durable in
`run_queue` while capacity is full; capacity counts pending launches (`starting`)
and live workers (`running`); workflow and resource-manager admissions alternate
when both wait. Launching a runner is the process supervisor's work (issue 5):
with no launcher configured, admission plans are computed and nothing is claimed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Reply, ServerActor
from pi_workflows.actors._database import Transact
from pi_workflows.actors._ticker import Tick
from pi_workflows.storage import (
    Database,
    QueueKind,
    QueueRow,
    active_queue_count,
    admissible_runs,
)

__all__ = ["AdmissionPlan", "Launcher", "SchedulerActor", "Wake", "plan_admissions"]

log = logging.getLogger(__name__)

Launcher = Callable[[QueueRow], None]
"""Claims and launches one admitted run; must not block (it queues its own work)."""


@dataclass(frozen=True, slots=True)
class Wake:
    """Something became admissible (a start, resume or runner exit): plan now."""


@dataclass(frozen=True, slots=True)
class AdmissionPlan:
    """What one planning round found (the reply of its database read)."""

    reply: Reply
    """A list of `QueueRow` to admit, in order, or the read's error."""


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
    Sends: `Transact` to the database actor; admitted runs to the launcher.
    Invariants: one planning round at a time, so two rounds never admit the same
        slot; a full capacity leaves every request queued and durable.
    On failure: reported to the server; queued runs stay queued in SQLite.
    """

    name = "scheduler"

    def __init__(
        self,
        database: pykka.ActorRef[Any],
        capacity: int,
        launcher: Launcher | None,
        on_actor_failure: ActorFailureHandler,
    ) -> None:
        super().__init__(on_actor_failure)
        self._database = database
        self._capacity = capacity
        self._launcher = launcher
        self._planning = False
        self._last_kind: QueueKind | None = None

    def on_receive(self, message: Any) -> Any:
        match message:
            case Tick() | Wake():
                if not self._planning and self._launcher is not None:
                    self._plan()
            case AdmissionPlan(reply=reply):
                self._planning = False
                if reply.error is not None:
                    log.warning(
                        "admission read failed",
                        extra={"action": "scheduler.error", "reason": type(reply.error).__name__},
                    )
                    return None
                for row in reply.value:
                    assert self._launcher is not None
                    self._last_kind = QueueKind(row.kind)
                    self._launcher(row)
            case _:
                raise TypeError(f"scheduler got {type(message).__name__}")
        return None

    def _plan(self) -> None:
        capacity = self._capacity
        last_kind = self._last_kind
        me = self.actor_ref

        def read(db: Database) -> list[QueueRow]:
            free = capacity - active_queue_count(db)
            if free <= 0:
                return []
            waiting = {kind: admissible_runs(db, kind, limit=free) for kind in QueueKind}
            return plan_admissions(free, waiting, last_kind)

        self._planning = True
        self._database.tell(Transact(read, lambda reply: me.tell(AdmissionPlan(reply)), "plan"))
