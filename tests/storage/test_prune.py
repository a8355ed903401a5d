"""State retention in storage: which trees expire, exact-tree deletion, blobs, backups.

Real database files; runs reach their states through the storage transitions a live
server uses. A tree (a root run and every run whose root it is) expires only when every
run of it is terminal and finished before the cutoff, and is deleted only when it holds
no protected state; deleting it removes the rows of every run table and its view
content, and only the blobs no remaining row names.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows.storage import (
    BLOB_REFRESH_MS,
    DAY_MS,
    BackupFailedError,
    Database,
    ManualClock,
    PruneTree,
    RunnerOutcome,
    cancel_run,
    collect_unnamed_blobs,
    collect_unreferenced_blobs,
    compact_state,
    complete_run,
    delete_tree,
    fail_node_attempt,
    finish_node_attempt,
    open_database,
    prunable_tree_page,
    prunable_trees,
    put_blob,
    put_traceback,
    record_interaction_event,
    record_runner_exit,
    record_runner_reply,
    run_list_revision,
    start_node_attempt,
    tree_blockers,
    verify,
    write_backup,
)
from tests.server.test_run_view_rules import _ambiguous_effect
from tests.storage.storage_helpers import enqueue, running

pytestmark = pytest.mark.timeout(60)

TABLES = (
    "runs", "run_queue", "events", "node_attempts", "effects", "run_bindings",
    "runner_epochs", "run_view_content", "host_commands", "interactive_requests",
)  # fmt: skip


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


def _finished_run(db: Database, run_id: str, output: dict[str, object], failing: bool) -> None:
    """A completed run whose last attempt output `output` (a blob); `failing`: after a
    failed attempt whose traceback is stored view content."""
    claim = running(db, run_id)
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id=f"{run_id}-a1", node_path="n", node_type="compute")
    with db.write() as tx:
        if failing:  # a failed attempt with its traceback, then a retry that succeeds
            ref = put_traceback(tx, run_id, f"Traceback of {run_id}\nRuntimeError: boom")
            fail_node_attempt(
                tx, claim, attempt_id=f"{run_id}-a1", error="boom", payload={"traceback": ref}
            )
            start_node_attempt(
                tx, claim, attempt_id=f"{run_id}-a2", node_path="n", node_type="compute"
            )
        last = f"{run_id}-a2" if failing else f"{run_id}-a1"
        finish_node_attempt(tx, claim, attempt_id=last, output=output)
        complete_run(tx, run_id, claim=claim, payload={"output": output})
        record_runner_exit(tx, f"{run_id}-e1", outcome=RunnerOutcome.EXITED, exit_code=0)


def _count(db: Database, table: str, run_ids: list[str]) -> int:
    column = "resource" if table == "leases" else "run_id"
    marks = ",".join("?" * len(run_ids))
    return int(
        db.connection.execute(
            f"SELECT count(*) FROM {table} WHERE {column} IN ({marks})", run_ids
        ).fetchone()[0]
    )


def test_only_whole_terminal_trees_older_than_the_cutoff_expire(
    db: Database, clock: ManualClock
) -> None:
    _finished_run(db, "old", {"v": 1}, failing=False)
    enqueue(db, "old-restart", restart_of="old")
    with db.write() as tx:
        cancel_run(tx, "old-restart")
    _finished_run(db, "busy-root", {"v": 2}, failing=False)
    enqueue(db, "busy-restart", restart_of="busy-root")  # still queued: the tree stays
    clock.advance(10 * DAY_MS)
    _finished_run(db, "recent", {"v": 3}, failing=False)
    trees, kept = prunable_trees(db, clock.now_ms() - 5 * DAY_MS)
    assert [(t.root_run_id, t.run_ids) for t in trees] == [("old", ("old", "old-restart"))]
    assert kept == 0
    everything, _ = prunable_trees(db, clock.now_ms() + 1)
    assert {t.root_run_id for t in everything} == {"old", "recent"}


def test_protected_state_keeps_an_expired_tree(db: Database, clock: ManualClock) -> None:
    """A completed run whose effect is ambiguous and whose runner still cleans up."""
    claim = running(db, "run-1")
    _ambiguous_effect(db, claim)
    with db.write() as tx:
        complete_run(tx, "run-1", claim=claim, payload={"output": {}})
    clock.advance(DAY_MS)
    cutoff = clock.now_ms()
    assert set(tree_blockers(db, "run-1", cutoff)) >= {"unsettledEffect", "activeRunner"}
    trees, kept = prunable_trees(db, cutoff)
    assert trees == [] and kept == 1
    with db.write() as tx:
        assert delete_tree(tx, "run-1", cutoff) is None, "the recheck refuses it too"
    assert _count(db, "runs", ["run-1"]) == 1


def test_deleting_a_tree_removes_every_run_table_and_only_its_own_blobs(
    db: Database, clock: ManualClock
) -> None:
    _finished_run(db, "gone", {"shared": True}, failing=True)
    _finished_run(db, "kept", {"shared": True}, failing=False)  # same output blob
    clock.advance(DAY_MS)
    _finished_run(db, "recent", {"mine": "only"}, failing=False)
    own_blob = "sha256:" + "0" * 64
    with db.write() as tx:
        tx.execute(
            "INSERT INTO blobs (digest, byte_length, content, created_at) VALUES (:d, 1, x'00', 0)",
            {"d": own_blob},
        )
        tx.execute(
            "UPDATE runner_epochs SET diagnostic_hash = :d WHERE run_id = 'gone'", {"d": own_blob}
        )
    blobs_before = db.fetch_value("SELECT count(*) FROM blobs", {})
    assert _count(db, "run_view_content", ["gone"]) == 1, "the traceback is stored content"
    list_before = run_list_revision(db)
    cutoff = clock.now_ms() - 1
    with db.write() as tx:
        deleted = delete_tree(tx, "gone", cutoff)
        assert deleted is not None
        freed = collect_unreferenced_blobs(tx, deleted[1])
    assert deleted[0] == ["gone"]
    for table in TABLES:
        assert _count(db, table, ["gone"]) == 0, table
    assert _count(db, "runs", ["kept", "recent"]) == 2
    assert freed == 1, "the diagnostic only `gone` named; the shared output blob stays"
    assert db.fetch_value("SELECT count(*) FROM blobs", {}) == blobs_before - 1
    assert db.fetch_value("SELECT count(*) FROM blobs WHERE digest = :d", {"d": own_blob}) == 0
    assert run_list_revision(db) > list_before, "deleting runs moves the list revision on"
    assert verify(db) == []


def _blob_exists(db: Database, digest: str) -> bool:
    return bool(db.fetch_value("SELECT count(*) FROM blobs WHERE digest = :d", {"d": digest}))


def test_the_sweep_collects_every_unnamed_blob_past_the_grace_whatever_left_it(
    db: Database, clock: ManualClock
) -> None:
    """Blobs no row names (a refusal of an older release, a crash, an upload whose value
    never came) are collected once older than the grace period; a blob any row names,
    by a referencing column, a digest column without a foreign key or an event payload,
    stays; so does a young one, and an old one written again (its write is refreshed)."""
    _finished_run(db, "run-1", {"kept": "output"}, failing=False)
    with db.write() as tx:
        old = put_blob(tx, b"left behind by a refusal")
        snapshot = put_blob(tx, b'{"nodes":{}}')
        in_event = put_blob(tx, b"an outputRef's value")
        again = put_blob(tx, b"an upload part written again later")
        tx.execute("UPDATE runs SET definition_digest = :d WHERE run_id = 'run-1'", {"d": snapshot})
        record_interaction_event(tx, "run-1", "note", {"outputRef": {"digest": in_event}})
    clock.advance(DAY_MS)
    with db.write() as tx:
        young = put_blob(tx, b"an upload part in flight")
        assert put_blob(tx, b"an upload part written again later") == again
    running(db, "run-2")  # a live runner epoch whose stored reply names a reference
    with db.write() as tx:
        offered = put_blob(tx, b"a result too large for one frame")
        reply = {"resultRef": {"digest": offered, "byteCount": 32}}
        record_runner_reply(tx, "run-2-e1", "m-1", "node.finished", "sha256:fp", reply)
    clock.advance(DAY_MS)
    with db.write() as tx:
        young = put_blob(tx, b"an upload part in flight")
        assert put_blob(tx, b"an upload part written again later") == again
    grace = DAY_MS // 2
    with db.write() as tx:
        freed = collect_unnamed_blobs(tx, tx.now - grace)
    assert freed == 1
    assert not _blob_exists(db, old)
    for digest in (snapshot, in_event, young, again, offered):
        assert _blob_exists(db, digest), digest
    assert grace > BLOB_REFRESH_MS, "a refreshed write is protected by the grace"
    with db.write() as tx:
        record_runner_exit(tx, "run-2-e1", outcome=RunnerOutcome.EXITED, exit_code=0)
    clock.advance(DAY_MS)
    with db.write() as tx:
        freed = collect_unnamed_blobs(tx, tx.now - grace)
    assert freed == 3, "young and again, now old; the ended runner's reference"
    assert not _blob_exists(db, offered)
    assert _blob_exists(db, snapshot) and _blob_exists(db, in_event)
    assert verify(db) == []


def test_a_backup_is_a_verified_private_copy_and_never_replaces_a_file(
    db: Database, tmp_path: Path
) -> None:
    _finished_run(db, "run-1", {"v": 1}, failing=True)
    target = tmp_path / "backups" / "state-backup.sqlite"
    target.parent.mkdir()
    with db.read():
        size = write_backup(db, target).byte_count
    assert size == target.stat().st_size > 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(os.listdir(target.parent)) == ["state-backup.sqlite"], "no partial files"
    copy = sqlite3.connect(target.as_uri() + "?mode=ro", uri=True)
    try:
        assert copy.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert copy.execute("SELECT run_id FROM runs").fetchall() == [("run-1",)]
        assert copy.execute("SELECT count(*) FROM run_view_content").fetchone()[0] == 1
    finally:
        copy.close()
    with pytest.raises(BackupFailedError) as exists:
        write_backup(db, target)
    assert exists.value.code == "backupExists"
    with pytest.raises(BackupFailedError) as relative:
        write_backup(db, Path("relative.sqlite"))
    assert relative.value.code == "backupPathInvalid"
    with pytest.raises(BackupFailedError) as no_folder:
        write_backup(db, tmp_path / "missing" / "b.sqlite")
    assert no_folder.value.code == "backupPathInvalid"


def _delete_expired(db: Database, clock: ManualClock, count: int) -> None:
    """`count` trees, each with its own ~40 KB output, deleted as a sweep deletes them."""
    for i in range(count):
        _finished_run(db, f"big-{i}", {"i": i, "pad": f"{i:04d}" * 10_000}, failing=False)
    clock.advance(DAY_MS)
    trees, _ = prunable_trees(db, clock.now_ms())
    digests: set[str] = set()
    for tree in trees:
        with db.write() as tx:
            deleted = delete_tree(tx, tree.root_run_id, clock.now_ms())
            assert deleted is not None
            digests |= deleted[1]
    with db.write() as tx:
        assert collect_unreferenced_blobs(tx, digests) == count


def _pages(db: Database) -> tuple[int, int]:
    return (
        int(db.fetch_value("PRAGMA page_count", {})),
        int(db.fetch_value("PRAGMA freelist_count", {})),
    )


@pytest.mark.parametrize("fault", ["skipped", "failed"])
def test_free_pages_stay_reusable_when_compaction_is_skipped_or_fails(
    db: Database, clock: ManualClock, fault: str
) -> None:
    """A compaction below its threshold is skipped; a `VACUUM` SQLite refuses (here: a
    statement still in progress on the writer connection) fails. Either way the deletions
    stay committed, and new content reuses the free pages: the file does not grow."""
    _delete_expired(db, clock, 12)
    pages, free = _pages(db)
    assert free / pages >= 0.2, "the deletions freed at least a fifth of the pages"
    if fault == "skipped":
        outcome = compact_state(db, vacuum_min_bytes=1 << 40, vacuum_min_free_ratio=0.2)
        assert (outcome.vacuumed, outcome.skipped) == (False, None)
    else:
        in_progress = db.connection.execute(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 10)"
            " SELECT x FROM c"
        )
        in_progress.fetchone()
        try:
            outcome = compact_state(db, vacuum_min_bytes=0, vacuum_min_free_ratio=0.2)
        finally:
            in_progress.close()
        assert (outcome.vacuumed, outcome.skipped) == (False, "OperationalError")
    assert outcome.reclaimable_bytes > 0
    assert _pages(db) == (pages, free), "nothing of the deletions was undone"
    assert db.fetch_value("SELECT count(*) FROM runs WHERE run_id LIKE 'big-%'", {}) == 0
    with db.write() as tx:
        for i in range(10):
            put_blob(tx, f"new content {i} ".encode() * 2_500)
    assert _pages(db)[0] == pages, "the new blobs went into the free pages"
    assert verify(db) == []


def test_an_idle_compaction_truncates_the_wal_and_vacuums_past_its_thresholds(
    db: Database, clock: ManualClock
) -> None:
    _delete_expired(db, clock, 12)
    pages, _ = _pages(db)
    outcome = compact_state(db, vacuum_min_bytes=0, vacuum_min_free_ratio=0.2)
    assert outcome.vacuumed and outcome.wal_truncated and outcome.skipped is None
    assert _pages(db)[0] < pages and _pages(db)[1] == 0
    assert Path(f"{db.path}-wal").stat().st_size == 0
    running(db, "busy")  # runner work pending: nothing is compacted
    busy = compact_state(db, vacuum_min_bytes=0, vacuum_min_free_ratio=0.0)
    assert (busy.vacuumed, busy.skipped) == (False, "busy")


def test_an_open_turn_and_a_follow_up_of_another_tree_keep_an_expired_tree(
    db: Database, clock: ManualClock
) -> None:
    _finished_run(db, "turned", {"t": 1}, failing=False)
    _finished_run(db, "chained", {"c": 1}, failing=False)
    _finished_run(db, "other", {"o": 1}, failing=False)
    with db.write() as tx:
        digest = put_blob(tx, b"follow-up text")
        params = {"now": tx.now, "d": digest}
        tx.execute(
            "INSERT INTO workflow_messages (message_id, run_id, target_session_id, kind,"
            " source_id, content_digest, session_order, state, created_at, updated_at)"
            " VALUES ('m-1', 'turned', 's-1', 'terminal', 'turned', :d, 1, 'sent', :now, :now)",
            params,
        )
        tx.execute(
            "INSERT INTO workflow_turns (turn_id, message_id, run_id, session_id, status,"
            " started_at) VALUES ('t-1', 'm-1', 'turned', 's-1', 'open', :now)",
            params,
        )
        tx.execute(
            "INSERT INTO follow_ups (follow_up_id, run_id, chain_run_id, target_session_id,"
            " content_hash, state, created_at, updated_at)"
            " VALUES ('f-1', 'other', 'chained', 's-1', :d, 'cancelled', :now, :now)",
            params,
        )
    clock.advance(DAY_MS)
    cutoff = clock.now_ms()
    assert tree_blockers(db, "turned", cutoff) == ["openTurn"]
    assert tree_blockers(db, "chained", cutoff) == ["followUpFromOutside"]
    trees, kept = prunable_trees(db, cutoff)
    assert [t.root_run_id for t in trees] == ["other"] and kept == 2


def test_pages_of_trees_select_together_what_the_whole_selection_does(
    db: Database, clock: ManualClock
) -> None:
    for i in range(7):
        _finished_run(db, f"old-{i}", {"i": i}, failing=i % 3 == 0)
    enqueue(db, "old-3-again", restart_of="old-3")  # unfinished: not expired
    claim = running(db, "old-7")
    _ambiguous_effect(db, claim)  # expired, kept for protected state
    with db.write() as tx:
        complete_run(tx, "old-7", claim=claim, payload={"output": {}})
    clock.advance(DAY_MS)
    _finished_run(db, "recent", {"r": 1}, failing=False)
    cutoff = clock.now_ms() - 1
    whole, whole_kept = prunable_trees(db, cutoff)
    paged: list[PruneTree] = []
    kept, pages = 0, 0
    after: str | None = ""
    while after is not None:
        page = prunable_tree_page(db, cutoff, after=after, limit=3)
        paged.extend(page.trees)
        kept, after, pages = kept + page.kept, page.next_after, pages + 1
    assert pages == 4, "10 root trees, 3 a page"
    assert sorted(paged, key=lambda t: t.root_run_id) == sorted(whole, key=lambda t: t.root_run_id)
    assert {t.root_run_id for t in paged} == {f"old-{i}" for i in (0, 1, 2, 4, 5, 6)}
    assert kept == whole_kept == 1
