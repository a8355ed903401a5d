"""`pi-workflows.session-view.v1`: what one origin Pi session shows and sends.

Implements client-protocol.md § Run and session views (the session-view paragraph):
the active run's view first; when no run is active, the latest terminal run while it
is retained (`retained_terminal_run`); a byte-bounded window of every nonterminal
message and every open sent message with their complete count; and the next eligible
pending message, with its content or a content reference, only for the subscription
that holds the session's active coordinator epoch. One read transaction builds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pi_workflows.domain._run_view import build_run_view
from pi_workflows.domain._view_content import json_blob_value
from pi_workflows.storage import (
    Database,
    MessageRow,
    Reader,
    clear_terminal_retention,
    latest_terminal_run,
    next_eligible_message,
    session_base_revision,
    session_messages,
    session_messages_count,
    session_reservation,
    terminal_cleared,
    terminal_message_retained,
)
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.protocol import SESSION_VIEW_SCHEMA

__all__ = [
    "TERMINAL_RETENTION_MS",
    "WINDOW_BYTES",
    "WINDOW_ITEMS",
    "SessionRead",
    "build_session_view",
    "clear_terminal",
    "session_revision",
]

TERMINAL_RETENTION_MS: Final = 60_000
"""How long a terminal run stays in its session's view after its first turn ends."""
WINDOW_ITEMS: Final = 256
"""At most this many message records in one view (the count is always complete)."""
WINDOW_BYTES: Final = 256 * 1024
"""The encoded byte budget of the message window: the run view and the next message's
content (inline up to 16 KiB, else a reference) fit one 1 MiB frame beside it."""


@dataclass(frozen=True, slots=True)
class SessionRead:
    """One consistent read of a session's view."""

    revision: int
    payload: dict[str, Any]


def session_revision(reader: Reader, session_id: str, now_ms: int) -> int:
    """The view's revision: the sum of its runs' revisions, times two, plus one once
    the retained terminal run has expired. Both parts only grow (for a fixed sum the
    expiry flips once), so the revision never goes back."""
    base = session_base_revision(reader, session_id)
    shown = _shown_run(reader, session_id, now_ms)
    latest = latest_terminal_run(reader, session_id)
    expired = shown is None and latest is not None
    return base * 2 + int(expired)


def _shown_run(reader: Reader, session_id: str, now_ms: int) -> str | None:
    active = session_reservation(reader, session_id)
    if active is not None:
        return active
    latest = latest_terminal_run(reader, session_id)
    if latest is not None and retained_terminal_run(reader, latest, now_ms):
        return latest
    return None


def retained_terminal_run(reader: Reader, run_id: str, now_ms: int) -> bool:
    """The latest terminal run stays while its terminal message is pending or its first
    turn is open, and for `TERMINAL_RETENTION_MS` after that turn ends (the server's
    injectable clock)."""
    if terminal_cleared(reader, run_id):
        return False
    return terminal_message_retained(reader, run_id, now=now_ms, keep_ms=TERMINAL_RETENTION_MS)


def clear_terminal(db: Database, session_id: str) -> str | None:
    """`sessionView.clearTerminal`: stop retaining the session's terminal run, if it is
    shown. Only the binding's marker changes (its trigger moves the view revision); no
    workflow state does. Returns the cleared run ID, None when nothing was retained."""
    with db.write() as tx:
        now = tx.now
        if session_reservation(tx, session_id) is not None:
            return None  # an active run is shown, not a terminal one
        latest = latest_terminal_run(tx, session_id)
        if latest is None or not retained_terminal_run(tx, latest, now):
            return None
        clear_terminal_retention(tx, latest)
        return latest


def _record(row: MessageRow) -> dict[str, Any]:
    record: dict[str, Any] = {
        "messageId": row.message_id,
        "runId": row.run_id,
        "kind": row.kind,
        "sourceId": row.source_id,
        "order": row.session_order,
        "state": row.state,
        "contentDigest": row.content_digest,
        "piEntryId": row.pi_entry_id,
    }
    if row.reason is not None:
        record["reason"] = row.reason
    return record


def _window(reader: Reader, session_id: str) -> dict[str, Any]:
    """Records in session order until the item limit or byte budget; the full count.
    `complete` says whether every counted record is in `items`."""
    items: list[dict[str, Any]] = []
    used = 0
    for row in session_messages(reader, session_id, WINDOW_ITEMS):
        record = _record(row)
        size = len(dumps(record)) + 1
        if used + size > WINDOW_BYTES:
            break
        items.append(record)
        used += size
    count = session_messages_count(reader, session_id)
    return {"count": count, "items": items, "complete": len(items) == count}


def _next_message(reader: Reader, session_id: str) -> dict[str, Any] | None:
    row = next_eligible_message(reader, session_id)
    if row is None:
        return None
    return {**_record(row), "content": json_blob_value(reader, row.run_id, row.content_digest)}


def build_session_view(
    db: Database,
    session_id: str,
    *,
    coordinator: bool = False,
    fenced: bool = False,
    since: int | None = None,
) -> SessionRead | None:
    """The session's view from one read, or None when its revision is still `since`.

    `coordinator`: this subscription holds the active epoch, so the view names the next
    eligible message; `fenced`: it held one that a newer claim replaced (its revision
    moves once, so the fenced connection learns it lost the epoch).
    """
    now = db.clock.now_ms()
    with db.read():
        revision = session_revision(db, session_id, now) * 2 + int(fenced)
        if revision == since:
            return None
        shown = _shown_run(db, session_id, now)
        run_view = build_run_view(db, shown) if shown is not None else None
        payload: dict[str, Any] = {
            "schema": SESSION_VIEW_SCHEMA,
            "sessionId": session_id,
            "revision": revision,
            "activeRun": run_view,
            "coordinator": coordinator,
            "messages": _window(db, session_id),
            "nextMessage": _next_message(db, session_id) if coordinator else None,
        }
    return SessionRead(revision, payload)
