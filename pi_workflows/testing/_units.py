"""A test's own unit of work: a function run on the database or reader actor's connection.

The server's messages carry data, never code: its units are the records of
`pi_workflows.domain`. A test that must look at or change state through the actor that
owns the connection starts the actor (or the server) with `perform_with_calls`, which
knows one more kind, `CallUnit`. Tests only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pi_workflows.domain import perform
from pi_workflows.storage import Database

__all__ = ["CallUnit", "perform_with_calls"]


@dataclass(frozen=True, slots=True)
class CallUnit:
    """Run `fn(db)` on the actor's connection (a test's inspection or change)."""

    label: ClassVar[str] = "test"
    fn: Callable[[Database], Any]


def perform_with_calls(db: Database, unit: object) -> Any:
    """`domain.perform`, and `CallUnit`s besides."""
    if isinstance(unit, CallUnit):
        return unit.fn(db)
    return perform(db, unit)
