"""Workflow messages: the content Pi must add to an origin conversation.

Implements workflow-server.md § Durable protocol records (`workflow_messages`): one row
per message with its target session, kind, source record, content digest, session
order, state (`pending`, `sent`, `cancelled`) and confirmed Pi entry ID. The content is
a blob (never logged); the run view's content table holds a copy above the inline
threshold so a session view can reference it. Every write here runs inside the caller's
transaction, which holds the claim check, the event and the revision.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final

from pi_workflows.storage._content import put_json_blob
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._view_reads import store_view_blob

__all__ = [
    "MESSAGE_KINDS",
    "STEP_REASONS",
    "MessageRow",
    "insert_message",
    "session_messages",
    "session_messages_count",
    "touch_run_view",
]

MESSAGE_KINDS: Final = frozenset({"step", "decision", "notification", "terminal", "follow_up"})
STEP_REASONS: Final = frozenset({"initial", "reminder", "resumed"})


@dataclass(frozen=True, slots=True)
class MessageRow:
    message_id: str
    run_id: str
    target_session_id: str
    kind: str
    reason: str | None
    source_id: str
    content_digest: str
    session_order: int
    state: str
    pi_entry_id: str | None


_COLUMNS = (
    "message_id, run_id, target_session_id, kind, reason, source_id, content_digest, "
    "session_order, state, pi_entry_id"
)

# The recovery window (client-protocol.md § Run and session views): every nonterminal
# message (pending) and every sent message that is still open, i.e. a sent step of a
# request that is still pending. Terminal and follow-up turns are not tracked yet, so
# a sent terminal or follow-up message stays in the window while its run is retained.
_WINDOW_WHERE = """
m.target_session_id = :session AND (
    m.state = 'pending'
    OR (m.state = 'sent' AND m.kind = 'step' AND EXISTS (
        SELECT 1 FROM interactive_requests i
        WHERE i.request_id = m.source_id AND i.status = 'pending'))
)
"""


def touch_run_view(tx: Tx, run_id: str) -> None:
    """A message changed: the run's (and so its session's) view revision moves."""
    tx.execute("UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = :r", {"r": run_id})


def insert_message(
    tx: Tx,
    *,
    run_id: str,
    session_id: str,
    kind: str,
    source_id: str,
    content: Any,
    reason: str | None = None,
) -> str:
    """Add one pending message at the end of the session's order; returns its ID.

    Raises:
        ValueError: an unknown kind, or a reason that does not match the kind.
        sqlite3.IntegrityError: a second pending step message for the same request.
    """
    if kind not in MESSAGE_KINDS or (kind == "step") != (reason in STEP_REASONS):
        raise ValueError(f"no {kind} message with reason {reason}")
    digest = put_json_blob(tx, content)
    store_view_blob(tx, run_id, digest)  # a large content is referenced from the view
    message_id = f"message-{uuid.uuid4().hex}"
    order = tx.fetch_value(
        "SELECT coalesce(max(session_order), 0) + 1 FROM workflow_messages "
        "WHERE target_session_id = :s",
        {"s": session_id},
    )
    tx.execute(
        "INSERT INTO workflow_messages (message_id, run_id, target_session_id, kind, reason, "
        "source_id, content_digest, session_order, state, created_at, updated_at) VALUES "
        "(:m, :r, :s, :k, :reason, :source, :digest, :order, 'pending', :now, :now)",
        {
            "m": message_id,
            "r": run_id,
            "s": session_id,
            "k": kind,
            "reason": reason,
            "source": source_id,
            "digest": digest,
            "order": order,
            "now": tx.now,
        },
    )
    touch_run_view(tx, run_id)
    return message_id


def session_messages(reader: Reader, session_id: str, limit: int) -> list[MessageRow]:
    """The session's recovery window, in session order, at most `limit` rows."""
    return reader.fetch_all(
        f"SELECT {_COLUMNS} FROM workflow_messages AS m WHERE {_WINDOW_WHERE} "
        "ORDER BY m.session_order LIMIT :limit",
        {"session": session_id, "limit": limit},
        MessageRow,
    )


def session_messages_count(reader: Reader, session_id: str) -> int:
    """The complete count of the session's recovery window."""
    count = reader.fetch_value(
        f"SELECT count(*) FROM workflow_messages AS m WHERE {_WINDOW_WHERE}",
        {"session": session_id},
    )
    return int(count or 0)
