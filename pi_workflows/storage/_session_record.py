"""The session record (workflow-server.md § Interactive requests; client-protocol.md §
Run and session views): recording segments, session events, entries and event pages with
their replay checkpoints. Rows only: what an event means, how a page is cut and what a
checkpoint folds are the domain's. Writes run in the caller's transaction; never logged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pi_workflows.storage._db import Reader, Tx

__all__ = [
    "SESSION_EVENT_BYTES",
    "SegmentCounts",
    "SegmentRow",
    "SegmentSummary",
    "SessionEventRow",
    "SessionPageRow",
    "StoredSeq",
    "append_session_event",
    "count_session_events",
    "count_session_pages",
    "count_session_segments",
    "grow_session_page",
    "insert_session_page",
    "last_session_page",
    "open_segment",
    "put_session_entry",
    "read_segment",
    "run_segments",
    "session_event_range",
    "session_page",
    "session_page_of",
    "stored_seq",
    "update_segment",
]

SESSION_EVENT_BYTES: Final = 64 * 1024
"""The most bytes of one stored event payload (the table's CHECK says the same)."""

_SEGMENT_COLUMNS = (
    "segment_id, turn_id, run_id, message_id, session_id, status, failure, event_count, "
    "next_seq, gaps, missing, expected_count, conflicts, oversized, started_at, updated_at"
)
_SELECT_SEGMENT = f"SELECT {_SEGMENT_COLUMNS} FROM session_segments WHERE turn_id = :turn_id"
_FAIL_TURN_CAPTURE = """
UPDATE session_segments SET status = 'failed', failure = 'turnLost', updated_at = :now
WHERE turn_id = :t AND status = 'recording'
"""
_FAIL_ORPHANED_CAPTURES = """
UPDATE session_segments SET status = 'failed', failure = 'turnLost', updated_at = :now
WHERE session_id = :s AND status = 'recording'
  AND turn_id NOT IN (SELECT turn_id FROM workflow_turns WHERE status = 'open')
"""
_INSERT_SEGMENT = """
INSERT INTO session_segments (turn_id, run_id, message_id, session_id, status, started_at,
                              updated_at)
VALUES (:turn_id, :run_id, :message_id, :session_id, 'recording', :now, :now)
"""
_UPDATE_SEGMENT = """
UPDATE session_segments SET event_count = :event_count, next_seq = :next_seq, gaps = :gaps,
    missing = :missing, expected_count = :expected_count, conflicts = :conflicts,
    oversized = :oversized, status = :status, failure = :failure, updated_at = :now
WHERE segment_id = :segment_id
"""
_SELECT_STORED_SEQ = """
SELECT event_type, payload FROM session_events
WHERE segment_id = :segment_id AND seq = :seq
"""
_SELECT_NEXT_POSITION = """
SELECT coalesce(max(position) + 1, 0) FROM session_events WHERE run_id = :run_id
"""
_INSERT_EVENT = """
INSERT INTO session_events (run_id, position, segment_id, seq, event_type, payload, recorded_at)
VALUES (:run_id, :position, :segment_id, :seq, :event_type, :payload, :now)
"""
_INSERT_ENTRY = """
INSERT INTO session_entries (segment_id, entry_id, run_id, position, role, content_hash,
                             recorded_at)
VALUES (:segment_id, :entry_id, :run_id, :position, :role, :content_hash, :now)
ON CONFLICT (segment_id, entry_id) DO NOTHING
"""
_PAGE_COLUMNS = (
    "run_id, page_index, first_position, item_count, byte_count, checkpoint, checkpoint_hash"
)
_SELECT_LAST_PAGE = (
    f"SELECT {_PAGE_COLUMNS} FROM session_pages WHERE run_id = :run_id "
    "ORDER BY page_index DESC LIMIT 1"
)
_SELECT_PAGE = (
    f"SELECT {_PAGE_COLUMNS} FROM session_pages WHERE run_id = :run_id AND page_index = :page_index"
)
# The page holding `position`: the last one that starts at or before it.
_SELECT_PAGE_OF = (
    f"SELECT {_PAGE_COLUMNS} FROM session_pages WHERE run_id = :run_id "
    "AND first_position <= :position ORDER BY first_position DESC LIMIT 1"
)
_COUNT_PAGES = "SELECT count(*) FROM session_pages WHERE run_id = :run_id"
_INSERT_PAGE = """
INSERT INTO session_pages (run_id, page_index, first_position, checkpoint, checkpoint_hash)
VALUES (:run_id, :page_index, :first_position, :checkpoint, :checkpoint_hash)
"""
_GROW_PAGE = """
UPDATE session_pages SET item_count = item_count + :items, byte_count = byte_count + :bytes
WHERE run_id = :run_id AND page_index = :page_index
"""
# Each event with its segment's turn and, for a finished message Pi saved, the verbatim
# entry's blob (its digest and size: clients read it with view.content).
_SELECT_EVENT_RANGE = """
SELECT e.position, e.seq, e.event_type, e.payload, e.recorded_at, s.turn_id,
       n.content_hash AS entry_hash, b.byte_length AS entry_bytes
FROM session_events e JOIN session_segments s ON s.segment_id = e.segment_id
LEFT JOIN session_entries n ON n.run_id = e.run_id AND n.position = e.position
LEFT JOIN blobs b ON b.digest = n.content_hash
WHERE e.run_id = :run_id AND e.position >= :first
ORDER BY e.position LIMIT :limit
"""
# Positions are dense from 0 (appended at max + 1, deleted only with the run): the count
# is one step down the primary key, not a scan of a long record.
_COUNT_EVENTS = _SELECT_NEXT_POSITION
_COUNT_SEGMENTS = "SELECT count(*) FROM session_segments WHERE run_id = :run_id"
# The newest segments of a run, with the node of the step each turn answered (a step
# message's source is its interactive request; other messages name no node) and where
# its lowest seq is stored (one index step, not a scan of a long turn's events).
_SELECT_RUN_SEGMENTS = """
SELECT s.segment_id, s.turn_id, s.message_id, s.status, s.failure, s.event_count, s.next_seq,
       s.gaps, s.missing, s.expected_count, s.conflicts, s.oversized, s.started_at,
       s.updated_at, m.kind AS message_kind,
       (SELECT a.node_path FROM interactive_requests r
        JOIN node_attempts a ON a.attempt_id = r.attempt_id
        WHERE m.kind = 'step' AND r.request_id = m.source_id) AS node_path,
       (SELECT position FROM session_events e WHERE e.segment_id = s.segment_id
        ORDER BY seq LIMIT 1) AS first_position
FROM session_segments s JOIN workflow_messages m ON m.message_id = s.message_id
WHERE s.run_id = :run_id ORDER BY s.segment_id DESC LIMIT :limit
"""


@dataclass(frozen=True, slots=True)
class SegmentRow:
    """One recording segment: a workflow turn's capture and its integrity counts."""

    segment_id: int
    turn_id: str
    run_id: str
    message_id: str
    session_id: str
    status: str
    failure: str | None
    event_count: int
    next_seq: int
    gaps: int
    missing: int
    expected_count: int | None
    conflicts: int
    oversized: int
    started_at: int
    updated_at: int


@dataclass(frozen=True, slots=True)
class SegmentCounts:
    """What one recorded batch leaves on its segment (`update_segment`)."""

    event_count: int
    next_seq: int
    gaps: int
    missing: int
    expected_count: int | None
    conflicts: int
    oversized: int
    status: str
    failure: str | None


@dataclass(frozen=True, slots=True)
class StoredSeq:
    event_type: str
    payload: str


@dataclass(frozen=True, slots=True)
class SessionEventRow:
    """One stored session event, with its run-wide position and its segment's turn."""

    position: int
    seq: int
    event_type: str
    payload: str
    recorded_at: int
    turn_id: str
    entry_hash: str | None = None
    """A finished message's verbatim Pi entry (a JSON blob), when reported."""
    entry_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class SessionPageRow:
    """One session-event page: where it starts, how full it is, its checkpoint."""

    run_id: str
    page_index: int
    first_position: int
    item_count: int
    byte_count: int
    checkpoint: str | None
    """The checkpoint's canonical JSON when small, else None and `checkpoint_hash`."""
    checkpoint_hash: str | None


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """A segment as the run view shows it (no recorded content)."""

    segment_id: int
    turn_id: str
    message_id: str
    status: str
    failure: str | None
    event_count: int
    next_seq: int
    gaps: int
    missing: int
    expected_count: int | None
    conflicts: int
    oversized: int
    started_at: int
    updated_at: int
    message_kind: str
    node_path: str | None
    first_position: int | None


def fail_turn_capture(tx: Tx, turn_id: str) -> None:
    """A turn proved lost: its capture, if still recording, fails with `turnLost`."""
    tx.execute(_FAIL_TURN_CAPTURE, {"t": turn_id, "now": tx.now})


def fail_orphaned_captures(tx: Tx, session_id: str) -> None:
    """The session's Pi is idle: a capture still recording for a turn that is no longer
    open (closed by its run's end, its Pi gone before the last batch) fails with
    `turnLost`."""
    tx.execute(_FAIL_ORPHANED_CAPTURES, {"s": session_id, "now": tx.now})


def read_segment(reader: Reader, turn_id: str) -> SegmentRow | None:
    return reader.fetch_one(_SELECT_SEGMENT, {"turn_id": turn_id}, SegmentRow)


def open_segment(
    tx: Tx, *, turn_id: str, run_id: str, message_id: str, session_id: str
) -> SegmentRow:
    """The turn's segment, created `recording` on its first batch."""
    found = read_segment(tx, turn_id)
    if found is not None:
        return found
    tx.execute(
        _INSERT_SEGMENT,
        {
            "turn_id": turn_id,
            "run_id": run_id,
            "message_id": message_id,
            "session_id": session_id,
            "now": tx.now,
        },
    )
    created = read_segment(tx, turn_id)
    assert created is not None
    return created


def update_segment(tx: Tx, segment_id: int, counts: SegmentCounts) -> None:
    tx.execute(
        _UPDATE_SEGMENT,
        {
            "segment_id": segment_id,
            "event_count": counts.event_count,
            "next_seq": counts.next_seq,
            "gaps": counts.gaps,
            "missing": counts.missing,
            "expected_count": counts.expected_count,
            "conflicts": counts.conflicts,
            "oversized": counts.oversized,
            "status": counts.status,
            "failure": counts.failure,
            "now": tx.now,
        },
    )


def stored_seq(reader: Reader, segment_id: int, seq: int) -> StoredSeq | None:
    """The event stored under this sequence number of the segment, if any."""
    return reader.fetch_one(_SELECT_STORED_SEQ, {"segment_id": segment_id, "seq": seq}, StoredSeq)


def append_session_event(
    tx: Tx, *, run_id: str, segment_id: int, seq: int, event_type: str, payload: str
) -> int:
    """Append one event at the run's next position; returns the position."""
    position = int(tx.fetch_value(_SELECT_NEXT_POSITION, {"run_id": run_id}))
    tx.execute(
        _INSERT_EVENT,
        {
            "run_id": run_id,
            "position": position,
            "segment_id": segment_id,
            "seq": seq,
            "event_type": event_type,
            "payload": payload,
            "now": tx.now,
        },
    )
    return position


def put_session_entry(
    tx: Tx,
    *,
    segment_id: int,
    entry_id: str,
    run_id: str,
    position: int,
    role: str | None,
    content_hash: str | None,
) -> None:
    """Record a finished message's Pi entry (the first report of an entry stays)."""
    tx.execute(
        _INSERT_ENTRY,
        {
            "segment_id": segment_id,
            "entry_id": entry_id,
            "run_id": run_id,
            "position": position,
            "role": role,
            "content_hash": content_hash,
            "now": tx.now,
        },
    )


def last_session_page(reader: Reader, run_id: str) -> SessionPageRow | None:
    return reader.fetch_one(_SELECT_LAST_PAGE, {"run_id": run_id}, SessionPageRow)


def session_page(reader: Reader, run_id: str, page_index: int) -> SessionPageRow | None:
    return reader.fetch_one(
        _SELECT_PAGE, {"run_id": run_id, "page_index": page_index}, SessionPageRow
    )


def session_page_of(reader: Reader, run_id: str, position: int) -> SessionPageRow | None:
    """The page that holds `position` (the last page for a position past the end)."""
    return reader.fetch_one(
        _SELECT_PAGE_OF, {"run_id": run_id, "position": position}, SessionPageRow
    )


def count_session_pages(reader: Reader, run_id: str) -> int:
    return int(reader.fetch_value(_COUNT_PAGES, {"run_id": run_id}))


def insert_session_page(
    tx: Tx,
    *,
    run_id: str,
    page_index: int,
    first_position: int,
    checkpoint: str | None,
    checkpoint_hash: str | None,
) -> None:
    """Open the next page with the checkpoint before its first event (inline or a blob)."""
    tx.execute(
        _INSERT_PAGE,
        {
            "run_id": run_id,
            "page_index": page_index,
            "first_position": first_position,
            "checkpoint": checkpoint,
            "checkpoint_hash": checkpoint_hash,
        },
    )


def grow_session_page(tx: Tx, run_id: str, page_index: int, items: int, byte_count: int) -> None:
    tx.execute(
        _GROW_PAGE,
        {"run_id": run_id, "page_index": page_index, "items": items, "bytes": byte_count},
    )


def session_event_range(
    reader: Reader, run_id: str, first: int, limit: int
) -> list[SessionEventRow]:
    """Up to `limit` events from position `first` on, in position order."""
    return reader.fetch_all(
        _SELECT_EVENT_RANGE, {"run_id": run_id, "first": first, "limit": limit}, SessionEventRow
    )


def count_session_events(reader: Reader, run_id: str) -> int:
    return int(reader.fetch_value(_COUNT_EVENTS, {"run_id": run_id}))


def count_session_segments(reader: Reader, run_id: str) -> int:
    return int(reader.fetch_value(_COUNT_SEGMENTS, {"run_id": run_id}))


def run_segments(reader: Reader, run_id: str, limit: int) -> list[SegmentSummary]:
    """The run's newest `limit` segments, oldest first."""
    rows = reader.fetch_all(
        _SELECT_RUN_SEGMENTS, {"run_id": run_id, "limit": limit}, SegmentSummary
    )
    rows.reverse()
    return rows
