"""The claim renewer, ticked by hand: a round every N ticks, one in flight, a lost lease,
and a lapse (a stall, a wall-clock step) that takes the next epoch when no one else did.

A real database actor on a real SQLite file with a manual clock, and no `Ticker`: each
`Tick` the test sends is the only passing of time, so which tick renews is exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka
import pytest

from pi_workflows.actors._claim_renewer import ClaimRenewerActor, LeaseLost, ServerEpochTaken
from pi_workflows.actors._database import DatabaseActor
from pi_workflows.storage import (
    DEFAULT_CLAIM_TTL_MS,
    Database,
    LeaseRow,
    ManualClock,
    RunnerOutcome,
    RunPhase,
    ServerClaim,
    ServerLeaseRow,
    acquire_server_epoch,
    claim_for_launch,
    get_lease,
    get_phase,
    get_server_lease,
    open_database,
    record_runner_exit,
)
from pi_workflows.testing import perform_with_calls
from tests.actors.ticks import blocked, handled, on_database, tick
from tests.storage.storage_helpers import enqueue

pytestmark = pytest.mark.timeout(30)

EVERY = 4
"""Ticks per renewal round in these tests."""
SERVER_TTL_MS = 15_000
OWNER = "server-renewer-test"


@dataclass
class Renewal:
    """The actors under test and what they reported."""

    clock: ManualClock
    database: pykka.ActorRef[Any]
    renewer: pykka.ActorRef[Any]
    claim: ServerClaim
    lost: list[str]
    failures: list[str]
    epochs: list[int]
    lock: list[bool]
    """`[True]` while the lock file is this server's; a test sets it False."""

    def tick(self, *sequences: int) -> None:
        """Send the ticks and wait for every round they started to finish."""
        tick(self.renewer, *sequences)
        handled(self.database, self.renewer)  # the round's unit, then its answer

    def rounds(self) -> int:
        return int(self.renewer.proxy().rounds.get(timeout=10))

    def server_lease(self) -> ServerLeaseRow:
        lease: ServerLeaseRow | None = on_database(self.database, get_server_lease)
        assert lease is not None
        return lease

    def run_lease(self, run_id: str) -> LeaseRow:
        lease: LeaseRow | None = on_database(self.database, lambda db: get_lease(db, run_id))
        assert lease is not None
        return lease


@dataclass
class _Server:
    """The server's address for the renewer's notices: what it was told, in order."""

    lost: list[str]
    epochs: list[int]

    def tell(self, message: Any) -> None:
        match message:
            case LeaseLost(reason=reason):
                self.lost.append(reason)
            case ServerEpochTaken(claim=claim):
                self.epochs.append(claim.epoch)


@dataclass
class _Lock:
    """The lock file: still ours while `held[0]` (a test sets it False)."""

    held: list[bool]

    def still_ours(self) -> bool:
        return self.held[0]


@pytest.fixture
def renewal(tmp_path: Path) -> Iterator[Renewal]:
    clock = ManualClock()
    db = open_database(tmp_path / "state.sqlite", clock=clock)
    with db.write() as tx:
        claim = acquire_server_epoch(tx, owner_id=OWNER, pid=None, ttl_ms=SERVER_TTL_MS)
    enqueue(db, "run-1")
    with db.write() as tx:  # a live host claim of this server, as a launch takes it
        claim_for_launch(
            tx, "run-1", owner_id=OWNER, runner_epoch="run-1-e1", launch_envelope_hash="sha256:x"
        )
    failures: list[str] = []
    lost: list[str] = []
    epochs: list[int] = []
    lock = [True]
    database = DatabaseActor.start(
        db, lambda name, exc: failures.append(name), units=perform_with_calls
    )
    renewer = ClaimRenewerActor.start(
        database,
        claim,
        EVERY,
        _Server(lost, epochs),
        lambda name, exc: failures.append(name),
        clock=clock,
        lock=_Lock(lock),
    )
    try:
        yield Renewal(clock, database, renewer, claim, lost, failures, epochs, lock)
    finally:
        renewer.stop(block=True, timeout=10)
        database.stop(block=True, timeout=10)
    assert not failures


def test_a_round_renews_the_lease_and_the_run_claims_every_n_ticks(renewal: Renewal) -> None:
    granted = renewal.server_lease()
    claimed = renewal.run_lease("run-1")
    renewal.clock.advance(1_000)
    renewal.tick(*range(1, EVERY))
    assert renewal.rounds() == 0, "no round before the Nth tick"
    assert renewal.server_lease() == granted and renewal.run_lease("run-1") == claimed

    now = renewal.clock.advance(1_000)
    renewal.tick(EVERY)
    assert renewal.rounds() == 1
    lease = renewal.server_lease()
    assert (lease.heartbeat_at, lease.expires_at) == (now, now + SERVER_TTL_MS)
    run = renewal.run_lease("run-1")
    assert (run.heartbeat_at, run.expires_at) == (now, now + DEFAULT_CLAIM_TTL_MS)
    assert run.generation == claimed.generation, "renewal never changes the fence"

    renewal.tick(*range(EVERY + 1, 2 * EVERY))
    assert renewal.rounds() == 1
    renewal.tick(2 * EVERY)
    assert renewal.rounds() == 2
    assert not renewal.lost


