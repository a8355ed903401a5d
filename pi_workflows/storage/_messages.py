"""Workflow messages and origin-session turns (workflow-server.md § Durable protocol records).

A message is content Pi must add to an origin conversation: target session, kind, source,
content digest (a blob, never logged), session order, state and confirmed Pi entry. Every
write runs in the caller's transaction, which holds the claim check, event and revision.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final

from pi_workflows.storage import _queries as q
from pi_workflows.storage._bindings import interactive_origin_session
from pi_workflows.storage._content import put_json_blob, read_json_blob
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._errors import ContentUnavailableError
from pi_workflows.storage._session_record import fail_turn_capture
from pi_workflows.storage._view_reads import store_view_blob
from pi_workflows.wire.canonical import dumps

__all__ = [
    "MESSAGE_KINDS",
    "STEP_REASONS",
    "MessageRow",
    "OpenTurn",
    "RepresentSource",
    "TurnRow",
    "absent_from_branch",
    "cancel_step_messages",
    "cancel_superseded_step_messages",
    "end_turn",
    "insert_message",
    "insert_step_again",
    "insert_turn",
    "latest_open_turn",
    "mark_sent",
    "message_turn_ended",
    "next_eligible_message",
    "open_turns",
    "pending_step_message",
    "present_notification",
    "present_resumed_steps",
    "present_terminal",
    "read_message",
    "read_turn",
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
# message (pending) and every sent message that is still open: a sent step of a request
# that is still pending in this session (an adopted run's request moved on), and a sent
# terminal or follow-up message until its first turn ends (client-protocol.md §
# Origin-session activity).
_WINDOW_WHERE = """
m.target_session_id = :session AND (
    m.state = 'pending'
    OR (m.state = 'sent' AND m.kind = 'step' AND EXISTS (
        SELECT 1 FROM interactive_requests i
        WHERE i.request_id = m.source_id AND i.status = 'pending'
          AND i.target_session_id = m.target_session_id))
    OR (m.state = 'sent' AND m.kind IN ('terminal', 'follow_up') AND NOT EXISTS (
        SELECT 1 FROM workflow_turns t
        WHERE t.message_id = m.message_id AND t.status != 'open'))
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


def read_message(reader: Reader, message_id: str) -> MessageRow | None:
    return reader.fetch_one(
        f"SELECT {_COLUMNS} FROM workflow_messages AS m WHERE m.message_id = :m",
        {"m": message_id},
        MessageRow,
    )


def mark_sent(tx: Tx, message: MessageRow, entry_id: str) -> None:
    """Branch evidence: a pending or cancelled message is `sent` with its Pi entry."""
    tx.execute(
        "UPDATE workflow_messages SET state = 'sent', pi_entry_id = :e, updated_at = :now "
        "WHERE message_id = :m",
        {"e": entry_id, "m": message.message_id, "now": tx.now},
    )
    touch_run_view(tx, message.run_id)


@dataclass(frozen=True, slots=True)
class RepresentSource:
    """A pending interactive request of the session whose step must be presented again."""

    request_id: str
    run_id: str
    content_digest: str


# Pending agent requests of the session, their run not paused, with no pending step
# message, that were presented (a sent step message exists) but none of whose sent step
# messages is on the reported branch (`present` is the JSON list of reported IDs).
_ABSENT_FROM_BRANCH = """
SELECT i.request_id, i.run_id,
       (SELECT m.content_digest FROM workflow_messages m WHERE m.source_id = i.request_id
        AND m.kind = 'step' ORDER BY m.session_order LIMIT 1) AS content_digest
FROM interactive_requests i JOIN runs r ON r.run_id = i.run_id
WHERE i.target_session_id = :s AND i.status = 'pending' AND i.kind IN ('agent', 'assistant')
  AND r.paused = 0 AND r.finished_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM workflow_messages m WHERE m.source_id = i.request_id
                  AND m.kind = 'step' AND m.state = 'pending')
  AND EXISTS (SELECT 1 FROM workflow_messages m WHERE m.source_id = i.request_id
              AND m.kind = 'step' AND m.state = 'sent')
  AND NOT EXISTS (SELECT 1 FROM workflow_messages m WHERE m.source_id = i.request_id
                  AND m.kind = 'step' AND m.state = 'sent'
                  AND m.message_id IN (SELECT value FROM json_each(:present)))
ORDER BY i.created_at, i.request_id
"""


def absent_from_branch(reader: Reader, session_id: str, present_json: str) -> list[RepresentSource]:
    return reader.fetch_all(
        _ABSENT_FROM_BRANCH, {"s": session_id, "present": present_json}, RepresentSource
    )


def insert_step_again(tx: Tx, source: RepresentSource, session_id: str, reason: str) -> str:
    """One more step message for a pending request, with the first one's content (the
    partial unique index keeps it to one pending)."""
    order = tx.fetch_value(
        "SELECT coalesce(max(session_order), 0) + 1 FROM workflow_messages "
        "WHERE target_session_id = :s",
        {"s": session_id},
    )
    message_id = f"message-{uuid.uuid4().hex}"
    tx.execute(
        "INSERT INTO workflow_messages (message_id, run_id, target_session_id, kind, reason, "
        "source_id, content_digest, session_order, state, created_at, updated_at) VALUES "
        "(:m, :r, :s, 'step', :reason, :source, :digest, :order, 'pending', :now, :now)",
        {
            "m": message_id,
            "r": source.run_id,
            "s": session_id,
            "reason": reason,
            "source": source.request_id,
            "digest": source.content_digest,
            "order": order,
            "now": tx.now,
        },
    )
    touch_run_view(tx, source.run_id)
    return message_id


def next_eligible_message(reader: Reader, session_id: str) -> MessageRow | None:
    """The session's next eligible pending message, in session order: a step of a pending
    request of an unpaused run, a decision still pending, or any passive message."""
    return reader.fetch_one(q.SELECT_NEXT_ELIGIBLE_MESSAGE, {"session_id": session_id}, MessageRow)


def pending_step_message(reader: Reader, request_id: str) -> bool:
    """Whether the request has a pending step message (a reminder or a re-presentation)."""
    found = reader.fetch_value(q.SELECT_PENDING_STEP_MESSAGE, {"request_id": request_id})
    return found is not None


def cancel_step_messages(tx: Tx, request_id: str) -> None:
    """Cancel the request's pending step messages (it settled, closed or timed out), in
    the caller's transaction."""
    tx.execute(q.UPDATE_STEP_MESSAGES_CANCEL, {"request_id": request_id, "now": tx.now})


def cancel_superseded_step_messages(tx: Tx, run_id: str) -> None:
    """Cancel the pending step messages of the run's cancelled (superseded) requests: they
    can never be answered. In the caller's transaction."""
    tx.execute(q.UPDATE_CANCELLED_REQUEST_MESSAGES_CANCEL, {"run_id": run_id, "now": tx.now})


# --- turns ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnRow:
    turn_id: str
    message_id: str
    run_id: str
    session_id: str
    status: str
    response_entry_id: str | None
    started_at: int
    ended_at: int | None


_TURN_COLUMNS = (
    "turn_id, message_id, run_id, session_id, status, response_entry_id, started_at, ended_at"
)


def read_turn(reader: Reader, turn_id: str) -> TurnRow | None:
    return reader.fetch_one(
        f"SELECT {_TURN_COLUMNS} FROM workflow_turns WHERE turn_id = :t", {"t": turn_id}, TurnRow
    )


def open_turns(reader: Reader, session_id: str) -> list[TurnRow]:
    return reader.fetch_all(
        f"SELECT {_TURN_COLUMNS} FROM workflow_turns WHERE session_id = :s AND status = 'open'",
        {"s": session_id},
        TurnRow,
    )


@dataclass(frozen=True, slots=True)
class OpenTurn:
    """A run's open origin-session model turn, as the run view shows it."""

    turn_id: str
    message_id: str
    started_at: int


def latest_open_turn(reader: Reader, run_id: str) -> OpenTurn | None:
    """The run's newest open model turn, if any."""
    return reader.fetch_one(q.SELECT_OPEN_RUN_TURN, {"run_id": run_id}, OpenTurn)


def message_turn_ended(reader: Reader, message_id: str) -> bool:
    """Whether a turn of the message has ended."""
    return reader.fetch_value(q.SELECT_MESSAGE_TURN_ENDED, {"message_id": message_id}) is not None


def insert_turn(tx: Tx, *, turn_id: str, message: MessageRow) -> None:
    tx.execute(
        "INSERT INTO workflow_turns (turn_id, message_id, run_id, session_id, status, "
        "started_at) VALUES (:t, :m, :r, :s, 'open', :now)",
        {
            "t": turn_id,
            "m": message.message_id,
            "r": message.run_id,
            "s": message.target_session_id,
            "now": tx.now,
        },
    )
    touch_run_view(tx, message.run_id)


def end_turn(tx: Tx, turn: TurnRow, status: str, response_entry_id: str | None) -> None:
    """End an open turn (`completed`, `aborted`, `error` or `lost`). A turn ended
    `lost` here was proved lost (an idle branch report, a newer start): its capture fails."""
    ended = tx.execute(
        "UPDATE workflow_turns SET status = :st, response_entry_id = :e, ended_at = :now "
        "WHERE turn_id = :t AND status = 'open'",
        {"st": status, "e": response_entry_id, "t": turn.turn_id, "now": tx.now},
    )
    if ended and status == "lost":
        fail_turn_capture(tx, turn.turn_id)
    touch_run_view(tx, turn.run_id)


# Pending origin-session agent requests of a run, presented before (a step message
# exists), with no pending step message: a resume presents each again.
_RESUMABLE_STEPS = """
SELECT i.request_id, i.run_id,
       (SELECT m.content_digest FROM workflow_messages m WHERE m.source_id = i.request_id
        AND m.kind = 'step' ORDER BY m.session_order LIMIT 1) AS content_digest,
       i.target_session_id
FROM interactive_requests i
WHERE i.run_id = :r AND i.status = 'pending' AND i.kind IN ('agent', 'assistant')
  AND i.target_session_id IS NOT NULL
  AND EXISTS (SELECT 1 FROM workflow_messages m WHERE m.source_id = i.request_id
              AND m.kind = 'step')
  AND NOT EXISTS (SELECT 1 FROM workflow_messages m WHERE m.source_id = i.request_id
                  AND m.kind = 'step' AND m.state = 'pending')
ORDER BY i.created_at, i.request_id
"""


@dataclass(frozen=True, slots=True)
class _Resumable:
    request_id: str
    run_id: str
    content_digest: str
    target_session_id: str


def present_resumed_steps(tx: Tx, run_id: str) -> list[str]:
    """Inside a resume's transaction: each pending submitted-output step of the run gets
    its request revision + 1 and one `resumed` step message (workflow-server.md §
    Origin-session activity). A protected decision starts no turn, so it gets none."""
    created: list[str] = []
    for row in tx.fetch_all(_RESUMABLE_STEPS, {"r": run_id}, _Resumable):
        tx.execute(
            "UPDATE interactive_requests SET revision = revision + 1, updated_at = :now "
            "WHERE request_id = :q",
            {"q": row.request_id, "now": tx.now},
        )
        source = RepresentSource(row.request_id, row.run_id, row.content_digest)
        created.append(insert_step_again(tx, source, row.target_session_id, "resumed"))
    return created


# --- terminal and notification messages ------------------------------------------------

MAX_TERMINAL_REASON_CHARS: Final = 1000
"""The bound of a failure reason carried in a terminal message."""
MAX_TERMINAL_OUTPUT_BYTES: Final = 4096
"""A completed run's output rides in its terminal message only up to this size."""


def present_terminal(
    tx: Tx, run_id: str, outcome: str, *, reason: str | None, event_payload: Any
) -> str | None:
    """In a run's terminal transaction: one `terminal` message to its origin session,
    with its terminal outcome; returns its ID, or None for a headless run and for a
    parent settled by its continuation (only the final leaf of a checkpoint-
    continuation chain gets one). Its source is the run itself, so a second call finds
    it and adds none."""
    session = interactive_origin_session(tx, run_id)
    if session is None:
        return None
    if tx.fetch_value("SELECT 1 FROM runs WHERE continuation_of = :r", {"r": run_id}):
        return None
    if tx.fetch_value(
        "SELECT 1 FROM workflow_messages WHERE source_id = :r AND kind = 'terminal'",
        {"r": run_id},
    ):
        return None
    workflow = tx.fetch_value("SELECT workflow_name FROM runs WHERE run_id = :r", {"r": run_id})
    content: dict[str, Any] = {"runId": run_id, "workflow": workflow, "outcome": outcome}
    if outcome != "completed" and reason:
        content["reason"] = reason[:MAX_TERMINAL_REASON_CHARS]
    if isinstance(event_payload, dict) and "output" in event_payload:
        if len(dumps(event_payload["output"])) <= MAX_TERMINAL_OUTPUT_BYTES:
            content["output"] = event_payload["output"]
        else:
            content["outputTooLarge"] = True  # the run view has it in full
    return insert_message(
        tx, run_id=run_id, session_id=session, kind="terminal", source_id=run_id, content=content
    )


@dataclass(frozen=True, slots=True)
class _Attempt:
    node_path: str
    node_type: str
    visit: int


def present_notification(tx: Tx, run_id: str, attempt_id: str, output: Any) -> str | None:
    """In the transaction of a notify node's result: one passive `notification` message
    to the interactive run's origin session (never a model turn). Its source is the
    node visit (`run:node:visit`, the runner's notification ID), so a notify node that
    runs again after a crash adds none. None for another node kind or a headless run."""
    attempt = tx.fetch_one(
        "SELECT node_path, node_type, visit FROM node_attempts WHERE attempt_id = :a",
        {"a": attempt_id},
        _Attempt,
    )
    if attempt is None or attempt.node_type != "notify":
        return None
    session = interactive_origin_session(tx, run_id)
    if session is None:
        return None
    source = f"{run_id}:{attempt.node_path}:{attempt.visit}"
    if tx.fetch_value(
        "SELECT 1 FROM workflow_messages WHERE source_id = :s AND kind = 'notification'",
        {"s": source},
    ):
        return None
    text = output.get("text") if isinstance(output, dict) else None
    content = {
        "runId": run_id,
        "step": attempt.node_path,
        "text": str(text) if text is not None else "",
        "kind": _notify_kind(tx, run_id, attempt.node_path),
    }
    return insert_message(
        tx,
        run_id=run_id,
        session_id=session,
        kind="notification",
        source_id=source,
        content=content,
    )


def _notify_kind(reader: Reader, run_id: str, node_path: str) -> str:
    """The node's declared kind (`progress` or `final`) from the run's definition snapshot."""
    digest = reader.fetch_value(
        "SELECT definition_digest FROM runs WHERE run_id = :r", {"r": run_id}
    )
    try:
        snapshot = read_json_blob(reader, str(digest))
    except ContentUnavailableError:
        return "progress"
    nodes = snapshot.get("nodes") if isinstance(snapshot, dict) else None
    node = nodes.get(node_path) if isinstance(nodes, dict) else None
    kind = node.get("notifyKind") if isinstance(node, dict) else None
    return kind if kind in ("progress", "final") else "progress"
