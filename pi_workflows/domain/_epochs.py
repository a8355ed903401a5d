"""Coordinator epochs as the units of work read them: the active grant of each session.

Implements workflow-server.md § Origin-session activity for readers: the coordinator
actor owns the epochs and publishes each change here; session views and origin reports
read the published table in their transactions, without a round trip to the actor.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["ActiveEpochs", "CoordinatorGrant"]


@dataclass(frozen=True, slots=True)
class CoordinatorGrant:
    """The epoch granted to one connection for one origin session."""

    session_id: str
    connection_id: str
    epoch: int


class ActiveEpochs:
    """The active grant of each session, published by the actor for view reads.

    Written only by `CoordinatorEpochActor` (its one owner); the session-view reader
    reads it to decide whether a subscription still holds the active epoch, without a
    round trip through the actor on every poll. A lock keeps each read consistent.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[str, CoordinatorGrant] = {}

    def is_active(self, session_id: str, connection_id: str, epoch: int) -> bool:
        with self._lock:
            return self._active.get(session_id) == CoordinatorGrant(
                session_id, connection_id, epoch
            )

    def holds(self, session_id: str, connection_id: str) -> bool:
        """`connection_id` holds the session's active epoch (whatever its number)."""
        with self._lock:
            grant = self._active.get(session_id)
            return grant is not None and grant.connection_id == connection_id

    def coordinated(self, session_id: str) -> bool:
        """Some connection holds the session's active epoch: its Pi is open."""
        with self._lock:
            return session_id in self._active

    def publish(self, active: dict[str, CoordinatorGrant]) -> None:
        """The actor's new table (only the actor calls this)."""
        with self._lock:
            self._active = dict(active)
