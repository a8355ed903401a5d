"""Command receipts in `host_commands`: durable fingerprints, adoption and conflicts.

Implements workflow-server.md § Server commands and § Live client protocol: the
fingerprint covers client ID, operation, idempotency key and canonical payload, never
the request ID; a receipt commits in the same transaction as the change it acknowledges.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from pi_workflows.storage import _queries as q
from pi_workflows.storage._content import content_digest
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._errors import ContentUnavailableError, ReceiptConflictError
from pi_workflows.wire.canonical import (
    InvalidJSONError,
    NonCanonicalError,
    dumps,
    loads,
    sha256_digest,
)

__all__ = [
    "CommandRequest",
    "LookupOutcome",
    "ReceiptLookup",
    "ReceiptOutcome",
    "StoredReceipt",
    "command_fingerprint",
    "lookup_receipt",
    "record_receipt",
]


class ReceiptOutcome(enum.StrEnum):
    """Outcomes that are stored; a retry of either is answered `adopted`."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"


class LookupOutcome(enum.StrEnum):
    """What a command handler learns before it changes anything."""

    NONE = "none"
    """No receipt: run the command, then `record_receipt` in the same transaction."""
    ADOPTED = "adopted"
    """The same durable command was already handled: answer with the stored receipt."""
    CONFLICT = "conflict"
    """The request ID or idempotency key is bound to another durable payload."""


@dataclass(frozen=True, slots=True)
class CommandRequest:
    """The durable identity of one client command (the request ID is transport only)."""

    request_id: str
    client_id: str
    operation: str
    idempotency_key: str
    payload: Any
    """The request payload (JSON); canonicalized for the fingerprint."""

    @property
    def fingerprint(self) -> str:
        """`command_fingerprint` of this command."""
        return command_fingerprint(
            self.client_id, self.operation, self.idempotency_key, self.payload
        )


@dataclass(frozen=True, slots=True)
class StoredReceipt:
    """One stored receipt and its decoded receipt body."""

    request_id: str
    """The request ID of the attempt that first stored it."""
    client_id: str
    operation: str
    idempotency_key: str
    fingerprint: str
    run_id: str | None
    accepted_revision: int | None
    outcome: ReceiptOutcome
    receipt: Any
    """The receipt or safe error body (JSON) that the response carried."""
    receipt_hash: str
    """`sha256:` of the receipt's canonical JSON, which is stored inline in its row."""
    created_at: int


@dataclass(frozen=True, slots=True)
class ReceiptLookup:
    """The result of `lookup_receipt`; `receipt` is the stored row for adopt and conflict."""

    outcome: LookupOutcome
    receipt: StoredReceipt | None


@dataclass(frozen=True, slots=True)
class _CommandRow:
    request_id: str
    client_id: str
    operation: str
    idempotency_key: str
    fingerprint: str
    run_id: str | None
    accepted_revision: int | None
    outcome: str
    receipt: bytes
    created_at: int


def command_fingerprint(client_id: str, operation: str, idempotency_key: str, payload: Any) -> str:
    """Return `sha256:<hex>` of the canonical JSON of the command's durable identity.

    Raises:
        pi_workflows.wire.canonical.NotSerializableError: the payload has no canonical form.
    """
    return sha256_digest(
        {
            "clientId": client_id,
            "idempotencyKey": idempotency_key,
            "operation": operation,
            "payload": payload,
        }
    )


def _stored(row: _CommandRow) -> StoredReceipt:
    data = bytes(row.receipt)
    try:
        receipt = loads(data)
    except (InvalidJSONError, NonCanonicalError):
        raise ContentUnavailableError(f"receipt:{row.request_id}", "malformedJson") from None
    return StoredReceipt(
        request_id=row.request_id,
        client_id=row.client_id,
        operation=row.operation,
        idempotency_key=row.idempotency_key,
        fingerprint=row.fingerprint,
        run_id=row.run_id,
        accepted_revision=row.accepted_revision,
        outcome=ReceiptOutcome(row.outcome),
        receipt=receipt,
        receipt_hash=content_digest(data),
        created_at=row.created_at,
    )


def lookup_receipt(reader: Reader, command: CommandRequest) -> ReceiptLookup:
    """Decide whether `command` was already handled, before changing anything.

    Call it inside the handler's `write()` transaction so the answer cannot change
    before the receipt is recorded. Rules, in order: a stored row under the same
    request ID adopts when its fingerprint matches and conflicts otherwise (one request
    ID cannot name two payloads); then a stored row under the same client ID and
    idempotency key adopts or conflicts the same way; otherwise `none`.
    """
    fingerprint = command.fingerprint
    for sql, params in (
        (q.SELECT_COMMAND_BY_REQUEST, {"request_id": command.request_id}),
        (
            q.SELECT_COMMAND_BY_KEY,
            {"client_id": command.client_id, "idempotency_key": command.idempotency_key},
        ),
    ):
        row = reader.fetch_one(sql, params, _CommandRow)
        if row is not None:
            outcome = (
                LookupOutcome.ADOPTED if row.fingerprint == fingerprint else LookupOutcome.CONFLICT
            )
            return ReceiptLookup(outcome, _stored(row))
    return ReceiptLookup(LookupOutcome.NONE, None)


def record_receipt(
    tx: Tx,
    command: CommandRequest,
    *,
    outcome: ReceiptOutcome,
    receipt: Any,
    run_id: str | None = None,
    accepted_revision: int | None = None,
) -> StoredReceipt:
    """Store the receipt of a handled command in the transaction of its change.

    **Durability:** the receipt commits with the change it acknowledges, in the same
    `write()`; the server answers the client only after that commit.

    Args:
        tx: the handler's open transaction.
        command: the command being acknowledged.
        outcome: `accepted` or `rejected` (transient answers are not stored).
        receipt: the receipt or safe error body sent in the response (JSON).
        run_id: the run the command concerns, if any.
        accepted_revision: the run revision the command produced, if any.

    Raises:
        ReceiptConflictError: the request ID or the client's idempotency key already has
            a receipt (call `lookup_receipt` first).
    """
    existing = lookup_receipt(tx, command)
    if existing.outcome is not LookupOutcome.NONE:
        raise ReceiptConflictError(
            f"request {command.request_id} or key {command.idempotency_key} already has a receipt"
        )
    data = dumps(receipt)  # inline: a receipt is one response body, never shared
    fingerprint = command.fingerprint
    tx.execute(
        q.INSERT_COMMAND,
        {
            "request_id": command.request_id,
            "client_id": command.client_id,
            "operation": command.operation,
            "idempotency_key": command.idempotency_key,
            "fingerprint": fingerprint,
            "run_id": run_id,
            "accepted_revision": accepted_revision,
            "outcome": outcome.value,
            "receipt": data,
            "now": tx.now,
        },
    )
    return StoredReceipt(
        request_id=command.request_id,
        client_id=command.client_id,
        operation=command.operation,
        idempotency_key=command.idempotency_key,
        fingerprint=fingerprint,
        run_id=run_id,
        accepted_revision=accepted_revision,
        outcome=outcome,
        receipt=receipt,
        receipt_hash=content_digest(data),
        created_at=tx.now,
    )
