"""Reads behind the live run view (`pi-workflows.run-view.v1`), and failure tracebacks.

Implements the storage side of workflow-server.md § Live run view: each an indexed read
beyond the run, queue and attempt rows; call them inside one `Database.read()` block so
the whole view is one snapshot. Internal; `pi_workflows.storage` exports the names.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from pi_workflows.storage import _queries as q
from pi_workflows.storage._content import ContentRef, put_view_content
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._rows import NodeAttemptRow

__all__ = [
    "TRACEBACK_MEDIA_TYPE",
    "VIEW_INLINE_BYTES",
    "VIEW_JSON_MEDIA_TYPE",
    "VIEW_TEXT_MEDIA_TYPE",
    "LineageLinks",
    "NumberedAttempt",
    "PendingRequest",
    "attempt_position",
    "attempt_window",
    "count_attempts",
    "count_transitions",
    "failure_tracebacks",
    "lineage_links",
    "pending_requests",
    "put_traceback",
    "run_result_payload",
    "session_base_revision",
    "store_view_blob",
    "store_view_text",
    "terminal_message_retained",
    "transition_window",
]

VIEW_INLINE_BYTES = 16 * 1024
"""The shared inline-content threshold: a larger value is shown by content reference."""
VIEW_JSON_MEDIA_TYPE = "application/json"
"""Media type of a JSON value (input, output, definition snapshot) in `run_view_content`."""
VIEW_TEXT_MEDIA_TYPE = "text/plain; charset=utf-8"
"""Media type of a long reason or error in `run_view_content`."""

TRACEBACK_MEDIA_TYPE = "text/x-python-traceback; charset=utf-8"
"""The media type a failed node's traceback is stored under in `run_view_content`."""

_SELECT_PENDING_REQUESTS = """
SELECT r.request_id, r.kind, a.node_path, r.last_turn_error FROM interactive_requests r
JOIN node_attempts a ON a.attempt_id = r.attempt_id
WHERE r.run_id = :run_id AND r.status = 'pending'
ORDER BY r.created_at, r.request_id
"""
# The newest terminal result event; a terminal run appends it last but for protected
# writes, so walking the primary key backwards finds it in a few steps.
_SELECT_RESULT_PAYLOAD = """
SELECT payload FROM events
WHERE run_id = :run_id AND event_type IN ('run_completed', 'run_failed', 'run_timed_out')
ORDER BY revision DESC LIMIT 1
"""
_SELECT_TRACEBACKS = """
SELECT json_extract(payload, '$.attemptId') AS attempt_id,
       json_extract(payload, '$.traceback.digest') AS digest,
       json_extract(payload, '$.traceback.byteCount') AS byte_length
FROM events
WHERE run_id = :run_id AND event_type = 'node_failed'
  AND json_extract(payload, '$.traceback') IS NOT NULL
"""
# Copies a blob's exact bytes into the run's view content, only when it is too large to
# inline: one statement, so a 5 MiB output is never held in Python memory twice.
_COPY_BLOB_TO_VIEW_CONTENT = """
INSERT INTO run_view_content (run_id, digest, media_type, byte_length, content, created_at)
SELECT :run_id, digest, :media_type, byte_length, content, :now FROM blobs
WHERE digest = :digest AND byte_length > :inline_bytes
ON CONFLICT (run_id, digest, media_type) DO NOTHING
"""
_COUNT_ATTEMPTS = "SELECT count(*) FROM node_attempts WHERE run_id = :run_id"
# One window of attempts in start (rowid) order, with each attempt's number among the
# attempts of its node visit (counted on the node index, not by reading the history).
_SELECT_ATTEMPT_WINDOW = """
SELECT a.attempt_id, a.run_id, a.node_path, a.node_type, a.visit, a.generation, a.status,
       a.started_at, a.deadline_at, a.finished_at, a.output_hash, a.error, a.next_node_path,
       (SELECT count(*) FROM node_attempts b
        WHERE b.run_id = a.run_id AND b.node_path = a.node_path AND b.visit = a.visit
          AND b.rowid <= a.rowid) AS number
FROM node_attempts a WHERE a.run_id = :run_id ORDER BY a.rowid LIMIT :limit OFFSET :offset
"""
# Routed attempts (a transition from their node to `next_node_path`), counted and paged.
_COUNT_TRANSITIONS = """
SELECT count(*) FROM node_attempts WHERE run_id = :run_id AND next_node_path IS NOT NULL
"""
_SELECT_TRANSITION_WINDOW = """
SELECT attempt_id, run_id, node_path, node_type, visit, generation, status, started_at,
       deadline_at, finished_at, output_hash, error, next_node_path, 0 AS number
FROM node_attempts WHERE run_id = :run_id AND next_node_path IS NOT NULL
ORDER BY rowid LIMIT :limit OFFSET :offset
"""
# The same window read from the newest end (OFFSET counted from there), reversed by
# the caller: a window near the newest attempts skips few index entries.
_SELECT_ATTEMPT_WINDOW_DESC = _SELECT_ATTEMPT_WINDOW.replace(
    "ORDER BY a.rowid", "ORDER BY a.rowid DESC"
)
# Where one stored attempt is in its run's start order (how many started before it).
_SELECT_ATTEMPT_POSITION = """
SELECT (SELECT count(*) FROM node_attempts b WHERE b.run_id = a.run_id AND b.rowid < a.rowid)
FROM node_attempts a WHERE a.attempt_id = :attempt_id AND a.run_id = :run_id
"""
_SELECT_RESTARTED_BY = """
SELECT run_id FROM runs WHERE restart_of = :run_id ORDER BY created_at, run_id LIMIT 16
"""
_SELECT_CONTINUED_BY = """
SELECT run_id FROM runs WHERE continuation_of = :run_id ORDER BY created_at, run_id LIMIT 16
"""


