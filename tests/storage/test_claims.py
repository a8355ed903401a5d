"""Claims: acquisition and generations, the protected write, renewal, release, the server epoch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.storage import (
    Claim,
    ClaimHeldError,
    ClaimLostError,
    ClaimLostReason,
    Database,
    InvalidTransitionError,
    ManualClock,
    RevisionConflictError,
    RunNotFoundError,
    RunPhase,
    Tx,
    acquire_claim,
    acquire_server_epoch,
    get_lease,
    get_run,
    get_server_lease,
    list_events,
    protected_write,
    release_claim,
    release_server_epoch,
    renew_claim,
    renew_owner_claims,
    renew_server_epoch,
)
from tests.storage.storage_helpers import drive_to, enqueue

TTL = 1_000


def acquire(db: Database, owner: str = "a", run_id: str = "run-1", ttl: int = TTL) -> Claim:
    with db.write() as tx:
        return acquire_claim(tx, run_id, owner_type="control", owner_id=owner, ttl_ms=ttl)


def write(db: Database, claim: Claim, expected_revision: int | None = None) -> int:
    with db.write() as tx:
        result = protected_write(
            tx,
            claim,
            event_type="node_update",
            payload={"n": 1},
            expected_revision=expected_revision,
        )
    return result.revision


def refused(db: Database, claim: Claim) -> ClaimLostReason:
    with pytest.raises(ClaimLostError) as caught:
        write(db, claim)
    return caught.value.reason


def test_claim_lost_error_is_in_the_one_error_tree() -> None:
    assert issubclass(ClaimLostError, PiWorkflowsError)


def test_acquire_increments_generation_and_stores_only_the_hash(
    db: Database, db_path: Path
) -> None:
    enqueue(db)
    claim = acquire(db)
    assert claim.generation == 1
    lease = get_lease(db, "run-1")
    assert lease is not None and lease.generation == 1 and lease.owner_id == "a"
    assert not hasattr(lease, "token_hash")
    stored = db.fetch_value("SELECT token_hash FROM leases", {})
    assert stored == claim.token_hash != claim.token
    db.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = db_path.read_bytes()
    assert claim.token.encode() not in raw
    assert claim.token not in repr(claim) and claim.token_hash not in repr(claim)


def test_acquire_against_a_live_claim_is_refused(db: Database, clock: ManualClock) -> None:
    enqueue(db)
    first = acquire(db, "a")
    with pytest.raises(ClaimHeldError) as caught:
        acquire(db, "b")
    assert caught.value.generation == 1 and caught.value.retryable
    clock.advance(TTL)  # expiry is exclusive: at expires_at the claim is expired
    second = acquire(db, "b")
    assert second.generation == first.generation + 1
    assert get_run(db, "run-1").generation == 2  # type: ignore[union-attr]


def test_acquire_on_missing_or_terminal_run(db: Database) -> None:
    with pytest.raises(RunNotFoundError):
        acquire(db, run_id="nope")
    drive_to(db, RunPhase.CANCELLED)
    with pytest.raises(InvalidTransitionError):
        acquire(db)


def test_protected_write_appends_event_and_bumps_revision_once(
    db: Database, clock: ManualClock
) -> None:
    enqueue(db)
    claim = acquire(db)
    clock.advance(400)
    assert write(db, claim) == 2
    assert write(db, claim) == 3
    events = list_events(db, "run-1")
    assert [e.revision for e in events] == [1, 2, 3]
    assert events[-1].generation == 1 and events[-1].event_type == "node_update"
    lease = get_lease(db, "run-1")
    assert lease is not None and lease.expires_at == clock.now_ms() + TTL
    assert lease.heartbeat_at == clock.now_ms()


def test_protected_write_change_runs_inside_the_transaction(db: Database) -> None:
    enqueue(db)
    claim = acquire(db)

    def change(tx: Tx) -> None:
        raise ValueError("domain change failed")

    with pytest.raises(ValueError), db.write() as tx:
        protected_write(tx, claim, event_type="x", change=change)
    assert get_run(db, "run-1").revision == 1  # type: ignore[union-attr]
    assert len(list_events(db, "run-1")) == 1


def test_expected_revision_is_checked_after_the_claim(db: Database) -> None:
    enqueue(db)
    claim = acquire(db)
    assert write(db, claim, expected_revision=1) == 2
    with pytest.raises(RevisionConflictError) as caught:
        write(db, claim, expected_revision=1)
    assert (caught.value.expected, caught.value.actual) == (1, 2)
    stale = dataclasses.replace(claim, token="wrong")
    assert refused_with_revision(db, stale) is ClaimLostReason.TOKEN_CHANGED


def refused_with_revision(db: Database, claim: Claim) -> ClaimLostReason:
    with pytest.raises(ClaimLostError) as caught:
        write(db, claim, expected_revision=99)
    return caught.value.reason


def test_each_rejection_reason(db: Database, clock: ManualClock) -> None:
    enqueue(db)
    claim = acquire(db, "a")
    assert (
        refused(db, dataclasses.replace(claim, generation=2)) is ClaimLostReason.GENERATION_CHANGED
    )
    assert refused(db, dataclasses.replace(claim, owner_id="b")) is ClaimLostReason.OWNER_CHANGED
    assert (
        refused(db, dataclasses.replace(claim, owner_type="host")) is ClaimLostReason.OWNER_CHANGED
    )
    assert refused(db, dataclasses.replace(claim, token="x")) is ClaimLostReason.TOKEN_CHANGED
    clock.advance(TTL)
    assert refused(db, claim) is ClaimLostReason.EXPIRED
    newer = acquire(db, "a")  # the same owner takes over: the old claim is fenced out
    assert refused(db, claim) is ClaimLostReason.GENERATION_CHANGED
    with db.write() as tx:
        release_claim(tx, newer)
    assert refused(db, newer) is ClaimLostReason.MISSING_AUTHORITY
    missing = dataclasses.replace(claim, run_id="no-such-run")
    assert refused(db, missing) is ClaimLostReason.MISSING_AUTHORITY


def test_refusal_changes_nothing(db: Database, clock: ManualClock) -> None:
    enqueue(db)
    claim = acquire(db)
    clock.advance(TTL + 1)
    before = db.connection.execute("SELECT * FROM leases").fetchall()
    assert refused(db, claim) is ClaimLostReason.EXPIRED
    assert db.connection.execute("SELECT * FROM leases").fetchall() == before
    assert get_run(db, "run-1").revision == 1  # type: ignore[union-attr]


def test_error_messages_never_carry_token_or_hash(db: Database) -> None:
    enqueue(db)
    claim = acquire(db)
    with pytest.raises(ClaimLostError) as caught:
        write(db, dataclasses.replace(claim, token="forged-token"))
    text = str(caught.value) + repr(caught.value.args)
    for secret in (claim.token, claim.token_hash, "forged-token"):
        assert secret not in text
    assert "run-1" in text and "tokenChanged" in text


def test_expired_claim_cannot_renew_itself(db: Database, clock: ManualClock) -> None:
    enqueue(db)
    claim = acquire(db)
    clock.advance(TTL // 2)
    with db.write() as tx:
        assert renew_claim(tx, claim) == clock.now_ms() + TTL
    clock.advance(TTL)
    with pytest.raises(ClaimLostError) as caught, db.write() as tx:
        renew_claim(tx, claim)
    assert caught.value.reason is ClaimLostReason.EXPIRED
    with db.write() as tx:
        assert renew_owner_claims(tx, owner_type="control", owner_id="a", ttl_ms=TTL) == []


def test_renew_owner_claims_renews_only_that_owners_live_claims(
    db: Database, clock: ManualClock
) -> None:
    for run_id in ("r-1", "r-2", "r-3"):
        enqueue(db, run_id)
    acquire(db, "a", "r-1")
    acquire(db, "a", "r-2", ttl=100)
    acquire(db, "b", "r-3")
    clock.advance(200)  # r-2 has expired
    with db.write() as tx:
        renewed = renew_owner_claims(tx, owner_type="control", owner_id="a", ttl_ms=TTL)
    assert [(r.resource, r.expires_at) for r in renewed] == [("r-1", clock.now_ms() + TTL)]
    assert get_lease(db, "r-3").expires_at == clock.now_ms() - 200 + TTL  # type: ignore[union-attr]
    assert get_run(db, "r-1").revision == 1  # type: ignore[union-attr]


def test_release_needs_the_exact_claim_but_not_liveness(db: Database, clock: ManualClock) -> None:
    enqueue(db)
    claim = acquire(db)
    with pytest.raises(ClaimLostError) as caught, db.write() as tx:
        release_claim(tx, dataclasses.replace(claim, token="x"))
    assert caught.value.reason is ClaimLostReason.TOKEN_CHANGED
    clock.advance(TTL * 5)
    with db.write() as tx:
        release_claim(tx, claim)
    assert get_lease(db, "run-1") is None
    assert acquire(db, "b").generation == 2


def test_server_epoch_grows_and_fences(db: Database, clock: ManualClock) -> None:
    with db.write() as tx:
        first = acquire_server_epoch(tx, owner_id="s1", pid=10, ttl_ms=TTL)
    assert first.epoch == 1 and first.token not in repr(first)
    with pytest.raises(ClaimHeldError), db.write() as tx:
        acquire_server_epoch(tx, owner_id="s2", pid=11, ttl_ms=TTL)
    clock.advance(TTL // 2)
    with db.write() as tx:
        assert renew_server_epoch(tx, first) == clock.now_ms() + TTL
    with db.write() as tx:
        takeover = acquire_server_epoch(
            tx, owner_id="s2", pid=11, ttl_ms=TTL, previous_owner_gone=True
        )
    assert takeover.epoch == 2
    with pytest.raises(ClaimLostError) as caught, db.write() as tx:
        renew_server_epoch(tx, first)
    assert caught.value.reason is ClaimLostReason.GENERATION_CHANGED
    with db.write() as tx:
        release_server_epoch(tx, takeover)
    lease = get_server_lease(db)
    assert lease is not None and lease.released_at == clock.now_ms() and lease.epoch == 2
    with db.write() as tx:
        assert acquire_server_epoch(tx, owner_id="s3", pid=None).epoch == 3
    clock.advance(10 * 60_000)
    with pytest.raises(ClaimLostError) as caught, db.write() as tx:
        renew_server_epoch(tx, takeover)
    assert caught.value.reason is ClaimLostReason.GENERATION_CHANGED
