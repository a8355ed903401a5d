"""The reader actor: client reads from a read-only connection, beside the one writer.

Implements workflow-server.md § Process model ("short SQLite transactions") and
python-port.md decisions 2 and 3 for reads: `server.status`, `run.get` and `run.list`
are answered from a WAL reader connection in the server process, so they never queue
behind the database actor's writes and never block them. Each `Read` is one read
transaction, so one answer comes from one consistent snapshot.

A run's view (`run.get`, and a run subscription's read) is served from the actor's
`RunViewCache` (issue 30 item 4): built once per revision, checked against the run's
current revision in the same read transaction, memory only.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pi_workflows.actors._base import ActorFailureHandler, Address, Reply, ServerActor, answer
from pi_workflows.domain import Perform, RunViewCache, perform, unit_label, with_run_views
from pi_workflows.storage import Clock, open_live_reader

__all__ = ["RUN_VIEW_CACHE_ENV", "Read", "ReaderActor", "run_view_cache_enabled"]

log = logging.getLogger(__name__)

RUN_VIEW_CACHE_ENV = "PI_WORKFLOWS_RUN_VIEW_CACHE"
"""`0` turns the run view cache off: every `run.get` builds its view (benchmarks compare)."""


def run_view_cache_enabled() -> bool:
    """False only when `PI_WORKFLOWS_RUN_VIEW_CACHE=0` (a benchmark's baseline)."""
    return os.environ.get(RUN_VIEW_CACHE_ENV) != "0"


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
        database actor's connection stays the only writer. A run view it serves from
        its cache is the one built at the run's revision in that snapshot.
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
        run_views: RunViewCache | None = None,
    ) -> None:
        super().__init__(on_actor_failure)
        self._db = open_live_reader(path, clock=clock)
        self._perform = units
        """Resolves a unit record to its work (`domain.perform`; tests extend it)."""
        self.run_views = run_views
        """Built run views by revision (None: every run view is built); only this
        actor's thread touches it."""

    def on_receive(self, message: Any) -> Any:
        match message:
            case Read(unit=unit, reply_to=reply_to, tag=tag):
                if self.run_views is not None:
                    unit = with_run_views(unit, self.run_views)
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
