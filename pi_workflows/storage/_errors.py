"""Errors raised by the storage layer, all under `pi_workflows.errors.PiWorkflowsError`.

Implements workflow-server.md § Claim rules (`ClaimLostError` reasons), § Alpha state
policy (`SchemaMismatchError`) and § Failure classification. No error message or
attribute ever carries a claim token or token hash.
"""

from __future__ import annotations

import enum
import errno
import sqlite3
from pathlib import Path

from pi_workflows.errors import PiWorkflowsError

__all__ = [
    "DISK_FULL_MESSAGE",
    "ClaimHeldError",
    "ClaimLostError",
    "ClaimLostReason",
    "ContentUnavailableError",
    "DiskFullError",
    "EffectConflictError",
    "EffectRecoveryError",
    "InvalidTransitionError",
    "ReceiptConflictError",
    "RevisionConflictError",
    "RunNotFoundError",
    "RunnerMessageConflictError",
    "SchemaMismatchError",
    "StorageError",
    "is_disk_full",
]


class StorageError(PiWorkflowsError):
    """Base class of every error the storage layer raises on purpose."""


class SchemaMismatchError(StorageError):
    """The database file is not `pi-workflows-state` with this package's DDL digest.

    Raised before any write: the file's bytes are exactly as they were.
    """

    def __init__(self, path: Path, found: str, expected: str) -> None:
        self.path = path
        self.found = found
        self.expected = expected
        super().__init__(
            f"The workflow state database {path} has schema {found}, but this version of "
            f"pi-workflows needs {expected}. It was left unchanged. pi-workflows is alpha "
            f"and does not migrate state: stop the server, back the file up "
            f"(mv '{path}' '{path}.bak', together with any '-wal' and '-shm' files beside "
            f"it), then start the server again to create a fresh database."
        )


class ClaimLostReason(enum.StrEnum):
    """Why a protected write, renewal or release was refused.

    Checked in this order, and the first failing check is the one reason reported:
    """

    MISSING_AUTHORITY = "missingAuthority"
    """No claim is held on the run (absent, released, or the write needs one and has none)."""
    GENERATION_CHANGED = "generationChanged"
    """The held claim has another generation: a newer owner took over (the fence)."""
    OWNER_CHANGED = "ownerChanged"
    """Same generation, but another owner type or owner ID."""
    TOKEN_CHANGED = "tokenChanged"  # noqa: S105 (a reason name, not a secret)
    """Same generation and owner, but the token does not hash to the stored hash."""
    EXPIRED = "expired"
    """The exact claim, but its expiry is not in the future; it cannot renew itself."""


class ClaimLostError(StorageError):
    """A write presented a claim that is not the live claim on the resource.

    Claim loss is a handoff, not a run failure: nothing was changed, and the old
    owner must stop writing. Carries only the resource, the presented generation and
    one reason, which are safe to log.
    """

    def __init__(self, resource: str, generation: int | None, reason: ClaimLostReason) -> None:
        self.resource = resource
        self.generation = generation
        self.reason = reason
        super().__init__(f"claim lost on {resource} (generation {generation}): {reason.value}")


class ClaimHeldError(StorageError):
    """A claim was requested on a resource whose current claim is still live."""

    retryable = True

    def __init__(self, resource: str, generation: int, expires_at: int) -> None:
        self.resource = resource
        self.generation = generation
        self.expires_at = expires_at
        super().__init__(
            f"{resource} has a live claim (generation {generation}) until {expires_at}"
        )


class RunNotFoundError(StorageError):
    """No run has this ID."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r}")


class InvalidTransitionError(StorageError):
    """The run's lifecycle state does not allow the requested transition or operation."""

    def __init__(self, run_id: str, current: str, operation: str) -> None:
        self.run_id = run_id
        self.current = current
        self.operation = operation
        super().__init__(f"run {run_id} in state {current} does not allow {operation}")


class RevisionConflictError(StorageError):
    """The caller's expected revision is not the run's current revision."""

    def __init__(self, run_id: str, expected: int, actual: int) -> None:
        self.run_id = run_id
        self.expected = expected
        self.actual = actual
        super().__init__(f"run {run_id} is at revision {actual}, not {expected}")


class ReceiptConflictError(StorageError):
    """A receipt names a request ID or idempotency key already bound to another payload."""


class RunnerMessageConflictError(ReceiptConflictError):
    """A runner message ID already names a message with another fingerprint (or a reply).

    A retry of the same message adopts the stored reply; a different message under the
    same ID is a protocol error (`protocolRejected`).
    """

    def __init__(self, runner_epoch: str, message_id: str, detail: str) -> None:
        self.runner_epoch = runner_epoch
        self.message_id = message_id
        super().__init__(f"runner {runner_epoch} message {message_id}: {detail}")


class EffectConflictError(StorageError):
    """A managed-effect call contradicts the effect's durable record; nothing changed.

    `reason` is one of: `requestMismatch` (the key is bound to another request
    fingerprint), `otherRun` (the key belongs to another run), `outcomeMismatch` (the
    effect already settled another way), `terminal` (the effect is applied, rejected,
    cancelled or ambiguous, and the call would reopen it).
    """

    def __init__(self, idempotency_key: str, reason: str, detail: str) -> None:
        self.idempotency_key = idempotency_key
        self.reason = reason
        super().__init__(f"effect {idempotency_key}: {reason}: {detail}")


class EffectRecoveryError(StorageError):
    """An operator's effect recovery cannot apply; nothing changed.

    `code` is one of: `runNotAmbiguous` (the run is not parked with `effectAmbiguous`),
    `noAmbiguousEffect` (the run has no ambiguous effect, or not the one named),
    `effectRequired` (several are ambiguous: name one), `resultNotAllowed` (a result
    with a retry).
    """

    def __init__(self, run_id: str, code: str, detail: str) -> None:
        self.run_id = run_id
        self.code = code
        super().__init__(f"run {run_id}: {detail}")


class ContentUnavailableError(StorageError):
    """Content is missing, out of range, or does not match its digest, run or media type.

    `reason` is one of `notFound`, `badRange`, `digestMismatch`.
    """

    def __init__(self, digest: str, reason: str) -> None:
        self.digest = digest
        self.reason = reason
        super().__init__(f"content {digest} is unavailable: {reason}")


DISK_FULL_MESSAGE = (
    "the disk that holds the workflow state is full: free space on it, then send this "
    "request again; the server retries the writes of runs it accepted by itself"
)
"""The sentence a `diskFull` refusal carries (no path: the operator knows the folder)."""

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_SQLITE_FULL = 13
"""SQLITE_FULL; SQLite reports ENOSPC from a write of its files with this code."""


class DiskFullError(StorageError):
    """A write failed because the disk (or the user's quota) is full; nothing was stored.

    Retryable once space returns: a client command may be sent again with the same
    idempotency key, and the server holds and retries its own writes.
    """

    retryable = True
    code = "diskFull"

    def __init__(self) -> None:
        super().__init__(DISK_FULL_MESSAGE)


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error it was raised from, is a full disk: SQLITE_FULL, or an
    `OSError` with ENOSPC or EDQUOT (blob, log and other file writes)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFullError):
            return True
        code = getattr(exc, "sqlite_errorcode", None) if isinstance(exc, sqlite3.Error) else None
        if code == _SQLITE_FULL:
            return True
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
    return False
