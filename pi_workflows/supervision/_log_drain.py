"""Children's output logs, bounded as they are written.

A child's stdout and stderr go into a pipe; one thread of the server copies each pipe
into the child's log file and keeps that file within its cap while the child writes:
the first bytes up to the cap less the tail, then a marker line that counts what was
dropped, then the last `tail_bytes` (kept in memory in chunks and rewritten in place
about once a second). However much or however fast a workflow prints, the file never
holds more than `cap_bytes` plus the marker, and nothing else grows with the output.

The thread only ever reads pipes and writes files: a child that floods its pipe waits
on the pipe (backpressure), never on the server. A failed write (a full disk) drops
those bytes and counts them; the pipe is still drained, so the child never blocks on
it.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import queue
import selectors
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LogDrain"]

READ_BYTES = 1024 * 1024
"""One read from a child's pipe (the pipe is enlarged to this where Linux allows)."""
FLUSH_INTERVAL_S = 1.0
"""How often a log whose head is full rewrites its tail in place."""
FINISH_READS = 8
"""At most this many reads after a child's exit before its pipe is closed."""
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def _marker(dropped: int, tail: int) -> bytes:
    return (
        f"\n[pi-workflows: {dropped} bytes of output were dropped here to keep this log "
        f"within its cap; the last {tail} bytes follow]\n"
    ).encode("ascii")


MARKER_MAX_BYTES = len(_marker(2**63, 2**63))
"""The longest marker line: a log never exceeds its cap by more."""


@dataclass
class _Log:
    """One child's log file: the head written through, the tail kept and rewritten."""

    fd: int
    """The log file (the pipe's read end is the key it is kept under)."""
    token: int
    head_cap: int
    tail_cap: int
    head: int = 0
    """Bytes written at the start of the file (at most `head_cap`)."""
    tail: deque[bytes] = field(default_factory=deque)
    tail_len: int = 0
    dropped: int = 0
    dirty: bool = False
    flushed_at: float = 0.0

    def take(self, data: bytes) -> None:
        room = self.head_cap - self.head
        if room > 0:
            written = self._write_at(data[:room], self.head)
            self.head += written
            self.dropped += min(room, len(data)) - written
            data = data[room:]
        if not data:
            return
        self.tail.append(data)
        self.tail_len += len(data)
        while self.tail and self.tail_len - len(self.tail[0]) >= self.tail_cap:
            self.dropped += len(self.tail[0])
            self.tail_len -= len(self.tail.popleft())
        self.dirty = True

    def flush(self, now: float) -> None:
        """Rewrite the marker and the tail after the head, and cut the file there."""
        if not self.dirty:
            return
        excess = max(0, self.tail_len - self.tail_cap)  # the oldest chunk may overhang
        tail = b"".join(self.tail)[excess:]
        block = _marker(self.dropped + excess, len(tail)) + tail
        written = self._write_at(block, self.head)
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, self.head + written)
        self.dirty, self.flushed_at = False, now

    def _write_at(self, data: bytes, offset: int) -> int:
        """Write `data` at `offset`; the bytes written (0 when the disk refused them)."""
        done = 0
        while done < len(data):
            try:
                done += os.pwrite(self.fd, data[done:], offset + done)
            except OSError:
                return done
        return done


class LogDrain:
    """Copies children's output pipes into their bounded log files, on one thread.

    `open` (any thread) makes a pipe for one child and returns its write end, which the
    caller hands to the child and then closes; `finish` (once the child was reaped)
    reads what the child left in the pipe, writes the tail and closes the log; `close`
    finishes every log and ends the thread.
    """

    def __init__(self, cap_bytes: int, tail_bytes: int) -> None:
        if not 0 < tail_bytes < cap_bytes:
            raise ValueError("the tail must be smaller than the cap")
        self._cap = cap_bytes
        self._tail = tail_bytes
        self._requests: queue.SimpleQueue[tuple[str, int, _Log | None]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._logs: dict[int, _Log] = {}
        """By the read end of each child's pipe."""
        self._tokens: dict[int, int] = {}
        """Read end by token: a token is never reused, a descriptor number is."""
        self._ids = itertools.count(1)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="log-drain", daemon=True)
        self._thread.start()

    def open(self, path: Path) -> tuple[int, int]:
        """Start a bounded log at `path` (created 0600, emptied): (token, write end).

        Raises:
            OSError: the file or the pipe could not be made.
        """
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            read_end, write_end = os.pipe()
        except OSError:
            os.close(fd)
            raise
        with contextlib.suppress(OSError):  # fewer wakeups for a flood; the default works too
            fcntl.fcntl(write_end, _F_SETPIPE_SZ, READ_BYTES)
        os.set_blocking(read_end, False)
        token = next(self._ids)
        self._ask("open", read_end, _Log(fd, token, self._cap - self._tail, self._tail))
        return token, write_end

    def finish(self, token: int) -> None:
        """The child is gone: copy what is left in its pipe, write the tail, close."""
        self._ask("finish", token, None)  # `fd` carries the token here

    def close(self, timeout_s: float = 5.0) -> None:
        """Finish every log and stop the thread."""
        if not self._closed:
            self._closed = True
            self._ask("close", -1, None)
            self._thread.join(timeout_s)

    def _ask(self, op: str, fd: int, log: _Log | None) -> None:
        self._requests.put((op, fd, log))
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    # --- the thread -------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while self._handle_requests():
                for key, _ in self._selector.select(self._wait()):
                    if key.fd != self._wake_r:
                        self._copy(key.fd)
                self._flush_due()
        finally:
            for fd in list(self._logs):
                self._end(fd)
            self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _handle_requests(self) -> bool:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        while True:
            try:
                op, fd, log = self._requests.get_nowait()
            except queue.Empty:
                return True
            if op == "open" and log is not None:
                self._logs[fd] = log
                self._tokens[log.token] = fd
                try:
                    self._selector.register(fd, selectors.EVENT_READ)
                except (OSError, ValueError):
                    self._end(fd)  # the writer gets a closed pipe, not a hang
            elif op == "finish" and fd in self._tokens:
                self._finish(self._tokens[fd])
            elif op == "close":
                return False

    def _finish(self, fd: int) -> None:
        # What the child wrote before it exited is at most one pipe's worth; a descendant
        # that still writes is cut off (bounded: a few reads, then the pipe is closed).
        for _ in range(FINISH_READS):
            if not self._copy(fd):
                break
        self._end(fd)

    def _copy(self, fd: int) -> bool:
        """Copy one read from the pipe; False when nothing more is there now."""
        log = self._logs.get(fd)
        if log is None:
            return False
        try:
            data = os.read(fd, READ_BYTES)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:  # every writer closed it
            self._end(fd)
            return False
        log.take(data)
        return True

    def _end(self, fd: int) -> None:
        log = self._logs.pop(fd, None)
        if log is None:
            return
        self._tokens.pop(log.token, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
        log.flush(time.monotonic())
        with contextlib.suppress(OSError):
            os.close(log.fd)

    def _wait(self) -> float | None:
        dirty = [log.flushed_at for log in self._logs.values() if log.dirty]
        if not dirty:
            return None
        return max(0.0, min(dirty) + FLUSH_INTERVAL_S - time.monotonic())

    def _flush_due(self) -> None:
        now = time.monotonic()
        for log in self._logs.values():
            if log.dirty and now - log.flushed_at >= FLUSH_INTERVAL_S:
                log.flush(now)
