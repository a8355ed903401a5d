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
    session_messages,
    session_messages_count,
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


_ACTIVE_RUN = """
SELECT run_id FROM run_bindings WHERE origin_session_id = :s AND reserved = 1
"""
_LATEST_TERMINAL_RUN = """
SELECT r.run_id FROM runs r JOIN run_bindings b ON b.run_id = r.run_id
WHERE b.origin_session_id = :s AND r.finished_at IS NOT NULL
ORDER BY r.finished_at DESC, r.rowid DESC LIMIT 1
"""
# The terminal run's retention was cleared (`sessionView.clearTerminal`).
_TERMINAL_CLEARED = """
SELECT 1 FROM run_bindings WHERE run_id = :r AND terminal_cleared_at IS NOT NULL
"""
# Its terminal message is pending, or sent with its first turn not started yet, or that
# turn is open or ended less than 60 s ago: the terminal run stays in view (without the
# sent case it blinked out between the send and pi's turn start).
_TERMINAL_RETAINED = """
SELECT 1 FROM workflow_messages m
WHERE m.run_id = :r AND m.kind = 'terminal' AND (
    m.state = 'pending'
    OR (m.state = 'sent'
        AND NOT EXISTS (SELECT 1 FROM workflow_turns t WHERE t.message_id = m.message_id))
    OR EXISTS (
        SELECT 1 FROM workflow_turns t WHERE t.message_id = m.message_id
        AND t.started_at = (SELECT min(f.started_at) FROM workflow_turns f
                            WHERE f.message_id = m.message_id)
        AND (t.status = 'open' OR t.ended_at > :now - :keep))
)
"""
# Every run of the session adds its view revision: each only grows, and a newer run
# adds its own, so the sum grows with every change a session view shows.
_BASE_REVISION = """
SELECT coalesce(sum(r.revision + r.view_changes), 0) FROM runs r
JOIN run_bindings b ON b.run_id = r.run_id WHERE b.origin_session_id = :s
"""
# The next eligible pending message, in session order. An earlier ineligible message
# does not block a later eligible one (workflow-server.md § Interactive Pi execution).
_NEXT_ELIGIBLE = """
SELECT m.message_id, m.run_id, m.target_session_id, m.kind, m.reason, m.source_id,
       m.content_digest, m.session_order, m.state, m.pi_entry_id
FROM workflow_messages m JOIN runs r ON r.run_id = m.run_id
WHERE m.target_session_id = :s AND m.state = 'pending' AND (
    (m.kind = 'step' AND r.paused = 0 AND EXISTS (
        SELECT 1 FROM interactive_requests i
        WHERE i.request_id = m.source_id AND i.status = 'pending'))
    OR (m.kind = 'decision' AND EXISTS (
        SELECT 1 FROM human_decisions d
        WHERE d.decision_id = m.source_id AND d.status = 'pending'))
    OR m.kind IN ('notification', 'terminal', 'follow_up')
)
ORDER BY m.session_order LIMIT 1
"""


def session_revision(reader: Reader, session_id: str, now_ms: int) -> int:
    """The view's revision: the sum of its runs' revisions, times two, plus one once
    the retained terminal run has expired. Both parts only grow (for a fixed sum the
    expiry flips once), so the revision never goes back."""
    base = int(reader.fetch_value(_BASE_REVISION, {"s": session_id}) or 0)
    shown = _shown_run(reader, session_id, now_ms)
    latest = reader.fetch_value(_LATEST_TERMINAL_RUN, {"s": session_id})
    expired = shown is None and latest is not None
    return base * 2 + int(expired)


def _shown_run(reader: Reader, session_id: str, now_ms: int) -> str | None:
    active = reader.fetch_value(_ACTIVE_RUN, {"s": session_id})
    if active is not None:
        return str(active)
    latest = reader.fetch_value(_LATEST_TERMINAL_RUN, {"s": session_id})
    if latest is not None and retained_terminal_run(reader, str(latest), now_ms):
        return str(latest)
    return None


def retained_terminal_run(reader: Reader, run_id: str, now_ms: int) -> bool:
    """The latest terminal run stays while its terminal message is pending or its first
    turn is open, and for `TERMINAL_RETENTION_MS` after that turn ends (the server's
    injectable clock)."""
    if reader.fetch_value(_TERMINAL_CLEARED, {"r": run_id}) is not None:
        return False
    found = reader.fetch_value(
        _TERMINAL_RETAINED, {"r": run_id, "now": now_ms, "keep": TERMINAL_RETENTION_MS}
    )
    return found is not None


def clear_terminal(db: Database, session_id: str) -> str | None:
    """`sessionView.clearTerminal`: stop retaining the session's terminal run, if it is
    shown. Only the binding's marker changes (its trigger moves the view revision); no
    workflow state does. Returns the cleared run ID, None when nothing was retained."""
    with db.write() as tx:
        now = tx.now
        if tx.fetch_value(_ACTIVE_RUN, {"s": session_id}) is not None:
            return None  # an active run is shown, not a terminal one
        latest = tx.fetch_value(_LATEST_TERMINAL_RUN, {"s": session_id})
        if latest is None or not retained_terminal_run(tx, str(latest), now):
            return None
        tx.execute(
            "UPDATE run_bindings SET terminal_cleared_at = :now WHERE run_id = :r",
            {"r": str(latest), "now": now},
        )
        return str(latest)


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
    row = reader.fetch_one(_NEXT_ELIGIBLE, {"s": session_id}, MessageRow)
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
