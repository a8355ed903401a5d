"""The database actor: the only owner of the live SQLite writer connection.

Implements workflow-server.md § Process model ("the server is the only process
that opens the live database") and python-port.md decision 3. Every write of live
state is a `Transact` message executed here. The actor takes every `Transact`
waiting in its mailbox and runs them as one group commit: one `BEGIN IMMEDIATE`,
each unit's `db.write()` a savepoint, one `COMMIT`, and only then the replies, in
order. Many commits cost one fsync.

A full disk (SQLITE_FULL, ENOSPC) loses nothing that was accepted. The server's own
units whose order matters (runner messages and exits, lease renewal, admission: those
told with `hold_when_full`) are held, in mailbox order, and run again each second and
after any commit until they commit; a client command fails at once with the full disk,
which the client sees as `diskFull` and may send again.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import time
from dataclasses import dataclass
from typing import Any

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Address, Reply, ServerActor, answer
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import Perform, perform, unit_label
from pi_workflows.storage import Database, DiskFullError, GroupCommit, is_disk_full

__all__ = [
    "MAX_BATCH_UNITS",
    "MAX_BATCH_WORK_S",
    "RETRY_FULL_EVERY_TICKS",
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
RETRY_FULL_EVERY_TICKS = 4
"""While units are held for a full disk, they run again every this many ticks (1 s)."""


@dataclass(frozen=True, slots=True)
class Transact:
    """Run a unit of work on the actor's connection; tell its `Done` to `reply_to`."""

    unit: object
    """A unit-of-work record (`pi_workflows.domain`), resolved here by its kind.

    Its function opens its own `db.write()` transaction(s) or reads, and never blocks on
    I/O. Its `write()`s are savepoints of the actor's group commit: one that raises rolls
    back only its own changes."""
    reply_to: Address | None = None
    """Where `Done(tag, reply)` goes, only after the group's COMMIT made the unit's
    writes durable (None: nobody waits for it)."""
    tag: Any = None
    """Returned in the `Done` as it was: what the answer is about, as data."""
    hold_when_full: bool = False
    """The server's own work, which must not be lost or reordered: if the disk is full,
    it waits (behind every unit held before it) and runs again until it commits, and
    only then is answered. False (client commands): the full disk is the reply at once."""


@dataclass(frozen=True, slots=True)
class WatchCommits:
    """Tell `watcher` a `Committed` after every group commit that wrote something."""

    watcher: pykka.ActorRef[Any]


@dataclass(frozen=True, slots=True)
class Committed:
    """To a watcher: a group commit made writes durable (live views may have changed)."""


