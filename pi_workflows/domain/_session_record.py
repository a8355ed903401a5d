"""`sessionEvents.record` (workflow-server.md § Interactive requests; client-protocol.md §
Origin-session activity): a turn's session events in batches, from the connection holding
the session's coordinator epoch. Idempotent per (session, turn, seq); a gap, a count
mismatch or a conflicting resend is a finding on the segment, never an error. Pages are
cut as events are stored, each with the checkpoint before its first event.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from pi_workflows.domain._epochs import ActiveEpochs
from pi_workflows.domain._operations import OperationError, rejected, response
from pi_workflows.domain._origin_reports import MAX_ID_CHARS, _opaque_id, _required_id
from pi_workflows.domain._session_pages import event_item, page_checkpoint, segment_view
from pi_workflows.storage import (
    SESSION_EVENT_BYTES,
    VIEW_INLINE_BYTES,
    Database,
    SegmentCounts,
    SegmentRow,
    SessionPageRow,
    Tx,
    append_session_event,
    grow_session_page,
    insert_session_page,
    last_session_page,
    open_segment,
    put_json_blob,
    put_session_entry,
    read_turn,
    session_event_range,
    store_view_blob,
    stored_seq,
    update_segment,
)
from pi_workflows.wire.canonical import NotSerializableError, dumps
from pi_workflows.wire.protocol import RequestMessage
from pi_workflows.wire.session_fold import EVENT_TYPES, checkpoint, empty_state, fold

__all__ = [
    "MAX_BATCH_EVENTS",
    "PAGE_EVENTS",
    "SESSION_PAGE_BYTES",
    "record_session_events",
]

MAX_BATCH_EVENTS: Final = 512
"""The most events one batch carries (the frame limit bounds its bytes)."""
PAGE_EVENTS: Final = 256
"""The most events one session-event page holds (the design's page size)."""
SESSION_PAGE_BYTES: Final = 512 * 1024
"""The most encoded item bytes one page holds; with its inline checkpoint (at most the
16 KiB inline threshold, else a reference) a page response stays far below 1 MiB."""
ITEM_OVERHEAD: Final = 160
"""Bytes a page item adds to its stored payload (position, seq, type, turn, time)."""
_MAX_SEQ: Final = 2**53 - 1
_FAILURE_CODE_CHARS: Final = 64
_ID_FIELDS: Final = ("toolCallId", "entryId", "name", "role", "contentIndex", "stopReason")


@dataclass(frozen=True, slots=True)
class _Event:
    seq: int
    event_type: str
    payload: str
    """Canonical JSON of the event's fields but `seq`, `type` and `message`."""
    message: Any = None
    """A `messageEnd`'s verbatim Pi message, stored as the entry's content."""
    oversized: bool = False


@dataclass(frozen=True, slots=True)
class _Final:
    count: int
    failure: str | None


@dataclass(frozen=True, slots=True)
class _Batch:
    session_id: str
    turn_id: str
    message_id: str
    run_id: str
    events: list[_Event]
    final: _Final | None


def _seq(raw: Mapping[str, Any]) -> int:
    seq = raw.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= _MAX_SEQ:
        raise OperationError("rejected", "seqInvalid", "each event has an integer seq >= 0")
    return seq


def _event(raw: object) -> _Event:
    if not isinstance(raw, Mapping):
        raise OperationError("rejected", "eventInvalid", "an event is an object")
    seq = _seq(raw)
    kind = raw.get("type")
    if kind not in EVENT_TYPES:
        raise OperationError(
            "rejected", "eventTypeInvalid", f"event {seq} has no known session event type"
        )
    fields = {k: v for k, v in raw.items() if k not in ("seq", "type", "message")}
    message = raw.get("message") if kind == "messageEnd" else None
    try:
        payload = dumps(fields)
    except NotSerializableError:
        raise OperationError(
            "rejected", "eventInvalid", f"event {seq} is not canonical JSON"
        ) from None
    if len(payload) <= SESSION_EVENT_BYTES - 256:
        return _Event(seq, str(kind), payload.decode("utf-8"), message)
    # Too large to keep whole: its identifying fields stay, its content is counted.
    kept = {k: fields[k] for k in _ID_FIELDS if k in fields and _small(fields[k])}
    kept |= {"omitted": True, "byteCount": len(payload)}
    return _Event(seq, str(kind), dumps(kept).decode("utf-8"), message, oversized=True)


def _small(value: object) -> bool:
    return not isinstance(value, str) or len(value) <= MAX_ID_CHARS


def _final(raw: object) -> _Final | None:
    if raw is None:
        return None
    count = raw.get("count") if isinstance(raw, Mapping) else None
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= _MAX_SEQ:
        raise OperationError(
            "rejected", "finalInvalid", "final is {count, failure?}: count is an integer >= 0"
        )
    assert isinstance(raw, Mapping)
    failure = raw.get("failure")
    if failure is not None and not (
        isinstance(failure, str)
        and 0 < len(failure) <= _FAILURE_CODE_CHARS
        and failure.isascii()
        and failure.isalnum()
    ):
        raise OperationError("rejected", "finalInvalid", "final.failure is a short code")
    return _Final(count, failure)


def _batch(request: RequestMessage) -> _Batch:
    payload = request["payload"]
    run_id = request.get("runId")
    if not _opaque_id(run_id):
        raise OperationError("rejected", "runIdRequired", "a session-event batch names its runId")
    raw = payload.get("events")
    if not isinstance(raw, list) or len(raw) > MAX_BATCH_EVENTS:
        raise OperationError(
            "rejected", "eventsInvalid", f"events must be a list of at most {MAX_BATCH_EVENTS}"
        )
    events = [_event(item) for item in raw]
    seqs = [event.seq for event in events]
    if seqs != sorted(set(seqs)):
        raise OperationError(
            "rejected", "seqInvalid", "a batch lists its seqs ascending, once each"
        )
    return _Batch(
        _required_id(payload, "sessionId"),
        _required_id(payload, "turnId"),
        _required_id(payload, "messageId"),
        str(run_id),
        events,
        _final(payload.get("final")),
    )


def record_session_events(
    db: Database, request: RequestMessage, *, connection_id: str, epochs: ActiveEpochs
) -> dict[str, Any]:
    """Store one batch of a turn's session events in one transaction; the receipt
    counts what was stored and what was already there, and shows the segment."""
    try:
        batch = _batch(request)
    except OperationError as exc:
        return rejected(request, exc.outcome, exc.code, str(exc))
    if not epochs.holds(batch.session_id, connection_id):
        return rejected(
            request,
            "claimLost",
            "coordinatorFenced",
            "this connection does not hold the session's active coordinator epoch",
        )
    try:
        with db.write() as tx:
            receipt = _record(tx, batch)
    except OperationError as exc:
        return rejected(request, exc.outcome, exc.code, str(exc))
    return response(request, "accepted", receipt=receipt)


def _record(tx: Tx, batch: _Batch) -> dict[str, Any]:
    turn = read_turn(tx, batch.turn_id)
    if turn is None or (turn.message_id, turn.run_id, turn.session_id) != (
        batch.message_id,
        batch.run_id,
        batch.session_id,
    ):
        raise OperationError(
            "notFound", "turnNotFound", "no workflow turn of this message, run and session"
        )
    segment = open_segment(
        tx,
        turn_id=turn.turn_id,
        run_id=turn.run_id,
        message_id=turn.message_id,
        session_id=turn.session_id,
    )
    counts = _counts(segment)
    stored = duplicates = 0
    pages = _Pages(tx, turn.run_id)
    for event in batch.events:
        existing = stored_seq(tx, segment.segment_id, event.seq)
        if existing is not None:
            duplicates += 1
            if (existing.event_type, existing.payload) != (event.event_type, event.payload):
                counts = replace(counts, conflicts=counts.conflicts + 1)
            continue
        counts = _sequence(counts, event)
        position = append_session_event(
            tx,
            run_id=turn.run_id,
            segment_id=segment.segment_id,
            seq=event.seq,
            event_type=event.event_type,
            payload=event.payload,
        )
        pages.add(position, len(event.payload) + ITEM_OVERHEAD)
        if event.event_type == "messageEnd":
            _entry(tx, segment, event, position)
        stored += 1
    if batch.final is not None:
        counts = _finish(counts, batch.final)
    update_segment(tx, segment.segment_id, counts)
    return {
        "version": 1,
        "turnId": turn.turn_id,
        "stored": stored,
        "duplicates": duplicates,
        "segment": segment_view(counts),
    }


def _counts(segment: SegmentRow) -> SegmentCounts:
    return SegmentCounts(
        event_count=segment.event_count,
        next_seq=segment.next_seq,
        gaps=segment.gaps,
        missing=segment.missing,
        expected_count=segment.expected_count,
        conflicts=segment.conflicts,
        oversized=segment.oversized,
        status=segment.status,
        failure=segment.failure,
    )


def _sequence(counts: SegmentCounts, event: _Event) -> SegmentCounts:
    """One new event: a jump past the next seq opens a gap; a seq below it fills one."""
    gaps, missing = counts.gaps, counts.missing
    if event.seq > counts.next_seq:
        gaps += 1
        missing += event.seq - counts.next_seq
    elif event.seq < counts.next_seq:
        missing = max(0, missing - 1)
    return replace(
        counts,
        event_count=counts.event_count + 1,
        next_seq=max(counts.next_seq, event.seq + 1),
        gaps=gaps,
        missing=missing,
        oversized=counts.oversized + int(event.oversized),
    )


def _finish(counts: SegmentCounts, final: _Final) -> SegmentCounts:
    """The extension ended its capture: `complete`, or `failed` with its code; a failed
    capture (a proved-lost turn) stays failed."""
    if counts.status == "failed":
        return replace(counts, expected_count=final.count)
    if final.failure is not None:
        return replace(counts, expected_count=final.count, status="failed", failure=final.failure)
    return replace(counts, expected_count=final.count, status="complete")


def _entry(tx: Tx, segment: SegmentRow, event: _Event, position: int) -> None:
    fields = json.loads(event.payload)
    entry_id = fields.get("entryId")
    if not _opaque_id(entry_id):
        return  # a message Pi did not save (aborted before its entry): no entry
    content_hash = None
    if event.message is not None:
        try:
            content_hash = put_json_blob(tx, event.message)
        except NotSerializableError:
            raise OperationError(
                "rejected", "eventInvalid", f"event {event.seq} has a message that is not JSON"
            ) from None
    role = fields.get("role")
    put_session_entry(
        tx,
        segment_id=segment.segment_id,
        entry_id=str(entry_id),
        run_id=segment.run_id,
        position=position,
        role=role if isinstance(role, str) and len(role) <= 64 else None,
        content_hash=content_hash,
    )


# --- pages and checkpoints -------------------------------------------------------------


class _Pages:
    """The run's last page as this batch appends to it: a full page is closed with the
    checkpoint of everything before the next, which opens at the new event."""

    def __init__(self, tx: Tx, run_id: str) -> None:
        self._tx = tx
        self._run_id = run_id
        self._page: SessionPageRow | None = last_session_page(tx, run_id)

    def add(self, position: int, size: int) -> None:
        page = self._page
        if page is None:
            page = self._open(0, position, empty_state())
        elif page.item_count >= PAGE_EVENTS or (
            page.item_count > 0 and page.byte_count + size > SESSION_PAGE_BYTES
        ):
            events = session_event_range(
                self._tx, self._run_id, page.first_position, page.item_count
            )
            state = checkpoint(
                fold(page_checkpoint(self._tx, page), [event_item(e) for e in events])
            )
            page = self._open(page.page_index + 1, position, state)
        grow_session_page(self._tx, self._run_id, page.page_index, 1, size)
        self._page = replace(
            page, item_count=page.item_count + 1, byte_count=page.byte_count + size
        )

    def _open(self, index: int, first: int, state: dict[str, Any]) -> SessionPageRow:
        data = dumps(state)
        inline, digest = None, None
        if len(data) <= VIEW_INLINE_BYTES:
            inline = data.decode("utf-8")
        else:  # a large checkpoint is content: a page names it by reference
            digest = put_json_blob(self._tx, state)
            store_view_blob(self._tx, self._run_id, digest)
        insert_session_page(
            self._tx,
            run_id=self._run_id,
            page_index=index,
            first_position=first,
            checkpoint=inline,
            checkpoint_hash=digest,
        )
        return SessionPageRow(self._run_id, index, first, 0, 0, inline, digest)
