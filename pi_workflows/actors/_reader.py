"""The reader actor: client reads from a read-only connection, beside the one writer.

Implements workflow-server.md § Process model ("short SQLite transactions") and
python-port.md decisions 2 and 3 for reads: `server.status`, `run.get` and `run.list`
are answered from a WAL reader connection in the server process, so they never queue
behind the database actor's writes and never block them. Each `Read` is one read
transaction, so one answer comes from one consistent snapshot.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pi_workflows.actors._base import ActorFailureHandler, Address, Reply, ServerActor, answer
from pi_workflows.domain import Perform, perform, unit_label
from pi_workflows.storage import Clock, open_live_reader

__all__ = ["Read", "ReaderActor"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Read:
    """Run a unit of work in one read transaction; tell its `Done` to `reply_to`."""

    unit: object
    """A unit-of-work record that only reads (the connection is `mode=ro` and
    `query_only`), resolved here by its kind; it never blocks on I/O."""
    reply_to: Address | None = None
    """Where `Done(tag, reply)` goes."""
    tag: Any = None
    """Returned in the `Done` as it was: what the answer is about, as data."""


class ReaderActor(ServerActor):
    """Owns: one read-only connection to the live database (`open_live_reader`).

    Receives: `Read`.
    Sends: `Done` to each read's `reply_to`.
    Invariants: it never writes (the connection refuses to); each `Read` runs in one
        read transaction, so everything it reads is one committed snapshot, at least as
        new as every commit whose reply was released before the `Read` arrived. The
        database actor's connection stays the only writer.
    On failure: an error in one `Read` is that read's reply; the actor carries on (it
        runs no code of its askers: answers are messages).
    """

    name = "reader"

    def __init__(
        self,
        path: Path,
        clock: Clock,
        on_actor_failure: ActorFailureHandler,
        *,
        units: Perform = perform,
    ) -> None:
        super().__init__(on_actor_failure)
        self._db = open_live_reader(path, clock=clock)
        self._perform = units
        """Resolves a unit record to its work (`domain.perform`; tests extend it)."""

    def on_receive(self, message: Any) -> Any:
        match message:
            case Read(unit=unit, reply_to=reply_to, tag=tag):
                try:
                    with self._db.read():
                        result = Reply(value=self._perform(self._db, unit))
                except Exception as exc:  # noqa: BLE001 - the error belongs to the caller
                    label = unit_label(unit)
                    log.debug("read failed", extra={"action": "db.read_error", "label": label})
                    result = Reply(error=exc)
                answer(reply_to, tag, result)
            case _:
                raise TypeError(f"reader actor got {type(message).__name__}")
        return None

    def on_stop(self) -> None:
        """Runs in the actor's thread: close the connection last."""
        self._db.close()