class DatabaseActor(ServerActor):
    """Owns: the `Database` (the one writer connection).

    Receives: `Transact`, `WatchCommits`, `Tick` (retries held units).
    Sends: `Done` to each unit's `reply_to`; `Committed` to its watchers after a group
        commit that wrote.
    Invariants: no other thread touches the connection. The `Transact`s waiting in the
        mailbox (up to `MAX_BATCH_UNITS`, or `MAX_BATCH_WORK_S` of work) run in mailbox
        order as one group commit; a reply is released only after the COMMIT that made
        its unit durable, and replies keep mailbox order, except that a unit held for a
        full disk is answered when it commits at last. Held units keep their order among
        themselves: while any is held, a later `hold_when_full` unit waits behind it
        without running. pykka's own envelopes (stop, `ask`) end a batch and keep their
        place.
    On failure: a domain or SQLite error in one unit is that unit's reply, and only that
        unit's writes roll back. A failed COMMIT (or a transaction SQLite rolled back under
        a unit) is the reply of every unit that ran inside that transaction. A full disk
        holds the `hold_when_full` units instead (see above). The actor carries on: it
        runs no code of its askers (answers are messages), so nothing they do can stop
        it. At its stop, held units get `DiskFullError`.
    """

    name = "database"

    def __init__(
        self, db: Database, on_actor_failure: ActorFailureHandler, *, units: Perform = perform
    ) -> None:
        super().__init__(on_actor_failure)
        self._db = db
        self._perform = units
        """Resolves a unit record to its work (`domain.perform`; tests extend it)."""
        self._watchers: list[pykka.ActorRef[Any]] = []
        self._held: collections.deque[Transact] = collections.deque()
        """Units waiting for disk space, in mailbox order."""
        self._full: _FullDisk | None = None
        """The current full-disk episode, for its one log line when space returns."""

    def on_receive(self, message: Any) -> Any:
        match message:
            case Transact():
                pending = collections.deque([message])
                pending.extend(self._take_waiting(MAX_BATCH_UNITS - 1))
                if self._run_batch(pending, take_more=True) and self._held:
                    self._retry_held()  # something committed: space may be back
            case Tick(sequence=sequence):
                if self._full is not None and sequence % RETRY_FULL_EVERY_TICKS == 0:
                    # The WAL may be what fills a small disk: empty it, then try again.
                    self._db.reclaim_wal()
                    if self._held:
                        self._retry_held()
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

    def _retry_held(self) -> None:
        pending, self._held = self._held, collections.deque()
        self._run_batch(pending, take_more=False)

    def _run_batch(self, pending: collections.deque[Transact], *, take_more: bool) -> bool:
        """Run `pending` (and, with `take_more`, what arrives meanwhile) as group commits.

        Returns True if a unit's writes were committed.
        """
        taken = len(pending)
        started = time.perf_counter()
        blocked = bool(self._held)  # held units wait in order: later ones run after them
        committed = False
        while pending:  # more than once only when SQLite rolled a group back under a unit
            answered: list[tuple[Transact, Reply]] = []
            # Every unit of this group in mailbox order; False: it waits behind a held one.
            order: list[tuple[Transact, bool]] = []
            group = self._db.group()
            try:
                while pending:
                    unit = pending.popleft()
                    if unit.hold_when_full and blocked:
                        order.append((unit, False))
                        continue
                    reply = self._run_unit(group, unit)
                    answered.append((unit, reply))
                    order.append((unit, True))
                    if reply.error is not None and is_disk_full(reply.error):
                        # Nothing of this transaction may commit: a unit that wrote in
                        # two savepoints must not keep half of its work.
                        group.abandon(reply.error)
                        blocked = True
                    if group.lost:
                        break
                    if (
                        take_more
                        and not pending
                        and taken < MAX_BATCH_UNITS
                        and time.perf_counter() - started < MAX_BATCH_WORK_S
                    ):
                        more = self._take_waiting(MAX_BATCH_UNITS - taken)
                        taken += len(more)
                        pending.extend(more)
                began_at = group.began_at
                answered = _commit(group, answered)
            finally:
                group.close()
            ready = self._hold_or_release(order, answered)
            blocked |= bool(self._held)
            wrote = began_at is not None and any(
                reply.error is None for _, reply in answered[began_at:]
            )
            committed |= wrote
            if wrote and self._full is not None and not self._held:
                self._full.ended()
                self._full = None
            self._release(ready)
            if wrote:
                self._tell_watchers()
        return committed

    def _hold_or_release(
        self, order: list[tuple[Transact, bool]], answered: list[tuple[Transact, Reply]]
    ) -> list[tuple[Transact, Reply]]:
        """Hold the units a full disk refused (and those waiting behind one), in order;
        return the replies to release now."""
        replies = iter(answered)
        ready: list[tuple[Transact, Reply]] = []
        for unit, ran in order:
            reply = next(replies)[1] if ran else None
            full = reply is None or is_disk_full(reply.error)
            if full and self._full is None:
                self._full = _FullDisk()
            if unit.hold_when_full and full:
                self._held.append(unit)
                assert self._full is not None
                self._full.held = max(self._full.held, len(self._held))
            else:
                assert reply is not None
                if full and self._full is not None:
                    self._full.refused += 1
                ready.append((unit, reply))
        return ready

    def _tell_watchers(self) -> None:
        for watcher in self._watchers:
            with contextlib.suppress(pykka.ActorDeadError):  # stopping: nothing to refresh
                watcher.tell(Committed())

    def _release(self, answered: list[tuple[Transact, Reply]]) -> None:
        """Tell every answer, in order (to askers that are still there)."""
        for unit, reply in answered:
            answer(unit.reply_to, unit.tag, reply)

    def _run_unit(self, group: GroupCommit, unit: Transact) -> Reply:
        try:
            return Reply(value=group.run(lambda db: self._perform(db, unit.unit)))
        except Exception as exc:  # noqa: BLE001 - the error belongs to the caller
            log.debug("work failed", extra={"action": "db.error", "label": unit_label(unit.unit)})
            return Reply(error=exc)

    def on_stop(self) -> None:
        """Runs in the actor's thread: answer what still waits for space, then close the
        connection last."""
        held, self._held = self._held, collections.deque()
        self._release([(unit, Reply(error=DiskFullError())) for unit in held])
        self._db.close()


class _FullDisk:
    """One full-disk episode: logged when it starts and, with its counts, when it ends."""

    def __init__(self) -> None:
        self.since = time.monotonic()
        self.held = 0
        self.refused = 0
        log.warning(
            "the disk that holds the workflow state is full: free space on it; the server "
            "holds its own writes and retries them, and refuses client commands meanwhile",
            extra={"action": "db.disk_full", "reason": "diskFull"},
        )

    def ended(self) -> None:
        """Space returned and every held unit committed (written then, when it can be)."""
        log.warning(
            f"the disk was full for {time.monotonic() - self.since:.0f} s: up to {self.held} "
            f"server writes waited for space and are committed, {self.refused} client "
            "commands were refused",
            extra={"action": "db.disk_space_returned", "reason": "diskFull"},
        )


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
        if not is_disk_full(exc):  # a full disk is logged once per episode instead
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
