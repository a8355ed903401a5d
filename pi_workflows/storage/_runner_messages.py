"""Runner message receipts in `runner_messages`: a retried runner message gets the same reply.

Implements workflow-server.md § Runner protocol: keyed by runner epoch and message ID,
bound to the digest of the canonical message, committed with the change, kept inline and
only while the epoch lives (an ended epoch's frames are refused before the database).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pi_workflows.storage import _queries as q
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._errors import (
    ContentUnavailableError,
    InvalidTransitionError,
    RunnerMessageConflictError,
)
from pi_workflows.storage._rows import RunnerEpochRow
from pi_workflows.wire.canonical import (
    InvalidJSONError,
    NonCanonicalError,
    dumps,
    loads,
    sha256_digest,
)

__all__ = [
    "count_runner_replies",
    "lookup_runner_reply",
    "record_runner_reply",
    "runner_message_fingerprint",
]


@dataclass(frozen=True, slots=True)
class _MessageRow:
    fingerprint: str
    reply: bytes


def runner_message_fingerprint(message: Any) -> str:
    """Return `sha256:<hex>` of the canonical JSON of the whole runner message.

    A retry repeats the message exactly (same message ID, expected revision and
    payload), so any difference under the same message ID is a conflict.

    Raises:
        pi_workflows.wire.canonical.NotSerializableError: no canonical form.
    """
    return sha256_digest(message)


def count_runner_replies(reader: Reader, runner_epoch: str) -> int:
    """How many of the runner epoch's messages were accepted (each has its stored reply)."""
    count = reader.fetch_value(q.COUNT_RUNNER_MESSAGES, {"runner_epoch": runner_epoch})
    return int(count or 0)


def lookup_runner_reply(
    reader: Reader, runner_epoch: str, message_id: str, fingerprint: str
) -> Any | None:
    """Return the stored reply (decoded JSON) to this exact message, or None.

    Call it inside the handler's `write()` (or from the database actor), after the
    generation and epoch checks and before any change, so the answer cannot change
    before `record_runner_reply`. A found reply is sent again as it was.

    Raises:
        RunnerMessageConflictError: the message ID names a message with another
            fingerprint (answer `protocolRejected`; change nothing).
        ContentUnavailableError: the stored reply is not canonical JSON (`malformedJson`).
    """
    row = reader.fetch_one(
        q.SELECT_RUNNER_MESSAGE,
        {"runner_epoch": runner_epoch, "message_id": message_id},
        _MessageRow,
    )
    if row is None:
        return None
    if row.fingerprint != fingerprint:
        raise RunnerMessageConflictError(
            runner_epoch, message_id, "the message ID was used for another message"
        )
    try:
        return loads(row.reply)
    except (InvalidJSONError, NonCanonicalError):
        raise ContentUnavailableError(f"reply:{message_id}", "malformedJson") from None


def record_runner_reply(  # noqa: PLR0917 (the receipt columns, in key order)
    tx: Tx,
    runner_epoch: str,
    message_id: str,
    kind: str,
    fingerprint: str,
    reply: Any,
) -> None:
    """Store the reply to an accepted runner message in the transaction of its change.

    **Durability:** the reply commits with the change it acknowledges, in the same
    `write()`; the server sends the reply only after that commit.

    Args:
        tx: the handler's open transaction.
        runner_epoch: the sending runner epoch (a recorded `runner_epochs` row).
        message_id: the message's stable ID.
        kind: the message kind, e.g. `effect.reserve`.
        fingerprint: `runner_message_fingerprint(message)`.
        reply: the reply body sent to the runner (JSON, not null).

    Raises:
        ValueError: the reply is None (a stored reply must be found again).
        InvalidTransitionError: the runner epoch is unknown.
        RunnerMessageConflictError: the message already has a reply (call
            `lookup_runner_reply` first).
        pi_workflows.wire.canonical.NotSerializableError: the reply has no canonical form.
    """
    if reply is None:
        raise ValueError("a runner reply cannot be null")
    if tx.fetch_one(q.SELECT_RUNNER_EPOCH, {"runner_epoch": runner_epoch}, RunnerEpochRow) is None:
        raise InvalidTransitionError(runner_epoch, "unknown", "record runner reply")
    existing = tx.fetch_one(
        q.SELECT_RUNNER_MESSAGE,
        {"runner_epoch": runner_epoch, "message_id": message_id},
        _MessageRow,
    )
    if existing is not None:
        raise RunnerMessageConflictError(runner_epoch, message_id, "a reply is already stored")
    tx.execute(
        q.INSERT_RUNNER_MESSAGE,
        {
            "runner_epoch": runner_epoch,
            "message_id": message_id,
            "kind": kind,
            "fingerprint": fingerprint,
            "reply": dumps(reply),
            "now": tx.now,
        },
    )
