"""Injected time: a `Clock` protocol, the real `SystemClock` and a `ManualClock` for tests.

Implements the house rule "time is injected" (style-examples.md § For our project, 7):
storage logic reads time only through a clock, as integer epoch milliseconds.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """A source of wall-clock epoch milliseconds and a monotonic millisecond reading."""

    def now_ms(self) -> int:
        """Return the current wall-clock time in integer epoch milliseconds."""
        ...

    def monotonic_ms(self) -> int:
        """Return a monotonic reading in milliseconds, for measuring intervals only."""
        ...


class SystemClock:
    """The real clock; the only place in storage that reads the system time."""

    def now_ms(self) -> int:
        """Return `time.time()` as integer epoch milliseconds."""
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        """Return `time.monotonic()` in integer milliseconds."""
        return time.monotonic_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when a test moves it, like trio's `MockClock`.

    Both readings start where the test says and advance together. Thread-safe, so an
    actor thread and the test thread may share one instance.
    """

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        """Create a clock reading `start_ms` (default: a fixed instant in 2023)."""
        self._lock = threading.Lock()
        self._now = start_ms
        self._monotonic = 0

    def now_ms(self) -> int:
        """Return the current manual wall-clock reading."""
        with self._lock:
            return self._now

    def monotonic_ms(self) -> int:
        """Return the current manual monotonic reading (starts at 0)."""
        with self._lock:
            return self._monotonic

    def advance(self, ms: int) -> int:
        """Move both readings forward by `ms` (must be >= 0) and return the new wall time."""
        if ms < 0:
            raise ValueError("a clock cannot move backwards")
        with self._lock:
            self._now += ms
            self._monotonic += ms
            return self._now

    def set(self, now_ms: int) -> None:
        """Set the wall-clock reading (it may jump backwards, as a real wall clock can)."""
        with self._lock:
            self._now = now_ms
