"""Server logs: bounded JSON lines in the user-only state folder.

Implements workflow-server.md § Status and privacy: logs carry run IDs,
generations and reasons, never a token, token hash, prompt or payload. Only the
whitelisted `extra` fields below are written, so an accidental `extra={"payload":
...}` at a call site cannot leak into the file.
"""

from __future__ import annotations

import io
import json
import logging
import logging.handlers
import os
from pathlib import Path

__all__ = ["LOG_FILE_BYTES", "SAFE_FIELDS", "configure_server_logging"]

LOG_FILE_BYTES = 1_048_576
"""One log file's size bound; three rotated files are kept, so at most 4 MiB."""
LOG_BACKUPS = 3

SAFE_FIELDS = (
    "action",
    "actor",
    "run_id",
    "generation",
    "reason",
    "operation",
    "outcome",
    "epoch",
    "processes_stopped",
    "runner_epochs_orphaned",
    "runs_requeued",
    "runs_parked",
)
"""The `extra` fields a log line may carry."""


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
    """A rotating handler whose every file, rotated ones included, is born 0600."""

    def _open(self) -> io.TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return io.TextIOWrapper(
            io.FileIO(fd, "a"), encoding=self.encoding or "utf-8", errors=self.errors
        )


def configure_server_logging(logs_dir: Path, level: int = logging.INFO) -> logging.Handler:
    """Attach a rotating JSON-lines handler for `pi_workflows` and return it."""
    path = logs_dir / "server.log"
    handler = PrivateRotatingFileHandler(
        path, maxBytes=LOG_FILE_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8"
    )
    handler.setFormatter(JsonLineFormatter())
    logger = logging.getLogger("pi_workflows")
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler
