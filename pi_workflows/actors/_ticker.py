"""The ticker: the one thread that keeps time, by sending `Tick` messages to actors.

Implements python-port.md decision 3 ("timers are messages sent by a ticker, not
sleeps inside an actor"). The ticker never waits on an actor: `tell` only queues.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import pykka

__all__ = ["Tick", "Ticker"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed; the receiver does its periodic work."""

    sequence: int
    """Counts ticks from 1 since the ticker started (for logs and tests)."""


class Ticker:
    """Sends `Tick` to every registered actor each `interval_s`.

    **Stop:** `stop` returns within one interval; a dead actor is skipped silently,
    since its death already reached the server through `on_failure`.
    """

    def __init__(self, interval_s: float) -> None:
        self._interval = interval_s
        self._targets: list[pykka.ActorRef[Any]] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ticker", daemon=True)

    def register(self, ref: pykka.ActorRef[Any]) -> None:
        """Add a target; call before `start`."""
        self._targets.append(ref)

    def start(self) -> None:
        """Start ticking."""
        self._thread.start()

    def stop(self) -> None:
        """Stop ticking and wait for the thread."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(self._interval * 4 + 1)

    def _run(self) -> None:
        sequence = 0
        while not self._stopping.wait(self._interval):
            sequence += 1
            for ref in self._targets:
                try:
                    ref.tell(Tick(sequence))
                except pykka.ActorDeadError:
                    continue
