"""Command receipts: durable fingerprints, adoption, conflicts, and one transaction."""

from __future__ import annotations

import pytest

from pi_workflows.storage import (
    CommandRequest,
    Database,
    LookupOutcome,
    ReceiptConflictError,
    ReceiptOutcome,
    Tx,
    command_fingerprint,
    get_run,
    lookup_receipt,
    pause_run,
    record_receipt,
)
from tests.storage.storage_helpers import enqueue


def command(
    request_id: str = "req-1",
    key: str = "key-1",
    payload: object = None,
    operation: str = "run.pause",
    client: str = "client-1",
) -> CommandRequest:
    return CommandRequest(
        request_id=request_id,
        client_id=client,
        operation=operation,
        idempotency_key=key,
        payload={"runId": "run-1"} if payload is None else payload,
    )


def handle_pause(db: Database, cmd: CommandRequest) -> tuple[LookupOutcome, object]:
    """The shape of a command handler: look up, change, record, all in one write()."""
    with db.write() as tx:
        found = lookup_receipt(tx, cmd)
        if found.outcome is not LookupOutcome.NONE:
            assert found.receipt is not None
            return found.outcome, found.receipt.receipt
        result = pause_run(tx, "run-1")
        receipt = {"outcome": "accepted", "revision": result.revision}
        record_receipt(
            tx,
            cmd,
            outcome=ReceiptOutcome.ACCEPTED,
            receipt=receipt,
            run_id="run-1",
            accepted_revision=result.revision,
        )
        return LookupOutcome.NONE, receipt


def test_fingerprint_covers_durable_identity_not_the_request_id() -> None:
    base = command().fingerprint
    assert command(request_id="req-2").fingerprint == base
    assert command(key="key-2").fingerprint != base
    assert command(operation="run.cancel").fingerprint != base
    assert command(client="client-2").fingerprint != base
    assert command(payload={"runId": "run-2"}).fingerprint != base
    # canonical JSON: key order and spelling of equal numbers do not matter
    assert (
        command(payload={"b": 1, "a": 2.0}).fingerprint
        == command(payload={"a": 2, "b": 1}).fingerprint
    )
    assert base == command_fingerprint("client-1", "run.pause", "key-1", {"runId": "run-1"})
    assert base.startswith("sha256:")


def test_same_key_same_payload_adopts_the_stored_receipt(db: Database) -> None:
    enqueue(db)
    outcome, receipt = handle_pause(db, command())
    assert outcome is LookupOutcome.NONE and receipt == {"outcome": "accepted", "revision": 2}
    # the connection dropped after commit; the retry has a new request ID
    again, stored = handle_pause(db, command(request_id="req-2"))
    assert again is LookupOutcome.ADOPTED and stored == receipt
    assert get_run(db, "run-1").revision == 2  # type: ignore[union-attr]  # applied once


def test_same_key_other_payload_is_a_conflict(db: Database) -> None:
    enqueue(db)
    handle_pause(db, command())
    outcome, _ = handle_pause(db, command(request_id="req-2", payload={"runId": "other"}))
    assert outcome is LookupOutcome.CONFLICT
    outcome, _ = handle_pause(db, command(request_id="req-3", operation="run.cancel"))
    assert outcome is LookupOutcome.CONFLICT


def test_one_request_id_cannot_name_two_payloads(db: Database) -> None:
    enqueue(db)
    handle_pause(db, command())
    outcome, _ = handle_pause(db, command(key="key-2"))  # same request ID, new key
    assert outcome is LookupOutcome.CONFLICT
    outcome, _ = handle_pause(db, command())  # the exact repeat adopts
    assert outcome is LookupOutcome.ADOPTED
    with pytest.raises(ReceiptConflictError), db.write() as tx:
        record_receipt(tx, command(key="key-3"), outcome=ReceiptOutcome.REJECTED, receipt={})


def test_other_clients_keys_are_independent(db: Database) -> None:
    with db.write() as tx:
        record_receipt(tx, command(), outcome=ReceiptOutcome.REJECTED, receipt={"error": "x"})
        found = lookup_receipt(tx, command(request_id="req-9", client="client-2"))
    assert found.outcome is LookupOutcome.NONE


def test_receipt_and_change_commit_or_vanish_together(db: Database) -> None:
    enqueue(db)

    def fail_after_recording(tx: Tx) -> None:
        pause_run(tx, "run-1")
        record_receipt(tx, command(), outcome=ReceiptOutcome.ACCEPTED, receipt={"ok": True})
        raise OSError("crash before commit")

    with pytest.raises(OSError), db.write() as tx:
        fail_after_recording(tx)
    with db.write() as tx:
        assert lookup_receipt(tx, command()).outcome is LookupOutcome.NONE
    assert get_run(db, "run-1").paused == 0  # type: ignore[union-attr]


def test_stored_receipt_fields(db: Database, clock: object) -> None:
    with db.write() as tx:
        stored = record_receipt(
            tx,
            command(),
            outcome=ReceiptOutcome.REJECTED,
            receipt={"error": {"code": "notPaused"}},
            run_id="run-1",
            accepted_revision=None,
        )
    with db.write() as tx:
        found = lookup_receipt(tx, command(request_id="req-2"))
    assert found.receipt is not None
    assert found.receipt.request_id == "req-1"
    assert found.receipt.outcome is ReceiptOutcome.REJECTED
    assert found.receipt.receipt == {"error": {"code": "notPaused"}}
    assert found.receipt.receipt_hash == stored.receipt_hash
    assert found.receipt.fingerprint == command().fingerprint
