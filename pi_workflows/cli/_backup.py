"""`state verify --backup`: check an inactive backup read-only, and never the live database.

Implements python-port.md decision 2 ("`state verify <backup>` is the one exception
and opens a backup read-only") and client-protocol.md § Maintenance: the live database,
by any path, is refused; a backup is opened so that nothing, not even a `-wal` or
`-shm` file, is written beside it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import stat
import struct
import sys
import tempfile
from pathlib import Path

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.storage import Finding, FindingCode, verify

__all__ = ["BackupUnusableError", "LiveDatabaseError", "refuse_live", "verify_inactive_backup"]

LIVE_NAME = "state.sqlite"
# SQLite's unix VFS: every open WAL connection read-locks this byte of the -shm file
# (the "dead man switch"), and holds a shared lock on the database file itself.
_SHM_DMS_BYTE = 128
_LINUX_FLOCK = "hhqqi"  # struct flock on Linux: type, whence, start, len, pid


class LiveDatabaseError(PiWorkflowsError):
    """The file given as a backup is a live database; only its server may open it."""


class BackupUnusableError(PiWorkflowsError):
    """The backup path names no regular file."""


def _same_file(a: os.stat_result, path: Path) -> bool:
    try:
        b = path.stat()
    except OSError:
        return False
    return _identity(a) == _identity(b)


def _posix_locked(path: Path, start: int, length: int) -> bool:
    """True when another process holds a POSIX lock on the range (F_GETLK: only asks)."""
    if not sys.platform.startswith("linux"):
        return False  # struct flock differs elsewhere; the inode check still applies
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        query = struct.pack(_LINUX_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
        lock_type: int = struct.unpack(_LINUX_FLOCK, answer)[0]
        return lock_type != fcntl.F_UNLCK
    except OSError:
        return False
    finally:
        os.close(fd)


def _server_lock_held(lock: Path) -> bool:
    """True when a live server holds the `flock` on `host/server.lock`."""
    try:
        inode = lock.stat().st_ino
    except OSError:
        return False
    try:
        table = Path("/proc/locks").read_text("ascii", "replace")
    except OSError:
        return _probe_flock(lock)
    for line in table.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:123456 0 EOF" (a waiter has "->" first)
        if "FLOCK" in fields and any(
            f.count(":") == 2 and f.rsplit(":", 1)[1] == str(inode) for f in fields
        ):
            return True
    return False


def _probe_flock(lock: Path) -> bool:
    """Where /proc/locks does not exist: try a shared lock for an instant."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing releases a lock we took
    return False


def refuse_live(path: Path, state_dir: Path) -> Path:
    """Return the real path of `path` if it may be verified as an inactive backup.

    Refuses, by any path (symbolic or hard link, `..`, `/proc/self/fd/N`), the live
    `state.sqlite` of `state_dir`; a file that a running process has open as a SQLite
    database (it holds a lock on the file or on its `-shm`); and the `state.sqlite` of
    any state folder whose server lock is held.

    Raises:
        BackupUnusableError: `path` does not name a regular file.
        LiveDatabaseError: `path` is a live database.
    """
    try:
        info = path.stat()
    except OSError as exc:
        raise BackupUnusableError(f"cannot read the backup {path}: {exc.strerror}") from None
    return _refuse_live(path, info, state_dir)


def _identity(info: os.stat_result) -> tuple[int, int]:
    """A file as SQLite's unix VFS knows it (`unixFileId`: device and inode), whatever
    name it was opened by; the VFS shares locks between connections by this key."""
    return info.st_dev, info.st_ino


def _refuse_live(path: Path, info: os.stat_result, state_dir: Path) -> Path:
    if not stat.S_ISREG(info.st_mode):
        raise BackupUnusableError(f"the backup {path} is not a regular file")
    real = path.resolve()
    live = state_dir / LIVE_NAME
    if _same_file(info, live) or _same_file(info, live.resolve()):
        raise LiveDatabaseError(
            f"{path} is the live database of {state_dir}; only its server may open it. "
            "Run `pi-workflows state verify` without --backup to check it through the server"
        )
    shm = real.with_name(real.name + "-shm")
    if _posix_locked(real, 0, 0) or _posix_locked(shm, _SHM_DMS_BYTE, 1):
        raise LiveDatabaseError(
            f"{path} is open as a database by a running process; stop that process first, "
            "or verify a copy made while it was stopped"
        )
    if real.name == LIVE_NAME and _server_lock_held(real.parent / "host" / "server.lock"):
        raise LiveDatabaseError(
            f"{path} is the live database of the running server of {real.parent}; "
            f"run `pi-workflows --state-dir {real.parent} state verify` instead"
        )
    return real


def _nonempty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def _verify_connection(uri: str) -> list[Finding]:
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        conn.execute("PRAGMA query_only = ON")
        return verify(conn)
    finally:
        conn.close()


def verify_inactive_backup(path: Path, state_dir: Path) -> list[Finding]:
    """Run the invariant checker on an inactive backup without writing anything.

    **Writes:** none beside the backup. A backup alone is opened `mode=ro&immutable=1`,
    so SQLite creates no `-wal` or `-shm` file. A backup with a non-empty `-wal` or
    `-journal` beside it is copied, with that file, to a private temporary folder, and
    the copy is verified, so the committed frames count and the original stays as it is.

    Raises:
        BackupUnusableError: `path` does not name a regular file.
        LiveDatabaseError: `path` is a live database (see `refuse_live`).
    """
    try:  # the file is pinned: the checks and SQLite see the same inode, however named
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO: no wait
    except OSError as exc:
        raise BackupUnusableError(f"cannot read the backup {path}: {exc.strerror}") from None
    try:
        real = _refuse_live(path, os.fstat(fd), state_dir)
        return _verify_pinned(real, fd)
    finally:
        os.close(fd)


def _pinned_name(real: Path, fd: int) -> Path:
    """The name SQLite opens: this process's descriptor where /proc has it (so a file
    swapped in under the path after the checks is never opened), else the real path."""
    pinned = Path(f"/proc/self/fd/{fd}")
    try:
        same = _identity(pinned.stat()) == _identity(os.fstat(fd))
    except OSError:
        return real
    return pinned if same else real


def _verify_pinned(real: Path, fd: int) -> list[Finding]:
    companions = [
        suffix for suffix in ("-wal", "-journal") if _nonempty(real.with_name(real.name + suffix))
    ]
    if not companions:
        try:
            return _verify_connection(_pinned_name(real, fd).as_uri() + "?mode=ro&immutable=1")
        except sqlite3.Error as exc:
            return _open_failed(exc)
    with tempfile.TemporaryDirectory(prefix="piw-verify-") as folder:
        copy = Path(folder) / "backup.sqlite"
        shutil.copyfile(_pinned_name(real, fd), copy)
        for suffix in companions:
            with contextlib.suppress(FileNotFoundError):  # gone since: nothing to replay
                shutil.copyfile(real.with_name(real.name + suffix), f"{copy}{suffix}")
        try:
            return _verify_connection(copy.as_uri())
        except sqlite3.Error as exc:
            return _open_failed(exc)


def _open_failed(exc: sqlite3.Error) -> list[Finding]:
    return [Finding(FindingCode.CHECK_FAILED, None, f"open: {type(exc).__name__}: {exc}")]
