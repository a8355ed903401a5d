"""The coordinator-epoch actor: one active coordinator connection per origin session.

Implements workflow-server.md § Origin-session activity: "the server keeps one
active coordinator connection and process-local epoch for each origin session. A
replacement connection fences the old one." Epochs live only in this process.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Address, Done, Reply, ServerActor, answer
from pi_workflows.actors._database import Transact
from pi_workflows.domain import ActiveEpochs, CoordinatorGrant, SuspendSession

__all__ = ["CheckCoordinator", "ClaimCoordinator", "CoordinatorEpochActor", "ReleaseConnection"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClaimCoordinator:
    """Make `connection_id` the active coordinator of `session_id`, fencing any other."""

    session_id: str
    """The origin Pi session."""
    connection_id: str
    """The client connection that will coordinate it."""
    reply_to: Address
    """Told `Done(tag, Reply(CoordinatorGrant))`."""
    tag: Any = None


@dataclass(frozen=True, slots=True)
class CheckCoordinator:
    """Ask whether (session, connection, epoch) is still the active coordinator."""

    session_id: str
    connection_id: str
    epoch: int
    reply_to: Address
    """Told `Done(tag, Reply(True or False))`."""
    tag: Any = None


@dataclass(frozen=True, slots=True)
class ReleaseConnection:
    """A connection closed: end every coordinator epoch it held."""

    connection_id: str


class CoordinatorEpochActor(ServerActor):
    """Owns: the active coordinator epoch of each origin session (in memory only).

    Receives: `ClaimCoordinator`, `CheckCoordinator`, `ReleaseConnection`, `Done`.
    Sends: `Done` to askers; when an epoch ends (fenced or released), `Transact(suspend_session)`
        to the database, told before the new grant's reply, so the suspension commits
        before any report of the new epoch can resume the session's step timer.
    Invariants: at most one active epoch per session; epochs only increase, so a
        fenced connection can never become active again with its old epoch.
    On failure: reported to the server; epochs are process-local by design, so
        nothing durable is lost.
    """

    name = "coordinator-epoch"

    def __init__(
        self,
        on_actor_failure: ActorFailureHandler,
        published: ActiveEpochs | None = None,
        database: pykka.ActorRef[Any] | None = None,
    ) -> None:
        super().__init__(on_actor_failure)
        self._database = database
        self._next_epoch = 0
        self._active: dict[str, CoordinatorGrant] = {}
        self._published = published if published is not None else ActiveEpochs()

    def on_receive(self, message: Any) -> Any:
        match message:
            case ClaimCoordinator(session_id=session, connection_id=connection):
                self._next_epoch += 1
                grant = CoordinatorGrant(session, connection, self._next_epoch)
                if session in self._active:
                    self._epoch_ended(session)
                self._active[session] = grant
                self._published.publish(self._active)
                answer(message.reply_to, message.tag, Reply(grant))
            case CheckCoordinator(session_id=session, connection_id=connection, epoch=epoch):
                active = self._active.get(session) == CoordinatorGrant(session, connection, epoch)
                answer(message.reply_to, message.tag, Reply(active))
            case ReleaseConnection(connection_id=connection):
                for session, grant in list(self._active.items()):
                    if grant.connection_id == connection:
                        del self._active[session]
                        self._epoch_ended(session)
                self._published.publish(self._active)
            case Done(tag=_Suspended(), reply=reply):
                if reply.error is not None:
                    log.warning(
                        "step timer suspension failed",
                        extra={
                            "action": "coordinator.suspend_failed",
                            "reason": type(reply.error).__name__,
                        },
                    )
            case _:
                raise TypeError(f"coordinator-epoch actor got {type(message).__name__}")
        return None

    def _epoch_ended(self, session_id: str) -> None:
        """No connected active session any more: its interactive step timer stops."""
        if self._database is not None:
            # Ordered before the next epoch's reports (`hold_when_full` keeps order).
            unit = SuspendSession(session_id)
            self._database.tell(Transact(unit, self.actor_ref, _Suspended(), hold_when_full=True))


@dataclass(frozen=True, slots=True)
class _Suspended:
    """Tag: a session's step timer suspension (its outcome is only logged)."""
