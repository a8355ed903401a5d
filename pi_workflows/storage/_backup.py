"""The verified backup of the live database (`state backup`, and `state prune --apply`
first): SQLite's online backup API in steps into a private file beside the destination,
checked read-only (integrity check, schema record and DDL digest), then linked to its
new name. Internal; `pi_workflows.storage` exports the names.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.storage._db import Reader
from pi_workflows.storage._verify import verify_copy
from pi_workflows.supervision import crash_point

__all__ = [
    "BACKUP_STEP_PAGES",
    "BackupCopy",
    "BackupFailedError",
    "BackupProgress",
    "check_backup_path",
    "write_backup",
]

BACKUP_STEP_PAGES: Final = 1024
"""Pages copied per backup step (4 MiB of 4 KiB pages): progress is reported and a
crash point is reached between steps; the driver releases the GIL inside each step."""


class BackupFailedError(PiWorkflowsError):
    """The backup could not be written or did not verify; nothing was deleted.

    `code` is a safe error code; the message names no path.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class BackupProgress:
    """Where a backup is: `stage` is `copy` (pages done of total) or `verify`."""

    stage: str
    done: int
    total: int


@dataclass(frozen=True, slots=True)
class BackupCopy:
    """A backup written and verified: its size and page count."""

    byte_count: int
    page_count: int


ProgressSink = Callable[[BackupProgress], None]


def check_backup_path(path: Path) -> None:
    """Refuse a destination that is not an absolute path to a new file in an existing
    folder, one clear error each (`BackupFailedError`; the message names no path)."""
    if not path.is_absolute():
        raise BackupFailedError("backupPathInvalid", "the backup path must be absolute")
    if os.path.lexists(path):
        raise BackupFailedError("backupExists", "the backup path exists; name a new file")
    if not path.parent.is_dir():
        raise BackupFailedError("backupPathInvalid", "the backup folder does not exist")


def write_backup(
    reader: Reader,
    path: Path,
    *,
    on_progress: ProgressSink | None = None,
    step_pages: int = BACKUP_STEP_PAGES,
) -> BackupCopy:
    """Write a verified copy of the database's current snapshot to the new file `path`.

    Copies with SQLite's online backup API from `reader`, `step_pages` pages a step
    (call it inside one read transaction: the copy is that snapshot, and a commit by
    the writer between steps cannot restart it, because the source connection keeps
    seeing its snapshot), into a private (0600) temporary file beside `path`; switches
    the copy to a rollback journal (so opening it read-only needs no `-wal` or `-shm`
    file), syncs it, checks it read-only (`verify_copy`: integrity check, every table,
    schema record and DDL digest), and only then links it to `path`,
    which must not exist. A crash at any point leaves at most a `.partial` file, never
    an unverified file under the new name.

    Raises:
        BackupFailedError: `path` is refused (`check_backup_path`), a write failed, or
            the copy did not verify; the temporary file is removed.
    """
    check_backup_path(path)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    try:
        pages = _copy(reader, partial, on_progress, step_pages)
        crash_point("server.backup.verify")
        if on_progress is not None:
            on_progress(BackupProgress("verify", 0, 1))
        findings = verify_copy(partial)
        if findings:
            raise BackupFailedError(
                "backupUnverified",
                f"the backup did not verify ({len(findings)} findings, first"
                f" {findings[0].code.value})",
            )
        os.link(partial, path)  # never replaces a file that appeared meanwhile
        _sync_folder(path.parent)
        crash_point("server.backup.linked")
        if on_progress is not None:
            on_progress(BackupProgress("verify", 1, 1))
        return BackupCopy(path.stat().st_size, pages)
    except FileExistsError:
        raise BackupFailedError("backupExists", "the backup path exists; name a new file") from None
    except (OSError, sqlite3.Error) as exc:
        raise BackupFailedError(
            "backupFailed", f"the backup could not be written ({type(exc).__name__})"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            partial.unlink()
        for suffix in ("-journal", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                Path(f"{partial}{suffix}").unlink()


def _copy(reader: Reader, target: Path, on_progress: ProgressSink | None, step_pages: int) -> int:
    """Copy in steps; returns the page count. Reaches `server.backup.copy` after each
    step, with the copy not yet complete, synced or verified."""
    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    copy = sqlite3.connect(target, isolation_level=None)
    total = 0

    def step(status: int, remaining: int, pages: int) -> None:
        nonlocal total
        total = pages
        crash_point("server.backup.copy")
        if on_progress is not None:
            on_progress(BackupProgress("copy", pages - remaining, pages))

    try:
        reader.connection.backup(copy, pages=max(1, step_pages), progress=step)
        copy.execute("PRAGMA journal_mode = DELETE")
    finally:
        copy.close()
    fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return total


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
