"""Run bindings: a run's execution mode, its origin Pi session and that session's view.

Implements the storage side of workflow-server.md § Interactive Pi execution (one
unfinished run reserves its origin session) and client-protocol.md § Run and session
views (the latest terminal run and its cleared retention). Internal module.
"""

from __future__ import annotations

from pi_workflows.storage import _queries as q
from pi_workflows.storage._db import Reader, Tx

__all__ = [
    "clear_terminal_retention",
    "interactive_origin_session",
    "latest_terminal_run",
    "session_reservation",
    "terminal_cleared",
]


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def interactive_origin_session(reader: Reader, run_id: str) -> str | None:
    """The origin Pi session of an interactive run; None for a headless or unknown run."""
    return _text(reader.fetch_value(q.SELECT_INTERACTIVE_ORIGIN_SESSION, {"run_id": run_id}))


def session_reservation(reader: Reader, session_id: str | None) -> str | None:
    """The unfinished run that holds the origin session's reservation, if any."""
    return _text(
        reader.fetch_value(q.SELECT_SESSION_RESERVATION, {"origin_session_id": session_id})
    )


def latest_terminal_run(reader: Reader, session_id: str) -> str | None:
    """The session's most recently finished run, if any."""
    return _text(
        reader.fetch_value(q.SELECT_LATEST_TERMINAL_RUN, {"origin_session_id": session_id})
    )


def terminal_cleared(reader: Reader, run_id: str) -> bool:
    """Whether the run's retention in its session's view was cleared."""
    return reader.fetch_value(q.SELECT_TERMINAL_CLEARED, {"run_id": run_id}) is not None


def clear_terminal_retention(tx: Tx, run_id: str) -> None:
    """Mark the terminal run cleared from its session's view, in the caller's transaction
    (only the binding's marker changes; its trigger moves the view revision)."""
    tx.execute(q.UPDATE_BINDING_TERMINAL_CLEARED, {"run_id": run_id, "now": tx.now})
