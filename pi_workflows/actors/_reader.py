"""The reader actor: client reads from a read-only connection, beside the one writer.

Implements workflow-server.md § Process model ("short SQLite transactions") and
python-port.md decisions 2 and 3 for reads: `server.status`, `run.get` and `run.list`
are answered from a WAL reader connection in the server process, so they never queue
behind the database actor's writes and never block them. Each `Read` is one read
transaction, so one answer comes from one consistent snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pi_workflows.actors._base import ActorFailureHandler, Reply, ServerActor
from pi_workflows.storage import Clock, Database, open_live_reader

__all__ = ["Read", "ReaderActor"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Read:
    """Run `work` on the reader's connection in one read transaction; reply with its result."""

    work: Callable[[Database], Any]
    """Reads only (the connection is `mode=ro` and `query_only`); must not block on I/O."""
    reply: Callable[[Reply], None]
    """Called on the reader's thread with the value or the error; must not block."""
    label: str = "read"
    """A safe name for logs (an operation name, never a payload)."""


class ReaderActor(ServerActor):
    """Owns: one read-only connection to the live database (`open_live_reader`).

    Receives: `Read`.
    Sends: nothing but replies.
    Invariants: it never writes (the connection refuses to); each `Read` runs in one
        read transaction, so everything it reads is one committed snapshot, at least as
        new as every commit whose reply was released before the `Read` arrived. The
        database actor's connection stays the only writer.
    On failure: an error in one `Read` is that read's reply; the actor carries on. Only
        a failing reply callback stops it, and the server hears of it via `on_failure`.
    """

    name = "reader"

    def __init__(self, path: Path, clock: Clock, on_actor_failure: ActorFailureHandler) -> None:
        super().__init__(on_actor_failure)
        self._db = open_live_reader(path, clock=clock)

    def on_receive(self, message: Any) -> Any:
        match message:
            case Read(work=work, reply=reply, label=label):
                try:
                    with self._db.read():
                        result = Reply(value=work(self._db))
                except Exception as exc:  # noqa: BLE001 - the error belongs to the caller
                    log.debug("read failed", extra={"action": "db.read_error", "label": label})
                    result = Reply(error=exc)
                reply(result)
            case _:
                raise TypeError(f"reader actor got {type(message).__name__}")
        return None

    def on_stop(self) -> None:
        """Runs in the actor's thread: close the connection last."""
        self._db.close()
