"""The database actor: the only owner of the live SQLite connection.

Implements workflow-server.md § Process model ("the server is the only process
that opens the live database") and python-port.md decision 3. Every read and
write of live state is a `Transact` message executed here, one at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pi_workflows.actors._base import ActorFailureHandler, Reply, ServerActor
from pi_workflows.storage import Database

__all__ = ["DatabaseActor", "Transact"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Transact:
    """Run `work` with the database on the actor's thread; reply with its result."""

    work: Callable[[Database], Any]
    """Opens its own `db.write()` transaction(s) or reads; must not block on I/O."""
    reply: Callable[[Reply], None]
    """Called on the actor's thread with the value or the error; must not block."""
    label: str = "work"
    """A safe name for logs (an operation name, never a payload)."""


class DatabaseActor(ServerActor):
    """Owns: the `Database` (one SQLite connection).

    Receives: `Transact`.
    Sends: nothing but replies.
    Invariants: no other thread touches the connection; each message is one unit
        of work whose transactions commit or roll back before the next starts.
    On failure: a domain or SQLite error in one unit is that unit's reply; the
        actor carries on. Only a failing reply callback stops it, and the server
        hears of it through `on_failure`.
    """

    name = "database"

    def __init__(self, db: Database, on_actor_failure: ActorFailureHandler) -> None:
        super().__init__(on_actor_failure)
        self._db = db

    def on_receive(self, message: Any) -> Any:
        match message:
            case Transact(work=work, reply=reply, label=label):
                try:
                    result = Reply(value=work(self._db))
                except Exception as exc:  # noqa: BLE001 - the error belongs to the caller
                    log.debug("work failed", extra={"action": "db.error", "label": label})
                    result = Reply(error=exc)
                reply(result)
            case _:
                raise TypeError(f"database actor got {type(message).__name__}")
        return None

    def on_stop(self) -> None:
        """Runs in the actor's thread: close the connection last."""
        self._db.close()
