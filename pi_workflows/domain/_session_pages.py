"""Session-event pages and the run view's session record (client-protocol.md § Run and
session views): a page is one stored page of a run's session events with the replay
checkpoint before its first item, inline or as a content reference; the run view shows
each recording segment's capture status and integrity findings, never recorded content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from pi_workflows.domain._view_content import ViewRequestError, stored_ref
from pi_workflows.storage import (
    VIEW_JSON_MEDIA_TYPE,
    Reader,
    SegmentCounts,
    SegmentSummary,
    SessionEventRow,
    SessionPageRow,
    count_session_events,
    count_session_pages,
    count_session_segments,
    last_session_page,
    read_json_blob,
    run_segments,
    session_event_range,
    session_page_of,
)
from pi_workflows.wire.session_fold import empty_state

__all__ = [
    "SEGMENTS_SHOWN",
    "SESSION_LIST",
    "event_item",
    "page_checkpoint",
    "segment_view",
    "session_events_page",
    "session_record_view",
]

SESSION_LIST: Final = "sessionEvents"
SEGMENTS_SHOWN: Final = 64
"""The most recording segments the run view lists (the newest; the count says all)."""
_CURSOR = re.compile(r"^sessionEvents([<>])([0-9]{1,15})$")


def segment_view(counts: SegmentCounts | SegmentSummary) -> dict[str, Any]:
    """A segment's capture status and integrity findings (no recorded content)."""
    view: dict[str, Any] = {
        "status": counts.status,
        "eventCount": counts.event_count,
        "nextSeq": counts.next_seq,
    }
    if counts.failure is not None:
        view["failure"] = counts.failure
    findings: list[dict[str, Any]] = []
    if counts.missing or counts.gaps:
        findings.append({"code": "sequenceGap", "gaps": counts.gaps, "missing": counts.missing})
    if counts.expected_count is not None and counts.expected_count != counts.event_count:
        findings.append(
            {
                "code": "countMismatch",
                "expected": counts.expected_count,
                "recorded": counts.event_count,
            }
        )
    if counts.conflicts:
        findings.append({"code": "conflictingResend", "count": counts.conflicts})
    if counts.oversized:
        findings.append({"code": "eventTooLarge", "count": counts.oversized})
    if counts.failure is not None:
        findings.append({"code": "captureFailed", "reason": counts.failure})
    view["findings"] = findings
    return view


def event_item(row: SessionEventRow) -> dict[str, Any]:
    """One page item: the event's fields with its position, turn, seq and type; a
    finished message Pi saved names its verbatim entry (`entryContent`, read with
    `view.content`: settled messages show it instead of their folded deltas)."""
    item: dict[str, Any] = json.loads(row.payload)
    item.update(
        {
            "position": row.position,
            "turnId": row.turn_id,
            "seq": row.seq,
            "type": row.event_type,
            "recordedAt": row.recorded_at,
        }
    )
    if row.entry_hash is not None and row.entry_bytes is not None:
        item["entryContent"] = {
            "marker": "server",
            "digest": row.entry_hash,
            "mediaType": VIEW_JSON_MEDIA_TYPE,
            "byteCount": row.entry_bytes,
        }
    return item


def page_checkpoint(reader: Reader, page: SessionPageRow) -> dict[str, Any]:
    """The folded state before the page's first event.

    Raises:
        ContentUnavailableError: a large checkpoint's blob is missing or damaged.
    """
    if page.checkpoint is not None:
        state: dict[str, Any] = json.loads(page.checkpoint)
        return state
    assert page.checkpoint_hash is not None
    loaded: dict[str, Any] = read_json_blob(reader, page.checkpoint_hash)
    return loaded


def session_record_view(reader: Reader, run_id: str) -> dict[str, Any] | None:
    """The run view's `sessionRecord`: each recording segment (the newest
    `SEGMENTS_SHOWN`) with its turn, message, step node, capture status and findings;
    None for a run with no recorded turn."""
    segments = count_session_segments(reader, run_id)
    if segments == 0:
        return None
    shown = []
    for row in run_segments(reader, run_id, SEGMENTS_SHOWN):
        item: dict[str, Any] = {
            "turnId": row.turn_id,
            "messageId": row.message_id,
            "kind": row.message_kind,
        }
        if row.node_path is not None:
            item["node"] = row.node_path
        if row.first_position is not None:
            item["firstPosition"] = row.first_position
        item |= {"startedAt": row.started_at, "updatedAt": row.updated_at}
        item |= segment_view(row)
        shown.append(item)
    return {
        "segmentCount": segments,
        "eventCount": count_session_events(reader, run_id),
        "pageCount": count_session_pages(reader, run_id),
        "segments": shown,
    }


def _selected(reader: Reader, run_id: str, payload: Mapping[str, Any]) -> SessionPageRow | None:
    cursor, position = payload.get("cursor"), payload.get("position")
    if cursor is not None and position is not None:
        raise ViewRequestError("rejected", "invalidCursor", "give a cursor or a position, not both")
    if position is not None:
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ViewRequestError(
                "rejected", "invalidPosition", "payload.position is an event position >= 0"
            )
        return session_page_of(reader, run_id, position)
    if cursor is None:
        return last_session_page(reader, run_id)
    match = _CURSOR.match(cursor) if isinstance(cursor, str) else None
    if match is None:
        raise ViewRequestError(
            "rejected", "invalidCursor", "not a sessionEvents cursor of this server's run views"
        )
    at = int(match.group(2))
    return session_page_of(reader, run_id, max(0, at - 1) if match.group(1) == "<" else at)


def session_events_page(reader: Reader, run_id: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The page fields of one session-event page (`view.page` with list sessionEvents):
    the stored page holding the cursor's or position's event (the newest page when
    neither is given), its items and the checkpoint before its first item."""
    page = _selected(reader, run_id, payload)
    count = count_session_events(reader, run_id)
    if page is None:
        return {
            "items": [],
            "count": count,
            "first": 0,
            "checkpoint": {"position": 0, "state": empty_state()},
        }
    rows = session_event_range(reader, run_id, page.first_position, page.item_count)
    fields: dict[str, Any] = {
        "items": [event_item(row) for row in rows],
        "count": count,
        "first": page.first_position,
        "checkpoint": _checkpoint(reader, run_id, page),
    }
    end = page.first_position + len(rows)
    if page.first_position > 0:
        fields["nextCursor"] = f"{SESSION_LIST}<{page.first_position}"
    if end < count:
        fields["previousCursor"] = f"{SESSION_LIST}>{end}"
    return fields


def _checkpoint(reader: Reader, run_id: str, page: SessionPageRow) -> dict[str, Any]:
    shown: dict[str, Any] = {"position": page.first_position}
    if page.checkpoint is not None:
        shown["state"] = json.loads(page.checkpoint)
        return shown
    assert page.checkpoint_hash is not None
    ref = stored_ref(reader, run_id, page.checkpoint_hash, VIEW_JSON_MEDIA_TYPE)
    if ref is None:
        shown["unavailable"] = "notStored"
    else:
        shown["stateContent"] = ref
    return shown
