"""The run-list revision counter and the presentation revision of a run view.

The run list's revision is a one-row counter that triggers on `runs` keep: O(1), it
grows with every committed run change and never goes back, not even when runs are
deleted. A run view's revision (`run_view_revision`, the check an unchanged run
subscription makes) moves with every change the view can show, also those that append
no event: a runner epoch starting, becoming ready or exiting, a queue move, an effect,
a request, a decision, stored content, a restart of the run.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pi_workflows.domain._run_view import build_run_view
from pi_workflows.storage import (
    Claim,
    Database,
    RunnerOutcome,
    declare_effect_ambiguous,
    enqueue_run,
    get_run,
    mark_runner_live,
    open_checkpoint_decision,
    put_view_content,
    record_runner_exit,
    renew_claim,
    reserve_effect,
    run_list_revision,
    run_view_revision,
    start_node_attempt,
)
from pi_workflows.storage._interactions import record_unproductive_turn, request_interaction
from tests.storage.storage_helpers import enqueue, launch, new_run, running

pytestmark = pytest.mark.timeout(30)


def _event_revision(db: Database, run_id: str = "run-1") -> int:
    run = get_run(db, run_id)
    assert run is not None
    return run.revision


# --- the run-list counter ----------------------------------------------------------


def test_the_run_list_revision_grows_with_every_run_change_and_never_goes_back(
    db: Database,
) -> None:
    seen = [run_list_revision(db)]
    enqueue(db, "a")
    seen.append(run_list_revision(db))
    running(db, "b")
    seen.append(run_list_revision(db))
    with db.write() as tx:
        tx.execute("DELETE FROM runs WHERE run_id = 'a'", {})
    seen.append(run_list_revision(db))
    assert seen == sorted(set(seen)), f"strictly increasing: {seen}"


def test_a_rolled_back_change_leaves_the_run_list_revision(db: Database) -> None:
    enqueue(db, "a")
    before = run_list_revision(db)
    with pytest.raises(RuntimeError), db.write() as tx:
        tx.execute("UPDATE runs SET title = 'x' WHERE run_id = 'a'", {})
        raise RuntimeError("abort")
    assert run_list_revision(db) == before


def test_reading_the_run_list_revision_touches_no_run_row(db: Database) -> None:
    """O(1): the plan reads the one-row counter, not the runs table."""
    plan = db.connection.execute(
        "EXPLAIN QUERY PLAN SELECT revision FROM run_list_revision WHERE singleton = 1"
    ).fetchall()
    details = " ".join(str(row[-1]) for row in plan)
    assert "run_list_revision" in details and "runs " not in details + " "


def test_a_claim_renewal_moves_neither_revision(db: Database) -> None:
    """Renewals happen every few seconds: they must not wake every subscription."""
    claim = running(db)
    view_before, list_before = run_view_revision(db, "run-1"), run_list_revision(db)
    with db.write() as tx:
        renew_claim(tx, claim)
    assert run_view_revision(db, "run-1") == view_before
    assert run_list_revision(db) == list_before


# --- the presentation revision of a run view ---------------------------------------


def _launch(db: Database, claim: Claim | None) -> None:
    launch(db, "run-1", epoch="run-1-e1")


def _ready(db: Database, claim: Claim | None) -> None:
    assert claim is not None
    with db.write() as tx:
        mark_runner_live(tx, claim, runner_epoch="run-1-e1", pid=4242, process_start_time=7)


def _runner_exit(db: Database, claim: Claim | None) -> None:
    with db.write() as tx:
        record_runner_exit(tx, "run-1-e1", outcome=RunnerOutcome.CRASHED, exit_code=1)


def _attempt(db: Database, claim: Claim | None) -> None:
    assert claim is not None
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id="a1", node_path="work", node_type="compute")


def _ambiguous(db: Database, claim: Claim | None) -> None:
    assert claim is not None
    _attempt(db, claim)
    with db.write() as tx:
        reserve_effect(
            tx,
            claim,
            attempt_id="a1",
            effect_type="payment.charge",
            idempotency_key="run-1/charge/1",
            request={"amount": 5},
            executor_epoch="run-1-e1",
        )
    before = run_view_revision(db, "run-1")
    with db.write() as tx:
        declare_effect_ambiguous(tx, claim, idempotency_key="run-1/charge/1", reason="lost")
    assert run_view_revision(db, "run-1") != before


def _unproductive_turn(db: Database, claim: Claim | None) -> None:
    assert claim is not None
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id="a1", node_path="draft", node_type="agent")
        request_interaction(
            tx, claim, attempt_id="a1", request_id="req-1", kind="agent", contract={}
        )
    before = run_view_revision(db, "run-1")
    with db.write() as tx:
        record_unproductive_turn(tx, claim, request_id="req-1", error="provider said no")
    assert run_view_revision(db, "run-1") != before


def _decision(db: Database, claim: Claim | None) -> None:
    with db.write() as tx:
        open_checkpoint_decision(tx, "run-1", attempt_id=None, node_path="ask", request={})


def _content(db: Database, claim: Claim | None) -> None:
    with db.write() as tx:
        put_view_content(tx, "run-1", "text/plain; charset=utf-8", b"traceback text")


def _restart(db: Database, claim: Claim | None) -> None:
    enqueue(db, "run-2", restart_of="run-1")


def _queue_move(db: Database, claim: Claim | None) -> None:
    # A queue row change on its own (what recovery or admission does between events).
    with db.write() as tx:
        tx.execute("UPDATE run_queue SET priority = priority + 1 WHERE run_id = 'run-1'", {})


def _generation(db: Database, claim: Claim | None) -> None:
    with db.write() as tx:
        tx.execute("UPDATE runs SET generation = generation + 1 WHERE run_id = 'run-1'", {})


CHANGES: dict[str, tuple[str, Callable[[Database, Claim | None], None]]] = {
    "runner epoch starts": ("queued", _launch),
    "runner epoch becomes ready": ("starting", _ready),
    "runner epoch exits": ("running", _runner_exit),
    "attempt starts": ("running", _attempt),
    "effect becomes ambiguous": ("running", _ambiguous),
    "unproductive turn": ("running", _unproductive_turn),
    "checkpoint decision opens": ("running", _decision),
    "view content stored": ("running", _content),
    "run restarted": ("running", _restart),
    "queue row moves": ("queued", _queue_move),
    "claim generation changes": ("queued", _generation),
}


def _setup(db: Database, phase: str) -> Claim | None:
    if phase == "queued":
        enqueue(db)
        return None
    if phase == "starting":
        enqueue(db)
        return launch(db, "run-1", epoch="run-1-e1")
    return running(db)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_every_kind_of_view_change_moves_the_view_revision(db: Database, change: str) -> None:
    phase, apply = CHANGES[change]
    claim = _setup(db, phase)
    before = run_view_revision(db, "run-1")
    list_before = run_list_revision(db)
    view_before = build_run_view(db, "run-1")
    assert view_before is not None and view_before["revision"] == before
    apply(db, claim)
    after = run_view_revision(db, "run-1")
    assert after is not None and before is not None and after > before
    assert run_list_revision(db) > list_before
    view_after = build_run_view(db, "run-1")
    assert view_after is not None and view_after["revision"] == after, "the view's revision"


def test_changes_without_an_event_still_move_the_view_revision(db: Database) -> None:
    """The case the event revision alone misses: a runner epoch exit appends no event."""
    running(db)
    events_before, view_before = _event_revision(db), run_view_revision(db, "run-1")
    _runner_exit(db, None)
    assert _event_revision(db) == events_before
    assert (run_view_revision(db, "run-1") or 0) > (view_before or 0)


def test_a_missing_run_has_no_view_revision(db: Database) -> None:
    assert run_view_revision(db, "run-none") is None


def test_a_new_run_starts_its_view_revision_at_its_event_revision_or_above(db: Database) -> None:
    with db.write() as tx:
        enqueue_run(tx, new_run("run-1"))
    revision = run_view_revision(db, "run-1")
    assert revision is not None and revision >= _event_revision(db)
