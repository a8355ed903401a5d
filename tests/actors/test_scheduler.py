"""Admission: the plan (capacity, queue order, alternation) and the actor, ticked by hand."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pykka
import pytest

from pi_workflows.actors._base import ServerActor
from pi_workflows.actors._database import DatabaseActor
from pi_workflows.actors._scheduler import Launch, SchedulerActor, Wake
from pi_workflows.domain import plan_admissions
from pi_workflows.storage import (
    Claim,
    Database,
    ManualClock,
    QueueKind,
    QueueRow,
    acquire_server_epoch,
    cancel_run,
    enqueue_run,
    get_queue_row,
    open_database,
)
from pi_workflows.testing import perform_with_calls
from tests.actors.ticks import blocked, handled, on_database, tick
from tests.storage.storage_helpers import new_run

pytestmark = pytest.mark.timeout(10)


def _row(run_id: str, kind: QueueKind) -> QueueRow:
    return QueueRow(
        run_id=run_id,
        state="queued",
        kind=kind.value,
        priority=0,
        enqueued_at=0,
        park_reason=None,
        updated_at=0,
    )


def test_full_capacity_admits_nothing() -> None:
    waiting = {QueueKind.WORKFLOW: [_row("a", QueueKind.WORKFLOW)]}
    assert plan_admissions(0, waiting, None) == []


def test_admissions_stop_at_capacity_in_queue_order() -> None:
    rows = [_row(name, QueueKind.WORKFLOW) for name in "abcd"]
    chosen = plan_admissions(2, {QueueKind.WORKFLOW: rows}, None)
    assert [row.run_id for row in chosen] == ["a", "b"]


def test_kinds_alternate_when_both_wait() -> None:
    waiting = {
        QueueKind.WORKFLOW: [_row(f"w{i}", QueueKind.WORKFLOW) for i in range(3)],
        QueueKind.RESOURCE: [_row(f"r{i}", QueueKind.RESOURCE) for i in range(3)],
    }
    chosen = plan_admissions(4, waiting, None)
    assert [row.run_id for row in chosen] == ["w0", "r0", "w1", "r1"]


def test_the_kind_admitted_last_goes_second() -> None:
    waiting = {
        QueueKind.WORKFLOW: [_row("w0", QueueKind.WORKFLOW)],
        QueueKind.RESOURCE: [_row("r0", QueueKind.RESOURCE)],
    }
    assert [r.run_id for r in plan_admissions(1, waiting, QueueKind.WORKFLOW)] == ["r0"]
    assert [r.run_id for r in plan_admissions(1, waiting, QueueKind.RESOURCE)] == ["w0"]


def test_one_kind_alone_uses_every_slot() -> None:
    waiting = {QueueKind.RESOURCE: [_row(f"r{i}", QueueKind.RESOURCE) for i in range(5)]}
    assert len(plan_admissions(3, waiting, QueueKind.RESOURCE)) == 3


# --- The actor, ticked by hand --------------------------------------------------------
# A real database actor on a real SQLite file and no `Ticker`: admission happens only on
# the `Tick` (or `Wake`) the test sends. The scheduler claims each admitted run in the
# unit of work that chose it, so the capacity the next round reads is real; the `Launch`
# messages it sends go to a recording actor in place of the runner host.


class _Launches(ServerActor):
    """Records every `Launch` the scheduler sends, in order."""

    name = "launches"

    def __init__(self) -> None:
        super().__init__(lambda name, exc: None)
        self.asked: list[str] = []
        self.claims: dict[str, Claim] = {}

    def on_receive(self, message: Any) -> Any:
        assert isinstance(message, Launch)
        self.asked.append(message.plan.run_id)
        self.claims[message.plan.run_id] = message.plan.claim
        return None


@dataclass
class Admission:
    """The actors under test and the runs launched."""

    clock: ManualClock
    database: pykka.ActorRef[Any]
    launches: pykka.ActorRef[Any]
    scheduler: pykka.ActorRef[Any] = field(init=False)

    @property
    def asked(self) -> list[str]:
        """Every run the scheduler launched, in order (duplicates included)."""
        return list(self.launches.proxy().asked.get(timeout=10))

    def settle(self) -> None:
        """Wait for a planning round: its read and claims, its plan, its launches."""
        handled(self.database, self.scheduler, self.launches)

    def tick(self, *sequences: int) -> None:
        tick(self.scheduler, *sequences)
        self.settle()

    def finish(self, run_id: str) -> None:
        """End a launched run (its runner exited), freeing its slot."""
        claim = self.launches.proxy().claims.get(timeout=10)[run_id]

        def cancel(db: Database) -> None:
            with db.write() as tx:
                cancel_run(tx, run_id, claim=claim)

        on_database(self.database, cancel)


OWNER = "server-scheduler-test"
LEASE_MS = 15_000


@contextmanager
def _admission(path: Path, capacity: int, *, launcher: bool = True) -> Iterator[Admission]:
    clock = ManualClock()
    db = open_database(path, clock=clock)
    with db.write() as tx:  # a server admits only while it holds the live server lease
        acquire_server_epoch(tx, owner_id=OWNER, pid=None, ttl_ms=LEASE_MS)
    failures: list[str] = []
    database = DatabaseActor.start(
        db, lambda name, exc: failures.append(name), units=perform_with_calls
    )
    launches = _Launches.start()
    admission = Admission(clock, database, launches)
    admission.scheduler = SchedulerActor.start(
        database,
        capacity,
        launches if launcher else None,
        lambda name, exc: failures.append(name),
        OWNER,
    )
    try:
        yield admission
    finally:
        admission.scheduler.stop(block=True, timeout=10)
        launches.stop(block=True, timeout=10)
        database.stop(block=True, timeout=10)
    assert not failures


@pytest.fixture
def admission(tmp_path: Path) -> Iterator[Admission]:
    with _admission(tmp_path / "state.sqlite", capacity=2) as started:
        yield started


def _enqueue(admission: Admission, *run_ids: str, kind: QueueKind = QueueKind.WORKFLOW) -> None:
    def write(db: Database) -> None:
        for run_id in run_ids:
            with db.write() as tx:
                enqueue_run(tx, new_run(run_id, kind=kind))
            admission.clock.advance(1)  # queue order: oldest first

    on_database(admission.database, write)


def _queue_state(admission: Admission, run_id: str) -> str:
    row = on_database(admission.database, lambda db: get_queue_row(db, run_id))
    return str(row.state)


def test_a_tick_admits_queued_runs_up_to_capacity_in_queue_order(admission: Admission) -> None:
    _enqueue(admission, "run-1", "run-2", "run-3")
    admission.settle()
    assert admission.asked == [], "nothing is admitted before a tick or a wake"
    admission.tick(1)
    assert admission.asked == ["run-1", "run-2"]
    assert _queue_state(admission, "run-3") == "queued", "the request stays durable"
    admission.tick(2, 3)
    assert admission.asked == ["run-1", "run-2"], "a full capacity admits nothing"
    admission.finish("run-1")
    admission.settle()
    assert admission.asked == ["run-1", "run-2"], "a freed slot waits for the next tick"
    admission.tick(4)
    assert admission.asked == ["run-1", "run-2", "run-3"]
    assert _queue_state(admission, "run-3") == "starting"


def test_one_planning_round_at_a_time_never_admits_a_run_twice(admission: Admission) -> None:
    _enqueue(admission, "run-1", "run-2", "run-3")
    with blocked(admission.database):
        tick(admission.scheduler, 1, 2, 3)  # the first round's read waits; the rest skip
        admission.scheduler.tell(Wake())
        handled(admission.scheduler)
    admission.settle()
    assert admission.asked == ["run-1", "run-2"]
    admission.tick(4)
    assert admission.asked == ["run-1", "run-2"]


def test_kinds_alternate_across_ticks(tmp_path: Path) -> None:
    with _admission(tmp_path / "state.sqlite", capacity=1) as admission:
        _enqueue(admission, "w-1", "w-2")
        _enqueue(admission, "r-1", "r-2", kind=QueueKind.RESOURCE)
        order = []
        for sequence in range(1, 5):
            admission.tick(sequence)
            order.append(admission.asked[-1])
            admission.finish(admission.asked[-1])
        assert order == ["w-1", "r-1", "w-2", "r-2"]
        assert len(admission.asked) == 4, "one admission per freed slot and tick"


def test_without_a_launcher_a_tick_claims_nothing(tmp_path: Path) -> None:
    with _admission(tmp_path / "state.sqlite", capacity=2, launcher=False) as admission:
        _enqueue(admission, "run-1")
        admission.tick(1, 2)
        assert admission.asked == []
        assert _queue_state(admission, "run-1") == "queued"


def test_a_server_whose_lease_lapsed_admits_nothing_until_it_holds_one_again(
    admission: Admission,
) -> None:
    _enqueue(admission, "run-1")
    admission.clock.advance(LEASE_MS)  # a stall: the lease expired, no renewal yet
    admission.tick(1)
    assert admission.asked == []
    assert _queue_state(admission, "run-1") == "queued"

    def take_next_epoch(db: Database) -> None:  # what the claim renewer does on waking
        with db.write() as tx:
            acquire_server_epoch(
                tx, owner_id=OWNER, pid=None, ttl_ms=LEASE_MS, previous_owner_gone=True
            )

    on_database(admission.database, take_next_epoch)
    admission.tick(2)
    assert admission.asked == ["run-1"]
