"""Driving actors by hand: `Tick` messages sent by the test, and mailbox barriers.

No `Ticker` runs in these tests, so time passes only when a test sends `Tick(n)`. A
pykka mailbox is first in, first out, so `handled(ref)` returning means `ref` has
handled everything told to it before; following a message through the actors it
causes (`handled(a)`, then `handled(b)`, ...) waits for each hop, with no polling and
no sleep.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pykka

from pi_workflows._address import ReplyBox
from pi_workflows.actors._base import wait_reply
from pi_workflows.actors._database import Transact
from pi_workflows.actors._ticker import Tick
from pi_workflows.storage import Database
from pi_workflows.supervision import ChildExited, ProcessIdentity
from pi_workflows.testing import CallUnit

__all__ = [
    "WAIT_S",
    "SpawnAnswers",
    "blocked",
    "handled",
    "on_database",
    "tick",
    "wait_exited",
]

WAIT_S = 10.0
"""The longest any hop may take on a loaded machine (a bound, never a delay)."""


def handled(*refs: pykka.ActorRef[Any]) -> None:
    """Return once each actor, in turn, handled every message told to it so far."""
    for ref in refs:
        ref.proxy().name.get(timeout=WAIT_S)  # a read queued behind those messages


def tick(ref: pykka.ActorRef[Any], *sequences: int) -> None:
    """Send `Tick(n)` for each sequence number and wait until `ref` handled them."""
    for sequence in sequences:
        ref.tell(Tick(sequence))
    handled(ref)


def on_database(database: pykka.ActorRef[Any], work: Any) -> Any:
    """Run `work(db)` on the database actor, after everything queued there; its result.

    The actor must run `CallUnit`s (started with `units=perform_with_calls`)."""
    return wait_reply(lambda box: database.tell(Transact(CallUnit(work), box)), WAIT_S)


@contextmanager
def blocked(database: pykka.ActorRef[Any]) -> Iterator[None]:
    """Hold the database actor busy inside the block; what is told to it waits behind."""
    entered, release = threading.Event(), threading.Event()

    def hold(_: Database) -> None:
        entered.set()
        release.wait(WAIT_S)

    database.tell(Transact(CallUnit(hold)))
    try:
        assert entered.wait(WAIT_S), "the database actor never started the blocking unit"
        yield
    finally:
        release.set()


def wait_exited(pid: int) -> None:
    """Block until process `pid` has exited (a pidfd turns readable), without reaping it."""
    fd = os.pidfd_open(pid)
    try:
        readable, _, _ = select.select([fd], [], [], WAIT_S)
        assert readable, f"process {pid} did not exit"
    finally:
        os.close(fd)


class SpawnAnswers:
    """An address for a `Spawn`'s answers: its `Done` (the identity), then `ChildExited`.

    `exits` collects the exits (on the supervisor's thread); `exited` is set per exit.
    """

    def __init__(self, exits: list[ChildExited] | None = None) -> None:
        self._spawned = ReplyBox()
        self.exits: list[ChildExited] = exits if exits is not None else []
        self.exited = threading.Event()

    def tell(self, message: Any) -> None:
        if isinstance(message, ChildExited):
            self.exits.append(message)
            self.exited.set()
        else:
            self._spawned.tell(message)

    def identity(self, timeout: float = WAIT_S) -> ProcessIdentity:
        """The spawned child's identity (or the spawn's error, raised)."""
        identity: ProcessIdentity = self._spawned.wait(timeout)
        return identity
