"""The global server lock: one live server per state folder, proved by the kernel.

Implements workflow-server.md § Server lifecycle ("one global lock"). An exclusive
`flock` on `host/server.lock` is released by the kernel when its process dies, so
a crash restart can take over at once instead of waiting out the old lease.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pi_workflows.errors import PiWorkflowsError

__all__ = ["ServerAlreadyRunningError", "ServerLock"]


class ServerAlreadyRunningError(PiWorkflowsError):
    """Another live server holds the lock for this state folder."""

    def __init__(self, pid: int | None) -> None:
        who = f"process {pid}" if pid else "another process"
        super().__init__(
            f"a workflow server is already running for this state folder ({who}); "
            "use `pi-workflows server status` or `pi-workflows server stop`"
        )
        self.pid = pid


@dataclass
class ServerLock:
    """An exclusive lock file holding the owner's PID. Not reentrant."""

    path: Path
    _fd: int = -1

    def acquire(self) -> None:
        """Take the lock without waiting.

        Raises:
            ServerAlreadyRunningError: a live process holds it.
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _wait_for_holder_pid(fd)
            os.close(fd)
            raise ServerAlreadyRunningError(holder) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """Release the lock (the kernel does the same if the process dies)."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = -1

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._fd >= 0

    def still_ours(self) -> bool:
        """True while the lock file at `path` is the one this object holds the lock on.

        The kernel keeps the `flock` for a stopped process, so no other server can take
        this file; only a file removed or replaced under the server lets a second server
        lock another. A stalled server asks this before it takes a new epoch.
        """
        if self._fd < 0:
            return False
        try:
            held, there = os.fstat(self._fd), self.path.stat()
        except OSError:
            return False
        return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


HOLDER_PID_WAIT_S = 1.0


def _wait_for_holder_pid(fd: int) -> int | None:
    """Read the holder's PID, giving a holder that just took the lock time to write it."""
    deadline = time.monotonic() + HOLDER_PID_WAIT_S
    while True:
        pid = _read_pid(fd)
        if pid is not None or time.monotonic() >= deadline:
            return pid
        time.sleep(0.01)  # no event marks the write; the wait is bounded and rare


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
