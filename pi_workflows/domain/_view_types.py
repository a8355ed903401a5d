"""The data a live view subscription names and reads: its spec, a snapshot, its end.

Implements client-protocol.md § Subscriptions for the records the view readers return
and the subscription actor keeps; plain data, shared by the domain and the actors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ViewGone", "ViewSnapshot", "ViewSpec"]


@dataclass(frozen=True, slots=True)
class ViewSpec:
    """Which view a subscription shows: equal specs share one read and one encoding."""

    kind: str
    """`runList`, `run` or `sessionView`."""
    run_id: str | None = None
    """The run of a `run` view."""
    session_id: str | None = None
    """The origin session of a `sessionView`."""
    connection_id: str | None = None
    """A coordinator's `sessionView`: the connection granted `epoch` (its own view)."""
    epoch: int | None = None
    """The coordinator epoch that connection was granted for the session."""


@dataclass(frozen=True, slots=True)
class ViewSnapshot:
    """The view at one revision, as the reader built it."""

    revision: int
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ViewGone:
    """The view's subject no longer exists (a pruned run): its subscribers are told, once."""

    code: str
    message: str
