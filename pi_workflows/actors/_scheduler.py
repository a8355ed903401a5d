"""The scheduler: durable admission of queued runs and due reconciles within one capacity.

Implements workflow-server.md § Worker scheduling. Requests stay durable in
`run_queue` (and resource keys in their queue) while capacity is full; capacity counts
pending launches (`starting`), live runners (`running`) and live reconcile claims. This
actor is the one decider: it holds the turn (the kind admitted last), so workflow and
resource-manager admissions alternate when both wait. Each admitted run goes to the
runner-host actor as `Launch`, each claimed reconcile to the resource runners as
`StartPasses`; with no runner host (a server that only records runs), nothing is admitted.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Done, ServerActor
from pi_workflows.actors._database import Transact
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import AdmitRuns, LaunchPlan
from pi_workflows.storage import ClaimedReconcile, QueueKind

__all__ = [
    "AdmissionPlan",
    "AdmitReconciles",
    "Launch",
    "SchedulerActor",
    "StartPasses",
    "Wake",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Launch:
    """To the runner host: a run was admitted and claimed; start its runner."""

    plan: LaunchPlan


@dataclass(frozen=True, slots=True)
class Wake:
    """Something became admissible (a start, resume or runner exit): plan now."""


@dataclass(frozen=True, slots=True)
class AdmitReconciles:
    """From the resource runners once recovery step 7 returned a dead server's claims:
    admit due reconciles from now on, each claimed for `ttl_ms`, started by `runners`."""

    runners: pykka.ActorRef[Any]
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class StartPasses:
    """To the resource runners: reconciles this round admitted and claimed; run them."""

    claimed: tuple[ClaimedReconcile, ...]


@dataclass(frozen=True, slots=True)
class AdmissionPlan:
    """Tag: one planning round; its answer lists the `(kind, LaunchPlan)`s admitted and
    claimed, in order, or is the round's error."""


class SchedulerActor(ServerActor):
    """Owns: the admission decision and the turn between kinds (the kind admitted last,
    in memory: after a restart either kind may go first).

    Receives: `Tick`, `Wake`, `AdmitReconciles`, `Done` (a planning round's answer).
    Sends: `Transact` to the database actor; `Launch` to the runner host; `StartPasses`
        to the resource runners.
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
        self._reconciles: AdmitReconciles | None = None
        self._replan = False

    def on_receive(self, message: Any) -> Any:
        match message:
            case Tick() | Wake():
                if self._planning:
                    # A wake (a commit, a freed slot) during a round: one more round after
                    # it, so a due key or run does not wait for the next tick.
                    self._replan = self._replan or isinstance(message, Wake)
                elif self._runner_host is not None:
                    self._plan()
            case AdmitReconciles():
                self._reconciles = message
                if not self._planning and self._runner_host is not None:
                    self._plan()
            case Done(tag=AdmissionPlan(), reply=reply):
                self._planning = False
                if reply.error is not None:
                    self._replan = False
                    log.warning(
                        "admission read failed",
                        extra={"action": "scheduler.error", "reason": type(reply.error).__name__},
                    )
                    return None
                self._hand_out(reply.value)
                if self._replan and self._runner_host is not None:
                    self._replan = False
                    self._plan()
            case _:
                raise TypeError(f"scheduler got {type(message).__name__}")
        return None

    def _hand_out(self, admitted: list[tuple[QueueKind, LaunchPlan | ClaimedReconcile]]) -> None:
        passes: list[ClaimedReconcile] = []
        for kind, item in admitted:
            self._last_kind = kind
            if isinstance(item, LaunchPlan):
                assert self._runner_host is not None
                self._runner_host.tell(Launch(item))
            else:
                passes.append(item)
        if passes:
            assert self._reconciles is not None
            # A stopped resource runners actor leaves its claims to expire (or to the
            # next start's recovery step 7): nothing runs them twice.
            with contextlib.suppress(pykka.ActorDeadError):
                self._reconciles.runners.tell(StartPasses(tuple(passes)))

    def _plan(self) -> None:
        ttl_ms = None if self._reconciles is None else self._reconciles.ttl_ms
        unit = AdmitRuns(self._capacity, self._last_kind, self._owner_id, ttl_ms)
        self._planning = True
        # A full disk delays admission (`hold_when_full`); it is not an error.
        self._database.tell(Transact(unit, self.actor_ref, AdmissionPlan(), hold_when_full=True))
