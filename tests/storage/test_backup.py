"""The verified backup (`storage/_backup.py`): stepped, reported, checked before it is named.

A copy is made in steps with monotonic progress, then checked read-only (integrity check,
tables, schema record and DDL digest); a copy that fails the check is never named, and no
private partial file is left behind.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pi_workflows.storage import (
    BackupFailedError,
    BackupProgress,
    Database,
    put_blob,
    verify_copy,
    write_backup,
)

pytestmark = pytest.mark.timeout(30)


def test_a_backup_reports_each_step_then_its_check(db: Database, tmp_path: Path) -> None:
    with db.write() as tx:
        for n in range(8):
            put_blob(tx, os.urandom(64 * 1024) + bytes([n]))
    seen: list[BackupProgress] = []
    target = tmp_path / "b.sqlite"
    with db.read():
        copy = write_backup(db, target, on_progress=seen.append, step_pages=16)
    copies = [p for p in seen if p.stage == "copy"]
    assert len(copies) > 1, "several steps"
    assert [p.done for p in copies] == sorted(p.done for p in copies)
    assert copies[-1].done == copies[-1].total == copy.page_count
    assert [(p.stage, p.done, p.total) for p in seen[len(copies) :]] == [
        ("verify", 0, 1),
        ("verify", 1, 1),
    ]
    assert copy.byte_count == target.stat().st_size
    assert verify_copy(target) == []


def test_a_copy_that_fails_its_check_is_never_named(db: Database, tmp_path: Path) -> None:
    with db.write() as tx:  # another schema digest: a copy of this is not a usable backup
        tx.execute("UPDATE schema_info SET ddl_digest = 'sha256:' || hex(randomblob(32))")
    target = tmp_path / "b.sqlite"
    with db.read(), pytest.raises(BackupFailedError) as refused:
        write_backup(db, target)
    assert refused.value.code == "backupUnverified"
    assert "schema_mismatch" in str(refused.value) and str(tmp_path) not in str(refused.value)
    assert list(tmp_path.iterdir()) == [tmp_path / "agent"], "nothing named, no partial file"