@dataclass(frozen=True, slots=True)
class PendingRequest:
    """One pending interactive request of a run (no contract, no payload)."""

    request_id: str
    kind: str
    """`agent`, `assistant`, `checkpoint` or `decision`."""
    node_path: str
    last_turn_error: str | None


@dataclass(frozen=True, slots=True)
class LineageLinks:
    """The runs that came from this one: its restarts and continuations (first 16)."""

    restarted_by: list[str]
    continued_by: list[str]


@dataclass(frozen=True, slots=True)
class NumberedAttempt(NodeAttemptRow):
    """One `node_attempts` row and its attempt number within its node visit."""

    number: int


@dataclass(frozen=True, slots=True)
class _RunId:
    run_id: str


@dataclass(frozen=True, slots=True)
class _Payload:
    payload: str


@dataclass(frozen=True, slots=True)
class _Traceback:
    attempt_id: str | None
    digest: str
    byte_length: int


def pending_requests(reader: Reader, run_id: str) -> list[PendingRequest]:
    """Return the run's pending interactive requests, oldest first."""
    return reader.fetch_all(_SELECT_PENDING_REQUESTS, {"run_id": run_id}, PendingRequest)


def session_base_revision(reader: Reader, session_id: str) -> int:
    """The sum of the view revisions of every run bound to the origin session: it grows
    with every change the session's view shows."""
    return int(reader.fetch_value(q.SELECT_SESSION_BASE_REVISION, {"session_id": session_id}) or 0)


def terminal_message_retained(reader: Reader, run_id: str, *, now: int, keep_ms: int) -> bool:
    """Whether the terminal run's message still holds it in its session's view: pending,
    sent with no turn yet, or its first turn open or ended less than `keep_ms` before
    `now`."""
    found = reader.fetch_value(
        q.SELECT_TERMINAL_RETAINED, {"run_id": run_id, "now": now, "keep_ms": keep_ms}
    )
    return found is not None


def run_result_payload(reader: Reader, run_id: str) -> dict[str, Any] | None:
    """Return the payload of the run's terminal result event (`run_completed`: its
    `output` or `outputRef`), or None before the run ended that way."""
    row = reader.fetch_one(_SELECT_RESULT_PAYLOAD, {"run_id": run_id}, _Payload)
    if row is None:
        return None
    value = json.loads(row.payload)  # event rows are JSON text, not always canonical
    return value if isinstance(value, dict) else None


def failure_tracebacks(
    reader: Reader, run_id: str, attempt_ids: Collection[str] | None = None
) -> dict[str, ContentRef]:
    """Return the stored traceback of each failed attempt, by attempt ID.

    With `attempt_ids` (the failed attempts of one window), the run's events are read
    newest first only until each of them is found: a newest window stops early.
    """
    if attempt_ids is None:
        rows = reader.fetch_all(_SELECT_TRACEBACKS, {"run_id": run_id}, _Traceback)
        return {
            row.attempt_id: ContentRef(run_id, row.digest, TRACEBACK_MEDIA_TYPE, row.byte_length)
            for row in rows
            if row.attempt_id is not None
        }
    wanted = set(attempt_ids)
    found: dict[str, ContentRef] = {}
    if not wanted:
        return found
    cursor = reader.connection.execute(
        _SELECT_TRACEBACKS + " ORDER BY revision DESC", {"run_id": run_id}
    )
    try:
        for attempt_id, digest, byte_length in cursor:
            if attempt_id in wanted and attempt_id not in found:
                found[attempt_id] = ContentRef(run_id, digest, TRACEBACK_MEDIA_TYPE, byte_length)
                if len(found) == len(wanted):
                    break
    finally:
        cursor.close()
    return found


