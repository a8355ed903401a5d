"""The resource runners' planning round and the one capacity it shares with workflow
admission, on a real state file: claims stop at the capacity, live passes hold slots
against workflow runs and starting runs against passes, and a runner's proposal becomes
the `PassResult` committed only if it answers the version the pass read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pi_workflows.domain import (
    AdmitRuns,
    ApplyResource,
    pass_result_from_proposal,
    perform,
)
from pi_workflows.storage import (
    ClaimedReconcile,
    Database,
    ManualClock,
    acquire_server_epoch,
    count_due_reconciles,
    open_database,
)
from tests.storage.storage_helpers import enqueue

pytestmark = pytest.mark.timeout(60)

OWNER = "server-plan-test"
SOURCE = {"kind": "file", "path": "/p/.pi/resource-managers/docs.resource_manager.py"}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_database(tmp_path / "state.sqlite", clock=ManualClock())
    with database.write() as tx:  # workflow admission needs the live server lease
        acquire_server_epoch(tx, owner_id=OWNER, pid=None, ttl_ms=15_000)
    try:
        yield database
    finally:
        database.close()


def _apply(db: Database, *keys: str) -> None:
    for key in keys:
        perform(
            db,
            ApplyResource(
                manager="docs",
                project_path="/p",
                key=key,
                spec={"key": key},
                initial_status={},
                source_identity=SOURCE,
                source_digest="sha256:src",
            ),
        )


@dataclass(frozen=True)
class _Round:
    """The reconciles one admission round claimed."""

    claimed: tuple[ClaimedReconcile, ...]


def _plan(db: Database, capacity: int) -> _Round:
    admitted = perform(db, AdmitRuns(capacity, None, OWNER, reconcile_ttl_ms=60_000))
    return _Round(tuple(item for _, item in admitted if isinstance(item, ClaimedReconcile)))


def test_a_round_claims_due_keys_up_to_the_capacity_and_says_one_still_waits(
    db: Database,
) -> None:
    _apply(db, "a", "b", "c")
    first = _plan(db, capacity=2)
    assert len(first.claimed) == 2
    assert count_due_reconciles(db, db.clock.now_ms()) == 1
    again = _plan(db, capacity=2)
    assert again.claimed == (), "live passes hold both slots"
    assert len(_plan(db, capacity=3).claimed) == 1


def test_live_passes_hold_slots_against_workflow_runs_and_runs_against_passes(
    db: Database,
) -> None:
    _apply(db, "a")
    assert len(_plan(db, capacity=2).claimed) == 1  # before the runs queue: one round
    enqueue(db, "run-1")
    enqueue(db, "run-2")
    admitted = perform(db, AdmitRuns(2, None, OWNER))
    assert [plan.run_id for _, plan in admitted] == ["run-1"], "one slot is the pass's"
    _apply(db, "b")
    assert _plan(db, capacity=2).claimed == (), "the starting run holds the other slot"


def test_a_proposal_commits_only_for_the_version_the_pass_read(db: Database) -> None:
    _apply(db, "a")
    [claimed] = _plan(db, capacity=1).claimed
    claim = claimed.claim
    proposal = {
        "outcome": "settled",
        "generation": 1,
        "resourceVersion": claim.resource_version,
        "status": {"ok": True},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Done"}],
    }
    result = pass_result_from_proposal(claim, proposal, duration_ms=7)
    assert (result.outcome, result.status, result.duration_ms) == ("settled", {"ok": True}, 7)
    assert result.conditions == proposal["conditions"]
    later = pass_result_from_proposal(
        claim,
        {"outcome": "requeueAfter", "resourceVersion": claim.resource_version, "requeueAfterMs": 5},
        duration_ms=1,
    )
    assert (later.requeue_after_ms, later.status, later.conditions) == (5, None, None)
    for bad in (
        {**proposal, "resourceVersion": claim.resource_version + 1},
        {**proposal, "outcome": "error"},
        {"outcome": "requeueAfter", "resourceVersion": claim.resource_version},
        {**proposal, "finalizers": "worktree"},
    ):
        with pytest.raises(ValueError):
            pass_result_from_proposal(claim, bad, duration_ms=1)
