"""The session record in storage: retention keeps a recording capture's tree, deletes
the record with its tree and collects its entry and checkpoint blobs; a turn proved
lost fails its capture (a trigger, whatever path ends the turn).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows.storage import (
    DAY_MS,
    Database,
    ManualClock,
    SegmentCounts,
    append_session_event,
    collect_unreferenced_blobs,
    delete_tree,
    end_turn,
    fail_orphaned_captures,
    insert_session_page,
    open_database,
    open_segment,
    put_json_blob,
    put_session_entry,
    read_segment,
    read_turn,
    tree_blockers,
    update_segment,
    verify,
)
from tests.storage.test_prune import _count, _finished_run

pytestmark = pytest.mark.timeout(60)

SESSION_TABLES = ("session_segments", "session_events", "session_entries", "session_pages")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def db(tmp_path: Path, clock: ManualClock) -> Iterator[Database]:
    database = open_database(tmp_path / "state.sqlite", clock=clock)
    try:
        yield database
    finally:
        database.close()


def _recorded(db: Database, run_id: str, turn_status: str) -> tuple[int, list[str]]:
    """A finished run with one turn whose capture recorded an event, an entry (its
    message a blob) and a page whose checkpoint is a blob; the segment and blobs."""
    with db.write() as tx:
        params = {"now": tx.now, "r": run_id, "d": put_json_blob(tx, {"step": 1})}
        tx.execute(
            "INSERT INTO workflow_messages (message_id, run_id, target_session_id, kind,"
            " reason, source_id, content_digest, session_order, state, created_at,"
            " updated_at) VALUES (:r || '-m', :r, 's-1', 'step', 'initial', 'req', :d,"
            " (SELECT count(*) FROM workflow_messages), 'sent', :now, :now)",
            params,
        )
        tx.execute(
            "INSERT INTO workflow_turns (turn_id, message_id, run_id, session_id, status,"
            " started_at) VALUES (:r || '-t', :r || '-m', :r, 's-1', 'open', :now)",
            params,
        )
        segment = open_segment(
            tx, turn_id=f"{run_id}-t", run_id=run_id, message_id=f"{run_id}-m", session_id="s-1"
        )
        position = append_session_event(
            tx,
            run_id=run_id,
            segment_id=segment.segment_id,
            seq=0,
            event_type="messageEnd",
            payload='{"entryId":"e-1"}',
        )
        entry = put_json_blob(tx, {"role": "assistant", "run": run_id})
        put_session_entry(
            tx,
            segment_id=segment.segment_id,
            entry_id="e-1",
            run_id=run_id,
            position=position,
            role="assistant",
            content_hash=entry,
        )
        checkpoint = put_json_blob(tx, {"messages": [run_id], "open": None, "tools": {}})
        insert_session_page(
            tx,
            run_id=run_id,
            page_index=0,
            first_position=0,
            checkpoint=None,
            checkpoint_hash=checkpoint,
        )
        if turn_status != "open":
            tx.execute(
                "UPDATE workflow_turns SET status = :s, ended_at = :now WHERE run_id = :r",
                params | {"s": turn_status},
            )
    return segment.segment_id, [entry, checkpoint]


def test_a_recording_capture_keeps_its_tree_and_deletion_takes_the_record_and_its_blobs(
    db: Database, clock: ManualClock
) -> None:
    _finished_run(db, "rec", {"r": 1}, failing=False)
    clock.advance(DAY_MS)
    segment_id, blobs = _recorded(db, "rec", "completed")  # a late batch of its last turn
    cutoff = clock.now_ms()
    assert tree_blockers(db, "rec", cutoff) == ["recordingSegment"]
    with db.write() as tx:
        assert delete_tree(tx, "rec", cutoff) is None
        update_segment(
            tx,
            segment_id,
            SegmentCounts(
                event_count=1,
                next_seq=1,
                gaps=0,
                missing=0,
                expected_count=1,
                conflicts=0,
                oversized=0,
                status="complete",
                failure=None,
            ),
        )
    assert tree_blockers(db, "rec", cutoff) == []
    with db.write() as tx:
        deleted = delete_tree(tx, "rec", cutoff)
        assert deleted is not None
        assert set(blobs) <= deleted[1]
        assert collect_unreferenced_blobs(tx, deleted[1]) >= 2
    for table in SESSION_TABLES:
        assert _count(db, table, ["rec"]) == 0, table
    for digest in blobs:
        assert db.fetch_value("SELECT count(*) FROM blobs WHERE digest = :d", {"d": digest}) == 0
    assert verify(db) == []


def test_a_turn_proved_lost_fails_its_recording_capture(db: Database) -> None:
    _finished_run(db, "lost", {"l": 1}, failing=False)
    _recorded(db, "lost", "open")
    with db.write() as tx:
        turn = read_turn(tx, "lost-t")
        assert turn is not None
        end_turn(tx, turn, "lost", None)  # an idle branch report or a newer start
    segment = read_segment(db, "lost-t")
    assert segment is not None
    assert (segment.status, segment.failure) == ("failed", "turnLost")


def test_a_turn_closed_by_its_runs_end_leaves_the_capture_recording(db: Database) -> None:
    """The run's end (or handover) closes its open turns `lost` without ending the Pi
    turn: its capture records on; an idle report of the session then fails it."""
    _finished_run(db, "ended", {"e": 1}, failing=False)
    _recorded(db, "ended", "open")
    with db.write() as tx:
        tx.execute(
            "UPDATE workflow_turns SET status = 'lost', ended_at = :now WHERE run_id = 'ended'",
            {"now": tx.now},
        )
    segment = read_segment(db, "ended-t")
    assert segment is not None and segment.status == "recording"
    with db.write() as tx:
        fail_orphaned_captures(tx, segment.session_id)
    segment = read_segment(db, "ended-t")
    assert segment is not None
    assert (segment.status, segment.failure) == ("failed", "turnLost")
