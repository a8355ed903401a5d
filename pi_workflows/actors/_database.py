"""The database actor: the only owner of the live SQLite writer connection.

Implements workflow-server.md § Process model ("the server is the only process
that opens the live database") and python-port.md decision 3. Every write of live
state is a `Transact` message executed here. The actor takes every `Transact`
waiting in its mailbox and runs them as one group commit: one `BEGIN IMMEDIATE`,
each unit's `db.write()` a savepoint, one `COMMIT`, and only then the replies, in
order. Many commits cost one fsync.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Reply, ServerActor
from pi_workflows.storage import Database, GroupCommit

__all__ = [
    "MAX_BATCH_UNITS",
    "MAX_BATCH_WORK_S",
    "Committed",
    "DatabaseActor",
    "Transact",
    "WatchCommits",
]

log = logging.getLogger(__name__)

MAX_BATCH_UNITS = 64
"""The most `Transact` units one group commit holds."""
MAX_BATCH_WORK_S = 0.010
"""A group takes no more units once its work ran this long (bounds the first unit's wait)."""


@dataclass(frozen=True, slots=True)
class Transact:
    """Run `work` with the database on the actor's thread; reply with its result."""

    work: Callable[[Database], Any]
    """Opens its own `db.write()` transaction(s) or reads; must not block on I/O.

    Its `write()`s are savepoints of the actor's group commit: one that raises rolls
    back only its own changes. Acts that must follow durability go to
    `db.after_commit`."""
    reply: Callable[[Reply], None]
    """Called on the actor's thread with the value or the error, only after the
    group's COMMIT made the unit's writes durable; must not block."""
    label: str = "work"
    """A safe name for logs (an operation name, never a payload)."""


@dataclass(frozen=True, slots=True)
class WatchCommits:
    """Tell `watcher` a `Committed` after every group commit that wrote something."""

    watcher: pykka.ActorRef[Any]


@dataclass(frozen=True, slots=True)
class Committed:
    """To a watcher: a group commit made writes durable (live views may have changed)."""


class DatabaseActor(ServerActor):
    """Owns: the `Database` (the one writer connection).

    Receives: `Transact`, `WatchCommits`.
    Sends: replies; `Committed` to its watchers after a group commit that wrote.
    Invariants: no other thread touches the connection. The `Transact`s waiting in the
        mailbox (up to `MAX_BATCH_UNITS`, or `MAX_BATCH_WORK_S` of work) run in mailbox
        order as one group commit; a reply is released only after the COMMIT that made
        its unit durable, and replies keep mailbox order. pykka's own envelopes (stop,
        `ask`) end a batch and keep their place.
    On failure: a domain or SQLite error in one unit is that unit's reply, and only that
        unit's writes roll back. A failed COMMIT (or a transaction SQLite rolled back under
        a unit) is the reply of every unit that ran inside that transaction. The actor
        carries on. Only a failing reply callback stops it (after the other replies of
        its batch), and the server hears of it through `on_failure`.
    """

    name = "database"

    def __init__(self, db: Database, on_actor_failure: ActorFailureHandler) -> None:
        super().__init__(on_actor_failure)
        self._db = db
        self._watchers: list[pykka.ActorRef[Any]] = []

    def on_receive(self, message: Any) -> Any:
        match message:
            case Transact():
                self._run_batch(message)
            case WatchCommits(watcher=watcher):
                self._watchers.append(watcher)
            case _:
                raise TypeError(f"database actor got {type(message).__name__}")
        return None

    def _take_waiting(self, limit: int) -> list[Transact]:
        """Take up to `limit` `Transact`s from the head of the mailbox, keeping order.

        Stops at the first envelope that is not a plain `tell` of a `Transact` (pykka's
        stop message, an `ask`), which stays at the head for pykka's own loop.
        """
        inbox = self.actor_inbox
        assert isinstance(inbox, queue.Queue)  # pykka's ThreadingActor inbox
        taken: list[Transact] = []
        with inbox.mutex:
            waiting = inbox.queue
            while waiting and len(taken) < limit:
                envelope = waiting[0]
                if envelope.reply_to is not None or not isinstance(envelope.message, Transact):
                    break
                waiting.popleft()
                taken.append(envelope.message)
        return taken

    def _run_batch(self, first: Transact) -> None:
        pending = collections.deque([first])
        pending.extend(self._take_waiting(MAX_BATCH_UNITS - 1))
        taken = len(pending)
        started = time.perf_counter()
        while pending:  # more than once only when SQLite rolled a group back under a unit
            answered: list[tuple[Transact, Reply]] = []
            group = self._db.group()
            try:
                while pending:
                    unit = pending.popleft()
                    answered.append((unit, _run_unit(group, unit)))
                    if group.lost:
                        break
                    if (
                        not pending
                        and taken < MAX_BATCH_UNITS
                        and time.perf_counter() - started < MAX_BATCH_WORK_S
                    ):
                        more = self._take_waiting(MAX_BATCH_UNITS - taken)
                        taken += len(more)
                        pending.extend(more)
                wrote = group.began_at is not None
                answered = _commit(group, answered)
            finally:
                group.close()
            self._release(answered)
            if wrote:
                self._tell_watchers()

    def _tell_watchers(self) -> None:
        for watcher in self._watchers:
            with contextlib.suppress(pykka.ActorDeadError):  # stopping: nothing to refresh
                watcher.tell(Committed())

    def _release(self, answered: list[tuple[Transact, Reply]]) -> None:
        """Call every reply in order; a failing callback is re-raised after the others."""
        failure: BaseException | None = None
        for unit, reply in answered:
            try:
                unit.reply(reply)
            except Exception as exc:  # noqa: BLE001 - re-raised below: the actor fails
                failure = failure or exc
        if failure is not None:
            raise failure

    def on_stop(self) -> None:
        """Runs in the actor's thread: close the connection last."""
        self._db.close()


def _run_unit(group: GroupCommit, unit: Transact) -> Reply:
    try:
        return Reply(value=group.run(unit.work))
    except Exception as exc:  # noqa: BLE001 - the error belongs to the caller
        log.debug("work failed", extra={"action": "db.error", "label": unit.label})
        return Reply(error=exc)


def _commit(
    group: GroupCommit, answered: list[tuple[Transact, Reply]]
) -> list[tuple[Transact, Reply]]:
    """COMMIT the group. On failure, every unit that ran inside its transaction gets the
    error (nothing of it is durable); units that ran before its first write keep theirs,
    and so does the unit under which SQLite rolled the transaction back."""
    began_at = group.began_at
    try:
        group.commit()
    except Exception as exc:
        log.exception(
            "group commit failed", extra={"action": "db.commit_failed", "units": len(answered)}
        )
        if began_at is None:
            return answered
        last = len(answered) - 1
        return [
            (
                unit,
                reply
                if index < began_at or (group.lost and index == last and reply.error is not None)
                else Reply(error=exc),
            )
            for index, (unit, reply) in enumerate(answered)
        ]
    return answered
