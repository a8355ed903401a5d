"""The deadlines actor: the timer of work that waits without a runner (interactive agent
steps, and protected decisions whose timeout default wins at their deadline).

Implements workflow-server.md § Interactive Pi execution ("The server continues to
enforce the durable deadline while no runner exists"). The durable facts (time used,
the running span) are written by the reports and transitions that change them; this
actor only knows when to look. It keeps the earliest instant a budget runs out (a cache
of the durable rows, re-read after commits) and, once the clock passes it, runs the
timeout unit (`domain/_deadlines.py::expire_due`) on the database actor, then wakes the
scheduler so the timeout-resume runner starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Done, ServerActor
from pi_workflows.actors._database import Committed, Transact
from pi_workflows.actors._reader import Read
from pi_workflows.actors._scheduler import Wake
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import ExpireDue, NextDeadline
from pi_workflows.storage import Clock

__all__ = ["DeadlinesActor"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _NextDue:
    """Tag: the read of the earliest instant a budget runs out (or None)."""


@dataclass(frozen=True, slots=True)
class _Expired:
    """Tag: one timeout round (its answer: the run IDs it timed out)."""


class DeadlinesActor(ServerActor):
    """Owns: the next instant an interactive step's node timeout runs out or a protected
    decision's deadline passes (in memory, a cache of durable rows), and whether a read
    or a timeout round is in flight.

    Receives: `Tick`, `Committed` (from the database actor: re-read the next instant),
        and `Done` (its read's and its rounds' answers).
    Sends: `Read(next_deadline)` to the reader; `Transact(expire_due)` to the database;
        `Wake` to the scheduler after a round timed something out.
    Invariants: at most one read and one round in flight; every commit is followed by a
        re-read, so a turn that starts or ends is seen within a tick; the unit re-checks
        every request in its own transaction, so a stale cache never times out work.
    On failure: reported to the server; nothing durable is lost (the next server's
        recovery runs the same unit first).
    """

    name = "deadlines"

    def __init__(
        self,
        *,
        database: pykka.ActorRef[Any],
        reader: pykka.ActorRef[Any],
        scheduler: pykka.ActorRef[Any],
        clock: Clock,
        owner_id: str,
        on_actor_failure: ActorFailureHandler,
    ) -> None:
        super().__init__(on_actor_failure)
        self._database = database
        self._reader = reader
        self._scheduler = scheduler
        self._clock = clock
        self._owner_id = owner_id
        self._stale = True
        """A commit may have changed the next instant since the last read."""
        self._reading = False
        self._expiring = False
        self._next_due: int | None = None

    def on_receive(self, message: Any) -> Any:
        match message:
            case Committed():
                self._stale = True
            case Tick():
                self._check()
            case Done(tag=_NextDue(), reply=reply):
                self._reading = False
                if reply.error is not None:
                    self._failed("read", reply.error)
                else:
                    self._next_due = reply.value
                self._check()
            case Done(tag=_Expired(), reply=reply):
                self._expiring = False
                self._stale = True  # read again: the next request, or the same one
                if reply.error is not None:
                    self._failed("expire", reply.error)
                elif reply.value:
                    self._scheduler.tell(Wake())
            case _:
                raise TypeError(f"deadlines actor got {type(message).__name__}")
        return None

    def _check(self) -> None:
        if self._stale and not self._reading:
            self._stale = False
            self._reading = True
            self._reader.tell(Read(NextDeadline(), self.actor_ref, _NextDue()))
        due = self._next_due
        if due is None or self._expiring or self._clock.now_ms() < due:
            return
        self._expiring = True
        self._next_due = None  # until the re-read after this round
        # Server work: a full disk delays it, in order (`hold_when_full`).
        unit = ExpireDue(self._owner_id)
        self._database.tell(Transact(unit, self.actor_ref, _Expired(), hold_when_full=True))

    def _failed(self, what: str, error: BaseException) -> None:
        self._stale = True  # try again on the next tick
        log.warning(
            "deadline check failed",
            extra={"action": f"deadlines.{what}_failed", "reason": type(error).__name__},
        )
