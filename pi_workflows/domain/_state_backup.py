"""`state.backup`: a verified copy of the live database, made by the server on its own
connection. Payload `{"path": str, "progress"?: bool}`: an absolute path to a new file in
an existing folder; with `progress`, the asker's connection gets `maintenanceProgress`
events (pages copied of how many, then the verification).

Implements client-protocol.md § Maintenance. The copy runs on the state-backup actor's
read connection (`back_up`, inside one read transaction: the copy is one snapshot), in
steps; then `record_backup` stores the accepted or rejected receipt under the
request's idempotency key, before anyone is answered. A retry of the key adopts the
stored receipt or joins the backup in flight (actors/_state_backup.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pi_workflows.domain._operations import (
    _command,
    prior_answer,
    rejected,
    response,
    stored_answer,
)
from pi_workflows.storage import (
    BackupCopy,
    BackupFailedError,
    BackupProgress,
    Database,
    ReceiptOutcome,
    check_backup_path,
    lookup_receipt,
    record_receipt,
    write_backup,
)
from pi_workflows.wire.protocol import RequestMessage

__all__ = [
    "BackupOutcome",
    "BackupQuery",
    "BackupQueryError",
    "back_up",
    "backup_receipt",
    "parse_backup_query",
    "record_backup",
]

log = logging.getLogger(__name__)

_MAX_PATH_CHARS: Final = 4096


class BackupQueryError(ValueError):
    """A `state.backup` payload the server refuses: `code` is the safe error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class BackupQuery:
    path: Path


def parse_backup_query(payload: Mapping[str, Any]) -> BackupQuery:
    """Check a `state.backup` payload's shape; raises `BackupQueryError` (no path in it).

    Whether the file exists or its folder does is checked where the copy starts, and
    that refusal is stored like a result."""
    unknown = sorted(set(payload) - {"path", "progress"})
    if unknown:
        raise BackupQueryError("payloadInvalid", f"unknown state.backup field {unknown[0]}")
    if not isinstance(payload.get("progress", False), bool):
        raise BackupQueryError("payloadInvalid", "progress must be true or false")
    raw = payload.get("path")
    if not isinstance(raw, str) or not 1 <= len(raw) <= _MAX_PATH_CHARS or "\x00" in raw:
        raise BackupQueryError("backupPathInvalid", "path must name the new backup file")
    path = Path(raw)
    if not path.is_absolute():
        raise BackupQueryError("backupPathInvalid", "the backup path must be absolute")
    return BackupQuery(path)


@dataclass(frozen=True, slots=True)
class BackupOutcome:
    """What one backup attempt did, for `record_backup`: a copy, or a refusal."""

    copy: BackupCopy | None = None
    code: str | None = None
    message: str | None = None


def back_up(
    db: Database,
    *,
    request: RequestMessage,
    query: BackupQuery,
    on_progress: Callable[[BackupProgress], None] | None = None,
) -> BackupOutcome | dict[str, Any]:
    """A read, in one read transaction of the caller: the stored answer of this
    invocation if there is one, else a verified copy of this snapshot (or the refusal).

    `on_progress(BackupProgress)` is told each step (the caller's own function: this
    runs on the state-backup actor, never as a message's content)."""
    stored = prior_answer(db, request)
    if stored is not None:
        return stored
    try:
        check_backup_path(query.path)
        copy = write_backup(db, query.path, on_progress=on_progress)
    except BackupFailedError as exc:
        return BackupOutcome(code=exc.code, message=str(exc))
    return BackupOutcome(copy=copy)


def backup_receipt(copy: BackupCopy) -> dict[str, Any]:
    """The receipt of a verified backup: no path (the client named it), sizes only."""
    return {"verified": True, "byteCount": copy.byte_count, "pageCount": copy.page_count}


def record_backup(db: Database, *, request: RequestMessage, outcome: BackupOutcome) -> Any:
    """A write: store the receipt (accepted with the copy's sizes, or the refusal) under
    the request's idempotency key, and answer with it (a receipt stored meanwhile wins)."""
    command = _command(request)
    with db.write() as tx:
        stored = stored_answer(request, lookup_receipt(tx, command))
        if stored is not None:
            return stored
        if outcome.copy is None:
            error = {"code": outcome.code or "backupFailed", "message": outcome.message or ""}
            record_receipt(tx, command, outcome=ReceiptOutcome.REJECTED, receipt=error)
            return rejected(request, "rejected", error["code"], error["message"])
        receipt = backup_receipt(outcome.copy)
        record_receipt(tx, command, outcome=ReceiptOutcome.ACCEPTED, receipt=receipt)
    log.info(
        "state backed up",
        extra={"action": "state.backup", "pages": outcome.copy.page_count},
    )
    return response(request, "accepted", receipt=receipt)
