"""Server deaths counted against the runs in flight: `serverCrashLoop` in startup recovery.

Real SQLite, the storage calls startup recovery makes, in its order: close the stale
runner epochs as `orphaned`, then recover each stale run under a control claim.
"""

from __future__ import annotations

import pytest

from pi_workflows.storage import (
    Claim,
    Database,
    ManualClock,
    OwnerType,
    ParkReason,
    RunPhase,
    close_stale_runner_epoch,
    finish_node_attempt,
    get_phase,
    get_queue_row,
    mark_runner_live,
    recover_stale_run,
    resume_run,
    server_deaths_in_flight,
    stale_runner_epochs,
    start_node_attempt,
)
from tests.storage.storage_helpers import enqueue, launch

pytestmark = pytest.mark.timeout(30)

LIMIT = 3


def _live_runner(db: Database, run_id: str, clock: ManualClock) -> Claim:
    """Admit the run and bring its runner to `ready`, as a launch does."""
    clock.advance(10)
    epoch = f"{run_id}-e{clock.now_ms()}"
    claim = launch(db, run_id, epoch=epoch)
    with db.write() as tx:
        mark_runner_live(tx, claim, runner_epoch=epoch, pid=4242, process_start_time=7)
    return claim


def _server_dies_and_restarts(db: Database, run_id: str) -> str:
    """Startup recovery after a SIGKILL: orphan the live epochs, then recover the run."""
    with db.write() as tx:
        for runner in stale_runner_epochs(tx):
            close_stale_runner_epoch(tx, runner)
    with db.write() as tx:
        recovered = recover_stale_run(
            tx,
            run_id,
            owner_id="server-next",
            owner_is_gone=lambda owner_type, owner: owner_type == OwnerType.HOST,
            ttl_ms=30_000,
            crash_limit=LIMIT,
        )
    return recovered.action


def _start_node(db: Database, claim: Claim, attempt_id: str) -> None:
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id=attempt_id, node_path="a", node_type="compute")


def test_the_limit_of_deaths_in_flight_parks_the_run_with_its_own_reason(
    db: Database, clock: ManualClock
) -> None:
    enqueue(db, "run-1")
    for death in range(1, LIMIT):
        _start_node(db, _live_runner(db, "run-1", clock), f"a{death}")
        assert _server_dies_and_restarts(db, "run-1") == "requeued"
        assert server_deaths_in_flight(db, "run-1") == death
    _start_node(db, _live_runner(db, "run-1", clock), "a-last")
    assert _server_dies_and_restarts(db, "run-1") == "crashLoop"
    assert get_phase(db, "run-1") is RunPhase.PARKED
    queue = get_queue_row(db, "run-1")
    assert queue is not None and queue.park_reason == ParkReason.SERVER_CRASH_LOOP

    with db.write() as tx:  # the operator's resume admits it for one more attempt
        resume_run(tx, "run-1")
    _live_runner(db, "run-1", clock)
    assert _server_dies_and_restarts(db, "run-1") == "crashLoop", "the count is kept"


def test_a_finished_node_between_deaths_starts_the_count_again(
    db: Database, clock: ManualClock
) -> None:
    enqueue(db, "run-1")
    for death in range(LIMIT - 1):
        _live_runner(db, "run-1", clock)
        assert _server_dies_and_restarts(db, "run-1") == "requeued", death
    claim = _live_runner(db, "run-1", clock)
    _start_node(db, claim, "a1")
    with db.write() as tx:
        finish_node_attempt(tx, claim, attempt_id="a1", output={})
    # This runner finished a node, then its server died: one death since that node.
    assert _server_dies_and_restarts(db, "run-1") == "requeued"
    assert server_deaths_in_flight(db, "run-1") == 1
    _live_runner(db, "run-1", clock)
    assert _server_dies_and_restarts(db, "run-1") == "requeued"