def test_a_slow_database_gets_one_round_at_a_time(renewal: Renewal) -> None:
    with blocked(renewal.database):
        tick(renewal.renewer, EVERY)  # a round is queued behind the blocking unit
        tick(renewal.renewer, 2 * EVERY, 3 * EVERY)  # due, but one is still in flight
        assert renewal.rounds() == 0
    handled(renewal.database, renewal.renewer)
    assert renewal.rounds() == 1, "the ticks that came while a round was in flight were skipped"
    renewal.tick(4 * EVERY)
    assert renewal.rounds() == 2


def test_a_lease_taken_by_another_server_stops_this_one(renewal: Renewal) -> None:
    def take_over(db: Database) -> None:
        with db.write() as tx:
            acquire_server_epoch(tx, owner_id="server-other", pid=None, previous_owner_gone=True)

    on_database(renewal.database, take_over)
    renewal.tick(*range(1, EVERY))
    assert renewal.lost == [], "nothing is checked between rounds"
    renewal.tick(EVERY)
    assert len(renewal.lost) == 1 and renewal.lost[0].startswith("server lease lost")
    lease = renewal.server_lease()
    assert (lease.epoch, lease.owner_id) == (renewal.claim.epoch + 1, "server-other")


def test_a_stall_past_the_lease_takes_the_next_epoch_and_keeps_the_run_claims(
    renewal: Renewal,
) -> None:
    claimed = renewal.run_lease("run-1")
    now = renewal.clock.advance(SERVER_TTL_MS + 1_000)  # stopped: no tick for a whole lease
    renewal.tick(1)  # the first tick after waking, not a renewal tick
    lease = renewal.server_lease()
    assert (lease.epoch, lease.owner_id) == (renewal.claim.epoch + 1, OWNER)
    assert (lease.acquired_at, lease.expires_at) == (now, now + SERVER_TTL_MS)
    assert renewal.epochs == [renewal.claim.epoch + 1] and not renewal.lost
    run = renewal.run_lease("run-1")
    assert run.generation == claimed.generation and run.expires_at == now + DEFAULT_CLAIM_TTL_MS

    now = renewal.clock.advance(1_000)
    renewal.tick(EVERY)  # later rounds renew the new epoch's lease
    assert renewal.server_lease().expires_at == now + SERVER_TTL_MS
    assert renewal.epochs == [renewal.claim.epoch + 1] and not renewal.lost


def test_a_wall_clock_step_past_the_lease_takes_the_next_epoch(renewal: Renewal) -> None:
    renewal.clock.set(renewal.clock.now_ms() + SERVER_TTL_MS + 5_000)  # monotonic unmoved
    renewal.tick(EVERY)  # the renewal finds the lease expired; no time passed for us
    handled(renewal.database, renewal.renewer)  # then the round that takes the next epoch
    assert renewal.server_lease().epoch == renewal.claim.epoch + 1
    assert renewal.epochs == [renewal.claim.epoch + 1] and not renewal.lost


def test_a_replaced_lock_file_stops_the_stalled_server(renewal: Renewal) -> None:
    renewal.lock[0] = False
    renewal.clock.advance(SERVER_TTL_MS + 1_000)
    renewal.tick(1)
    assert len(renewal.lost) == 1 and "lock file" in renewal.lost[0]
    assert renewal.server_lease().epoch == renewal.claim.epoch, "no epoch taken"
    renewal.clock.advance(SERVER_TTL_MS + 1_000)
    renewal.tick(2 * EVERY)
    assert len(renewal.lost) == 1, "a lost lease is reported once"


def test_a_competitor_that_took_the_epoch_during_the_stall_stops_this_one(
    renewal: Renewal,
) -> None:
    def take_over(db: Database) -> None:
        with db.write() as tx:
            acquire_server_epoch(tx, owner_id="server-other", pid=None, previous_owner_gone=True)

    on_database(renewal.database, take_over)
    renewal.clock.advance(SERVER_TTL_MS + 1_000)
    renewal.tick(1)
    assert len(renewal.lost) == 1 and "generationChanged" in renewal.lost[0]
    assert renewal.epochs == []
    assert renewal.server_lease().owner_id == "server-other"


def test_a_run_claim_that_lapsed_is_recovered_once_its_runner_is_gone(renewal: Renewal) -> None:
    claimed = renewal.run_lease("run-1")
    renewal.clock.advance(DEFAULT_CLAIM_TTL_MS + 1_000)  # a stall past the run claim too
    renewal.tick(1)
    assert renewal.server_lease().epoch == renewal.claim.epoch + 1
    assert on_database(renewal.database, lambda db: get_phase(db, "run-1")) is RunPhase.STARTING
    assert renewal.run_lease("run-1").generation == claimed.generation, "its runner still lives"

    def runner_exits_on_claim_lost(db: Database) -> None:
        with db.write() as tx:
            record_runner_exit(tx, "run-1-e1", outcome=RunnerOutcome.CLAIM_LOST)

    on_database(renewal.database, runner_exits_on_claim_lost)
    renewal.tick(EVERY)
    assert on_database(renewal.database, lambda db: get_phase(db, "run-1")) is RunPhase.QUEUED
    assert on_database(renewal.database, lambda db: get_lease(db, "run-1")) is None
    assert not renewal.lost
