"""Server logs: bounded JSON lines in the user-only state folder.

Implements workflow-server.md § Status and privacy: logs carry run IDs,
generations and reasons, never a token, token hash, prompt or payload. Only the
whitelisted `extra` fields below are written, so an accidental `extra={"payload":
...}` at a call site cannot leak into the file.

Everything the server process writes is bounded (issue 11): `server.log` rotates;
the errors of libraries that log on their own (asyncio, pykka) go to the same file
at a limited rate instead of to stderr; and a detached server's stdout and stderr
(`server.out`) rotate too.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import logging.handlers
import os
import sys
import threading
import time
from pathlib import Path

from pi_workflows.storage import is_disk_full

__all__ = [
    "FOREIGN_LOGGERS",
    "LOG_FILE_BYTES",
    "OUTPUT_FILE_BYTES",
    "SAFE_FIELDS",
    "BoundedOutput",
    "RateLimitFilter",
    "configure_server_logging",
    "detach_server_logging",
    "redirect_output",
]

LOG_FILE_BYTES = 1_048_576
"""One log file's size bound; three rotated files are kept, so at most 4 MiB."""
LOG_BACKUPS = 3
OUTPUT_FILE_BYTES = 1_048_576
"""`server.out`'s size bound; one rotated file (`server.out.1`) is kept."""

SAFE_FIELDS = (
    "action",
    "actor",
    "run_id",
    "generation",
    "reason",
    "operation",
    "outcome",
    "epoch",
    "count",
    "processes_stopped",
    "runner_epochs_orphaned",
    "runs_requeued",
    "runs_parked",
    "steps_timed_out",
    "profile",
)
"""The `extra` fields a log line may carry."""

FOREIGN_LOGGERS = ("asyncio", "pykka", "pi_workflows.wire._listener.loop")
"""Loggers whose records are rate-limited: library errors that can repeat in a loop."""
FOREIGN_LINES_PER_MINUTE = 20


class JsonLineFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and safe fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": int(record.created * 1000),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage()[:500],
        }
        for name in SAFE_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value if isinstance(value, int | float) else str(value)[:200]
        if record.exc_info and record.exc_info[0] is not None:
            line["error"] = record.exc_info[0].__name__
        return json.dumps(line, separators=(",", ":"), sort_keys=True)


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A rotating handler whose every file, rotated ones included, is born 0600.

    A line that a full disk refuses is dropped quietly (no traceback on stderr) and
    counted; the next line that fits is preceded by one `log.dropped` line with the count.
    """

    _dropped = 0
    _refused = False

    def emit(self, record: logging.LogRecord) -> None:
        """Write the line (and first, once there is space again, the count of dropped ones)."""
        if self._dropped:
            self._refused = False
            super().emit(_dropped_record(self._dropped))
            if self._refused:
                self._dropped += 1
                return
            self._dropped = 0
        self._refused = False
        super().emit(record)
        if self._refused:
            self._dropped += 1

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        """A full disk drops the line; any other failure is reported as logging does."""
        if is_disk_full(sys.exc_info()[1]):
            self._refused = True
            # Drop what the stream still buffers, so the line is not half-written later;
            # the next line reopens the file.
            stream, self.stream = self.stream, None
            with contextlib.suppress(OSError, ValueError):
                if stream is not None:
                    stream.close()
            return
        super().handleError(record)

    def _open(self) -> io.TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return io.TextIOWrapper(
            io.FileIO(fd, "a"), encoding=self.encoding or "utf-8", errors=self.errors
        )


def _dropped_record(count: int) -> logging.LogRecord:
    record = logging.makeLogRecord(
        {
            "name": __name__,
            "levelno": logging.WARNING,
            "levelname": "WARNING",
            "msg": f"{count} log lines were dropped: the disk was full",
        }
    )
    record.action = "log.dropped"
    record.reason = "diskFull"
    return record


class RateLimitFilter(logging.Filter):
    """Lets at most `per_minute` records through per minute; counts the rest.

    The first record after a suppressed stretch says how many were dropped, so a
    repeating library error costs a few lines a minute, not megabytes.
    """

    def __init__(self, per_minute: int = FOREIGN_LINES_PER_MINUTE) -> None:
        super().__init__()
        self._per_minute = per_minute
        self._window_start = time.monotonic()
        self._passed = 0
        self.suppressed = 0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        with self._lock:
            now = time.monotonic()
            if now - self._window_start >= 60:
                self._window_start, self._passed = now, 0
            if self._passed >= self._per_minute:
                self.suppressed += 1
                return False
            self._passed += 1
            if self.suppressed:
                record.msg = f"{record.msg} ({self.suppressed} similar lines suppressed)"
                self.suppressed = 0
            return True


class ServerLogHandler(PrivateRotatingFileHandler):
    """The server's handler, with the filters it installed on foreign loggers."""

    attached: list[tuple[logging.Logger, RateLimitFilter | None, bool, int]]