def lineage_links(reader: Reader, run_id: str) -> LineageLinks:
    """Return the restarts and continuations of a run (indexed, at most 16 each)."""
    params = {"run_id": run_id}
    return LineageLinks(
        restarted_by=[r.run_id for r in reader.fetch_all(_SELECT_RESTARTED_BY, params, _RunId)],
        continued_by=[r.run_id for r in reader.fetch_all(_SELECT_CONTINUED_BY, params, _RunId)],
    )


def put_traceback(tx: Tx, run_id: str, traceback: str) -> dict[str, Any]:
    """Store a failed node's bounded traceback as view content; return its event reference.

    **Durability:** call it in the transaction that records the failure, so the
    `node_failed` event never names content that is not stored.
    """
    ref = put_view_content(tx, run_id, TRACEBACK_MEDIA_TYPE, traceback.encode("utf-8"))
    return {"mediaType": ref.media_type, "byteCount": ref.byte_length, "digest": ref.digest}


# --- Trace windows: count first, then read only the selected range -----------------


def count_attempts(reader: Reader, run_id: str) -> int:
    """Return how many attempts the run has (a covering index count)."""
    return int(reader.fetch_value(_COUNT_ATTEMPTS, {"run_id": run_id}))


def attempt_window(
    reader: Reader, run_id: str, offset: int, limit: int, total: int | None = None
) -> list[NumberedAttempt]:
    """Return at most `limit` attempts from position `offset` in start order.

    Given the run's `total` (`count_attempts`), a window nearer the newest end is read
    from there, so OFFSET skips at most half the history.
    """
    offset = max(0, offset)
    if limit <= 0:
        return []
    if total is not None and offset + limit <= total and total - offset - limit < offset:
        params = {"run_id": run_id, "offset": total - offset - limit, "limit": limit}
        rows = reader.fetch_all(_SELECT_ATTEMPT_WINDOW_DESC, params, NumberedAttempt)
        rows.reverse()
        return rows
    params = {"run_id": run_id, "offset": offset, "limit": limit}
    return reader.fetch_all(_SELECT_ATTEMPT_WINDOW, params, NumberedAttempt)


def count_transitions(reader: Reader, run_id: str) -> int:
    """Return how many attempts of the run routed to a next node."""
    return int(reader.fetch_value(_COUNT_TRANSITIONS, {"run_id": run_id}))


def transition_window(
    reader: Reader, run_id: str, offset: int, limit: int
) -> list[NumberedAttempt]:
    """Return at most `limit` routed attempts from position `offset` (`number` is 0)."""
    if limit <= 0:
        return []
    params = {"run_id": run_id, "offset": max(0, offset), "limit": limit}
    return reader.fetch_all(_SELECT_TRANSITION_WINDOW, params, NumberedAttempt)


def attempt_position(reader: Reader, run_id: str, attempt_id: str) -> int | None:
    """Return the position (0 = first started) of one stored attempt of this run, or
    None if the run has no such attempt."""
    value = reader.fetch_value(
        _SELECT_ATTEMPT_POSITION, {"run_id": run_id, "attempt_id": attempt_id}
    )
    return None if value is None else int(value)


# --- View content written with the value that needs it ------------------------------


def store_view_blob(tx: Tx, run_id: str, digest: str | None) -> None:
    """Copy a blob above the inline threshold into the run's view content.

    **Durability:** call it in the transaction that stores or names the blob (an
    attempt's output, a run's output, the definition snapshot), so a view built from
    any later snapshot finds the content its reference names.
    """
    if digest is None:
        return
    tx.execute(
        _COPY_BLOB_TO_VIEW_CONTENT,
        {
            "run_id": run_id,
            "digest": digest,
            "media_type": VIEW_JSON_MEDIA_TYPE,
            "now": tx.now,
            "inline_bytes": VIEW_INLINE_BYTES,
        },
    )


def store_view_text(
    tx: Tx, run_id: str, text: str | None, media_type: str = VIEW_TEXT_MEDIA_TYPE
) -> None:
    """Store a text above the inline threshold (a long reason, error or input) as view
    content, in the transaction that writes the text (see `store_view_blob`)."""
    if text is None:
        return
    data = text.encode("utf-8")
    if len(data) > VIEW_INLINE_BYTES:
        put_view_content(tx, run_id, media_type, data)
