"""Opening the database: pragmas, permissions, the schema record and digest refusal."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows.storage import (
    DDL_DIGEST,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    Database,
    ManualClock,
    SchemaMismatchError,
    acquire_claim,
    get_run,
    open_database,
    open_readonly,
    state_db_path,
    verify,
    workflows_dir,
)
from tests.storage.storage_helpers import enqueue

STORAGE_DIR = Path(__file__).resolve().parents[2] / "pi_workflows" / "storage"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_pragmas_are_set(db: Database) -> None:
    conn = db.connection
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA temp_store").fetchone()[0] == 2  # MEMORY: no temp files
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    assert conn.isolation_level is None  # driver autocommit; write() issues BEGIN


def test_schema_record_names_schema_version_and_digest(db: Database, clock: ManualClock) -> None:
    row = db.connection.execute(
        "SELECT schema_name, schema_version, ddl_digest, created_at FROM schema_info"
    ).fetchone()
    assert row == (SCHEMA_NAME, SCHEMA_VERSION, DDL_DIGEST, clock.now_ms())


def test_folders_are_0700_and_files_0600(tmp_path: Path, loose_umask: None) -> None:
    path = tmp_path / "a" / "b" / "state.sqlite"
    db = open_database(path, clock=ManualClock())
    enqueue(db)
    try:
        for folder in (tmp_path / "a", tmp_path / "a" / "b"):
            assert folder.stat().st_mode & 0o777 == 0o700
        for name in ("state.sqlite", "state.sqlite-wal", "state.sqlite-shm"):
            assert (path.parent / name).stat().st_mode & 0o777 == 0o600, name
    finally:
        db.close()


def test_existing_database_file_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    open_database(path, clock=ManualClock()).close()
    path.chmod(0o644)
    open_database(path, clock=ManualClock()).close()
    assert path.stat().st_mode & 0o777 == 0o600


def test_existing_folder_keeps_its_mode(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    open_database(tmp_path / "state.sqlite", clock=ManualClock()).close()
    assert tmp_path.stat().st_mode & 0o777 == 0o755


def test_default_path_honours_pi_coding_agent_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "agent"))
    assert workflows_dir() == tmp_path / "agent" / "workflows"
    assert state_db_path() == tmp_path / "agent" / "workflows" / "state.sqlite"
    open_database(clock=ManualClock()).close()
    assert state_db_path().is_file()
    monkeypatch.delenv("PI_CODING_AGENT_DIR")
    assert state_db_path() == Path.home() / ".pi" / "agent" / "workflows" / "state.sqlite"


def test_reopening_keeps_the_data(db_path: Path, clock: ManualClock) -> None:
    db = open_database(db_path, clock=clock)
    enqueue(db)
    db.close()
    again = open_database(db_path, clock=clock)
    try:
        assert again.fetch_value("SELECT count(*) FROM runs", {}) == 1
    finally:
        again.close()


def _old_digest_database(path: Path) -> None:
    """A database this package created, then "an older release" with another digest."""
    db = open_database(path, clock=ManualClock())
    enqueue(db)
    db.connection.execute("UPDATE schema_info SET ddl_digest = 'sha256:older'")
    db.close()


def _foreign_database(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('hello')")
    conn.commit()
    conn.close()


def _not_sqlite(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not a database at all\n" * 100)


def _old_version(path: Path) -> None:
    db = open_database(path, clock=ManualClock())
    db.connection.execute("UPDATE schema_info SET schema_version = 0")
    db.close()


@pytest.mark.parametrize(
    ("make", "found"),
    [
        (_old_digest_database, "sha256:older"),
        (_foreign_database, "no schema_info table"),
        (_not_sqlite, "not a readable SQLite database"),
        (_old_version, "version 0"),
    ],
)
def test_mismatching_database_fails_before_any_write(tmp_path: Path, make: Any, found: str) -> None:
    path = tmp_path / "workflows" / "state.sqlite"
    make(path)
    files = sorted(p.name for p in path.parent.iterdir())
    before = sha(path)
    with pytest.raises(SchemaMismatchError) as caught:
        open_database(path, clock=ManualClock())
    assert sha(path) == before
    assert sorted(p.name for p in path.parent.iterdir()) == files
    message = str(caught.value)
    assert found in message
    assert DDL_DIGEST in message
    assert "left unchanged" in message
    assert "back the file up" in message and ".bak" in message
    assert "start the server again" in message


def test_empty_file_is_initialized(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    path.touch()
    open_database(path, clock=ManualClock()).close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT ddl_digest FROM schema_info").fetchone()[0] == DDL_DIGEST
    conn.close()


def test_write_commits_or_rolls_back_whole(db: Database) -> None:
    with pytest.raises(RuntimeError, match="boom"), db.write() as tx:
        tx.execute(
            "INSERT INTO blobs (digest, byte_length, content, created_at) VALUES ('d', 0, x'', 1)"
        )
        raise RuntimeError("boom")
    assert db.fetch_value("SELECT count(*) FROM blobs", {}) == 0
    assert not db.connection.in_transaction
    with db.write() as tx:
        tx.execute(
            "INSERT INTO blobs (digest, byte_length, content, created_at) VALUES ('d', 0, x'', 1)"
        )
    assert db.fetch_value("SELECT count(*) FROM blobs", {}) == 1


def test_a_failing_commit_keeps_the_original_error(db: Database) -> None:
    # A deferred foreign key fails at COMMIT: the IntegrityError surfaces, nothing stays.
    with pytest.raises(sqlite3.IntegrityError), db.write() as tx:
        enqueue_stmt = (
            "INSERT INTO runs (run_id, workflow_name, project_path, source_identity,"
            " definition_digest, input_hash, input, status, revision, root_run_id,"
            " created_at, updated_at) VALUES ('r', 'w', '/', '{}', 'd', 'h', '{}', 'queued', 1,"
            " 'missing-root', 1, 1)"
        )
        tx.execute(enqueue_stmt)
    assert not db.connection.in_transaction
    assert db.fetch_value("SELECT count(*) FROM runs", {}) == 0


def test_writes_do_not_nest_and_a_finished_tx_is_dead(db: Database) -> None:
    with db.write() as tx:
        with pytest.raises(RuntimeError, match="does not nest"), db.write():
            pass
        tx.execute("SELECT 1")
    with pytest.raises(RuntimeError, match="has ended"):
        tx.execute("SELECT 1")
    with db.write():
        pass


def test_tx_now_is_the_clock_at_begin(db: Database, clock: ManualClock) -> None:
    with db.write() as tx:
        start = tx.now
        clock.advance(500)
        assert tx.now == start
    with db.write() as tx:
        assert tx.now == start + 500


def test_tracer_sees_every_statement_after_it_runs_and_never_a_token_hash(
    db_path: Path, clock: ManualClock
) -> None:
    traced: list[tuple[str, Any]] = []
    db = open_database(
        db_path, clock=clock, tracer=lambda sql, params: traced.append((sql, params))
    )
    enqueue(db)
    traced.clear()
    with db.write() as tx:
        claim = acquire_claim(tx, "run-1", owner_type="host", owner_id="srv")
    db.close()
    statements = [sql.strip().split()[0] for sql, _ in traced]
    assert statements[0] == "BEGIN" and statements[-1] == "COMMIT"
    flat = repr(traced)
    assert claim.token not in flat
    assert claim.token_hash not in flat
    assert "<redacted>" in flat


def test_readonly_open_of_a_backup_cannot_write(db: Database, tmp_path: Path) -> None:
    enqueue(db)
    backup = tmp_path / "backup.sqlite"
    db.connection.execute("VACUUM INTO ?", (str(backup),))
    before = sha(backup)
    ro = open_readonly(backup)
    try:
        assert ro.fetch_value("SELECT count(*) FROM runs", {}) == 1
        with pytest.raises(RuntimeError, match="read-only"), ro.write():
            pass
        with pytest.raises(sqlite3.OperationalError):
            ro.connection.execute("DELETE FROM runs")
        assert ro.connection.execute("PRAGMA query_only").fetchone()[0] == 1
    finally:
        ro.close()
    assert sha(backup) == before


def test_readonly_open_of_a_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_readonly(tmp_path / "nope.sqlite")
    assert not (tmp_path / "nope.sqlite").exists()


def test_storage_logic_reads_time_only_through_the_clock() -> None:
    offenders = []
    for source in sorted(STORAGE_DIR.glob("*.py")):
        if source.name == "_clock.py":
            continue
        text = source.read_text()
        if re.search(r"\btime\.(time|monotonic|time_ns|monotonic_ns)\(|import time\b", text):
            offenders.append(source.name)
    assert offenders == []


def test_copy_of_live_database_opens(db: Database, tmp_path: Path) -> None:
    enqueue(db)
    copy = tmp_path / "copy" / "state.sqlite"
    copy.parent.mkdir()
    db.connection.execute("VACUUM INTO ?", (str(copy),))
    shutil.copymode(db.path, copy)
    other = open_database(copy, clock=ManualClock())
    try:
        run = get_run(other, "run-1")
        assert run is not None and run.status == "queued"
        assert verify(other) == []
    finally:
        other.close()


def test_a_passive_checkpoint_copies_the_wal_between_transactions(
    db: Database, db_path: Path
) -> None:
    for index in range(40):
        enqueue(db, f"run-{index}")
    wal = db_path.with_name(db_path.name + "-wal")
    with db.write():
        assert not db.checkpoint_wal(), "never inside a transaction"
    assert db.checkpoint_wal(), "every frame copied: no reader holds an old snapshot"
    size = wal.stat().st_size
    enqueue(db, "after")  # a fully copied WAL is written again from its start
    assert wal.stat().st_size <= size, "the WAL did not grow: it restarted"
    assert get_run(db, "after") is not None and verify(db) == []