def configure_server_logging(logs_dir: Path, level: int = logging.INFO) -> logging.Handler:
    """Attach a rotating JSON-lines handler for `pi_workflows` and return it.

    asyncio's and pykka's own records (warnings and errors) go to the same file,
    rate-limited, and no longer reach stderr. Undo it with `detach_server_logging`.
    """
    path = logs_dir / "server.log"
    handler = ServerLogHandler(
        path, maxBytes=LOG_FILE_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8"
    )
    handler.setFormatter(JsonLineFormatter())
    handler.attached = []
    logger = logging.getLogger("pi_workflows")
    logger.addHandler(handler)
    logger.setLevel(level)
    handler.attached.append((logger, None, logger.propagate, logger.level))
    for name in FOREIGN_LOGGERS:
        foreign = logging.getLogger(name)
        limit = RateLimitFilter()
        foreign.addFilter(limit)
        handler.attached.append((foreign, limit, foreign.propagate, foreign.level))
        if not name.startswith("pi_workflows."):
            foreign.addHandler(handler)
            foreign.setLevel(max(foreign.level, logging.WARNING))
            foreign.propagate = False  # not to stderr: that is unbounded
    return handler


def detach_server_logging(handler: logging.Handler) -> None:
    """Remove what `configure_server_logging` attached and close the file."""
    for logger, limit, propagate, level in getattr(handler, "attached", []):
        logger.removeHandler(handler)
        if limit is not None:  # a foreign logger: put it back as it was
            logger.removeFilter(limit)
            logger.propagate = propagate
            logger.setLevel(level)
    handler.close()


class BoundedOutput(io.TextIOBase):
    """A text stream over a file that rotates to `<file>.1` past `limit` bytes.

    Used as a detached server's `sys.stdout` and `sys.stderr`. After each rotation
    the new file is also placed on descriptors 1 and 2, so that output written below
    Python (a fatal error's report) lands in the current file too.
    """

    def __init__(self, path: Path, limit: int = OUTPUT_FILE_BYTES) -> None:
        super().__init__()
        self._path = path
        self._limit = limit
        self._lock = threading.Lock()
        try:
            self._size = path.stat().st_size
        except OSError:
            self._size = 0

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        data = text.encode("utf-8", "replace")
        with self._lock:
            if self._size + len(data) > self._limit and self._size > 0:
                self._rotate()
            data = data[: self._limit]
            written = 0
            while written < len(data):
                try:
                    written += os.write(2, data[written:])
                except InterruptedError:
                    continue
                except OSError:
                    break  # nowhere to write: dropping output beats failing the server
            self._size += written
        return len(text)

    def flush(self) -> None:
        return None

    def _rotate(self) -> None:
        try:
            self._path.replace(self._path.with_name(self._path.name + ".1"))
            fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        except OSError:
            return
        try:
            os.dup2(fd, 1)
            os.dup2(fd, 2)
        finally:
            os.close(fd)
        self._size = 0


def redirect_output(path: Path) -> None:
    """Make `sys.stdout` and `sys.stderr` bounded writers over `path` (descriptors 1, 2).

    For a server started by `server start`, whose descriptors 1 and 2 are `path`.
    """
    stream = BoundedOutput(path)
    sys.stdout = stream
    sys.stderr = stream
