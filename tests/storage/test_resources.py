"""Resource-manager storage on real database files: apply and generations, the queue,
claims and their exclusion and expiry, the pass commit's claim check and version CAS,
backoff, child-run reservations, deletion with finalizers, retention and history.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from pi_workflows.storage import (
    BACKOFF_CAP_MS,
    DAY_MS,
    DEFAULT_CLAIM_TTL_MS,
    HISTORY_KEPT,
    ChildRunConflictError,
    ClaimedReconcile,
    ClaimLostError,
    ClaimLostReason,
    Database,
    ManualClock,
    PassResult,
    ResourceApplied,
    ResourceDeletingError,
    ResourceLimitError,
    ResourceVersionConflictError,
    RunnerOutcome,
    apply_resource,
    claim_next_resource,
    commit_reconcile,
    complete_run,
    count_due_reconciles,
    count_reconciling,
    enqueue_resource,
    finish_node_attempt,
    get_resource,
    get_resource_by_uid,
    get_resource_queue_row,
    list_reconcile_history,
    list_resource_child_runs,
    list_resource_events,
    list_resources,
    next_reconcile_due_at,
    open_database,
    prunable_trees,
    reconcile_backoff_ms,
    record_runner_exit,
    recover_resource_claims,
    release_resource_claim,
    request_resource_deletion,
    reserve_child_run,
    run_parent_resource,
    runner_work_pending,
    scheduled_reconciles,
    start_node_attempt,
    tree_blockers,
    verify,
)
from tests.storage.storage_helpers import running

pytestmark = pytest.mark.timeout(60)

SOURCE = {"kind": "file", "path": "/p/.pi/resource-managers/m.resource_manager.py"}
TABLES = (
    "resources", "resource_events", "resource_queue", "resource_claims",
    "reconcile_history", "resource_child_runs",
)  # fmt: skip


def _apply(
    db: Database,
    spec: Any,
    *,
    key: str = "k1",
    digest: str = "sha256:src1",
    finalizers: tuple[str, ...] = (),
) -> ResourceApplied:
    with db.write() as tx:
        return apply_resource(
            tx,
            manager="m",
            project_path="/p",
            key=key,
            spec=spec,
            initial_status={"phase": "new"},
            source_identity=SOURCE,
            source_digest=digest,
            finalizers=finalizers,
        )


def _claim(db: Database, owner: str = "server-1") -> ClaimedReconcile | None:
    with db.write() as tx:
        return claim_next_resource(tx, owner_id=owner)


def _commit(db: Database, claimed: ClaimedReconcile, result: PassResult) -> Any:
    with db.write() as tx:
        return commit_reconcile(tx, claimed.claim, result, jitter=0.5)


def _snapshot(db: Database) -> dict[str, list[tuple[Any, ...]]]:
    return {t: db.connection.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in TABLES}


READY = [{"type": "Ready", "status": "True", "reason": "Done"}]


def test_apply_creates_then_a_spec_change_raises_the_generation_and_the_same_spec_is_a_no_op(
    db: Database,
) -> None:
    created = _apply(db, {"n": 1})
    assert created.created and created.spec_changed
    first = created.resource
    assert (first.resource_version, first.generation, first.status) == (1, 1, {"phase": "new"})
    assert get_resource_queue_row(db, first.uid) is not None

    same = _apply(db, {"n": 1})
    assert not same.changed and same.resource == first

    changed = _apply(db, {"n": 2}).resource
    assert (changed.uid, changed.resource_version, changed.generation) == (first.uid, 2, 2)

    reapplied = _apply(db, {"n": 2}, digest="sha256:src2")  # the manager file changed
    assert reapplied.changed and not reapplied.spec_changed
    assert (reapplied.resource.resource_version, reapplied.resource.generation) == (3, 2)
    assert reapplied.resource.source_digest == "sha256:src2"

    events = list_resource_events(db, first.uid)
    assert [(e.resource_version, e.event_type) for e in events] == [
        (1, "resource.created"),
        (2, "resource.specChanged"),
        (3, "resource.sourceChanged"),
    ]
    assert verify(db) == []


def test_a_spec_over_one_mebibyte_is_refused_and_nothing_is_written(db: Database) -> None:
    with pytest.raises(ResourceLimitError):
        _apply(db, {"big": "x" * (1024 * 1024)})
    assert all(rows == [] for rows in _snapshot(db).values())


def test_enqueues_update_one_row_and_keep_the_earliest_time(
    db: Database, clock: ManualClock
) -> None:
    uid = _apply(db, {"n": 1}).resource.uid
    due = get_resource_queue_row(db, uid)
    assert due is not None
    clock.advance(1_000)
    with db.write() as tx:
        enqueue_resource(tx, uid, reason="later", delay_ms=60_000)
        row = enqueue_resource(tx, uid, reason="again")
    assert row.available_at == due.available_at  # never delayed past an earlier time
    assert row.hints == 3
    assert db.connection.execute("SELECT count(*) FROM resource_queue").fetchone()[0] == 1


def test_two_claims_of_one_key_never_both_succeed(
    db: Database, db_path: Path, clock: ManualClock
) -> None:
    _apply(db, {"n": 1})
    other = open_database(db_path, clock=clock)  # a second connection to the same file
    try:
        first = _claim(db, "server-1")
        second = _claim(other, "server-2")
    finally:
        other.close()
    assert first is not None and second is None
    assert count_reconciling(db, clock.now_ms()) == 1
    assert count_due_reconciles(db, clock.now_ms()) == 0
    assert count_due_reconciles(db, clock.now_ms() + DEFAULT_CLAIM_TTL_MS) == 1  # expired
    assert first.claim.resource_version == 1 and first.claim.resource_generation == 1


def test_racing_claimers_on_their_own_connections_win_each_key_once(
    db: Database, db_path: Path, clock: ManualClock
) -> None:
    """Four threads, each with its own connection, claim until nothing is due: every key
    is claimed exactly once (claims are taken under the writer's BEGIN IMMEDIATE)."""
    for n in range(20):
        _apply(db, {"n": n}, key=f"k{n}")
    won: list[str] = []
    lock = threading.Lock()

    def claimer(owner: str) -> None:
        conn = open_database(db_path, clock=clock)
        try:
            while (claimed := _claim(conn, owner)) is not None:
                with lock:
                    won.append(claimed.claim.uid)
        finally:
            conn.close()

    threads = [threading.Thread(target=claimer, args=(f"server-{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(won) == sorted(s.uid for s in list_resources(db)) and len(won) == 20


def test_an_expired_claim_returns_the_key_and_fences_the_old_holder(
    db: Database, clock: ManualClock
) -> None:
    uid = _apply(db, {"n": 1}).resource.uid
    stale = _claim(db)
    assert stale is not None and _claim(db) is None
    clock.advance(DEFAULT_CLAIM_TTL_MS + 1)
    fresh = _claim(db, "server-2")
    assert fresh is not None and fresh.claim.uid == uid
    assert fresh.claim.generation == stale.claim.generation + 1
    before = _snapshot(db)
    with pytest.raises(ClaimLostError) as lost:
        _commit(db, stale, PassResult("settled", status={"phase": "stale"}))
    assert lost.value.reason is ClaimLostReason.GENERATION_CHANGED
    assert _snapshot(db) == before


def test_recovery_returns_expired_claims_to_the_queue(db: Database, clock: ManualClock) -> None:
    uid = _apply(db, {"n": 1}).resource.uid
    assert _claim(db) is not None
    assert next_reconcile_due_at(db, clock.now_ms()) is None  # claimed: nothing else due
    clock.advance(DEFAULT_CLAIM_TTL_MS + 5)
    with db.write() as tx:
        assert recover_resource_claims(tx) == [uid]
    [scheduled] = scheduled_reconciles(db)
    assert (scheduled.uid, scheduled.claim_expires_at) == (uid, None)
    assert scheduled.available_at <= clock.now_ms()
    assert next_reconcile_due_at(db, clock.now_ms()) == scheduled.available_at
    assert _claim(db) is not None  # live again
    with db.write() as tx:
        assert recover_resource_claims(tx) == []  # a live claim stays
        assert recover_resource_claims(tx, every=True) == [uid]  # startup: all of them


def test_settled_writes_status_and_conditions_for_the_read_generation_and_dequeues(
    db: Database, clock: ManualClock
) -> None:
    uid = _apply(db, {"n": 1}).resource.uid
    claimed = _claim(db)
    assert claimed is not None
    clock.advance(250)
    done = _commit(db, claimed, PassResult("settled", status={"ok": 1}, conditions=READY))
    assert (done.resource_version, done.available_at, done.removed) == (2, None, False)
    resource = get_resource_by_uid(db, uid)
    assert resource is not None
    assert resource.status == {"ok": 1} and resource.observed_generation == 1
    assert resource.conditions == (
        {
            "type": "Ready",
            "status": "True",
            "reason": "Done",
            "observedGeneration": 1,
            "lastTransitionTime": clock.now_ms(),
        },
    )
    assert get_resource_queue_row(db, uid) is None
    [record] = list_reconcile_history(db, uid)
    assert (record.outcome, record.duration_ms, record.reconcile_id) == (
        "settled",
        250,
        claimed.claim.reconcile_id,
    )
    assert _claim(db) is None  # settled: nothing due until a wake-up
    [summary] = list_resources(db, manager="m")
    assert (summary.available_at, summary.claim_expires_at) == (None, None)


def test_a_wake_up_during_a_pass_keeps_the_key_queued_after_it_settles(db: Database) -> None:
    uid = _apply(db, {"n": 1}).resource.uid
    claimed = _claim(db)
    assert claimed is not None
    with db.write() as tx:
        enqueue_resource(tx, uid, reason="childFinished")
    _commit(db, claimed, PassResult("settled"))
    row = get_resource_queue_row(db, uid)
    assert row is not None and row.reason == "childFinished"


def test_a_pass_on_an_old_generation_is_refused_and_changes_nothing(db: Database) -> None:
    uid = _apply(db, {"n": 1}).resource.uid
    old_pass = _claim(db)
    assert old_pass is not None
    _apply(db, {"n": 2})  # a spec change while the pass runs
    before = _snapshot(db)
    with pytest.raises(ResourceVersionConflictError) as stale:
        _commit(db, old_pass, PassResult("settled", conditions=READY))
    assert (stale.value.expected, stale.value.actual) == (1, 2)
    assert _snapshot(db) == before
    with db.write() as tx:
        release_resource_claim(tx, old_pass.claim)
    new_pass = _claim(db)
    assert new_pass is not None and new_pass.claim.resource_generation == 2
    _commit(db, new_pass, PassResult("settled", conditions=READY))
    resource = get_resource_by_uid(db, uid)
    assert resource is not None and resource.observed_generation == 2
    assert resource.conditions[0]["observedGeneration"] == 2


def test_failed_passes_back_off_with_growing_capped_delays(
    db: Database, clock: ManualClock
) -> None:
    uid = _apply(db, {"n": 1}).resource.uid
    delays = []
    for _ in range(14):
        claimed = _claim(db)
        assert claimed is not None
        outcome = _commit(db, claimed, PassResult("error", error_class="RuntimeError"))
        delays.append(outcome.available_at - clock.now_ms())
        clock.advance(outcome.available_at - clock.now_ms())
    assert delays == sorted(delays) and delays[0] < delays[-1]
    assert max(delays) <= BACKOFF_CAP_MS and delays[-1] > BACKOFF_CAP_MS // 2
    row = get_resource_queue_row(db, uid)
    assert row is not None and row.retries == 14
    claimed = _claim(db)
    assert claimed is not None and claimed.retries == 14
    _commit(db, claimed, PassResult("requeue"))
    row = get_resource_queue_row(db, uid)
    assert row is not None and row.retries == 0 and row.available_at == clock.now_ms()


@pytest.mark.parametrize("jitter", [0.0, 0.3, 0.999])
def test_the_backoff_function_grows_and_is_capped_for_any_jitter(jitter: float) -> None:
    lows = [reconcile_backoff_ms(n, jitter=0.0) for n in range(1, 40)]
    highs = [reconcile_backoff_ms(n, jitter=0.999) for n in range(1, 40)]
    values = [reconcile_backoff_ms(n, jitter=jitter) for n in range(1, 40)]
    uncapped = [n for n in range(1, 40) if 1_000 * 2**n < BACKOFF_CAP_MS]
    # Below the cap, the worst draw of one step never exceeds the best of the next.
    assert all(highs[n - 1] <= lows[n] for n in uncapped)
    assert all(BACKOFF_CAP_MS // 2 <= v <= BACKOFF_CAP_MS for v in values[len(uncapped) + 1 :])
    assert values == sorted(values) and max(values) <= BACKOFF_CAP_MS
    assert reconcile_backoff_ms(39, jitter=jitter) >= BACKOFF_CAP_MS // 2


def test_requeue_after_sets_the_next_time(db: Database, clock: ManualClock) -> None:
    uid = _apply(db, {"n": 1}).resource.uid
    claimed = _claim(db)
    assert claimed is not None
    _commit(db, claimed, PassResult("requeueAfter", requeue_after_ms=90_000))
    row = get_resource_queue_row(db, uid)
    assert row is not None and row.available_at == clock.now_ms() + 90_000
    assert _claim(db) is None
    clock.advance(90_000)
    assert _claim(db) is not None


def test_a_child_run_reservation_is_idempotent_and_refuses_another_input(
    db: Database, clock: ManualClock
) -> None:
    uid = _apply(db, {"n": 1}).resource.uid
    claimed = _claim(db)
    assert claimed is not None

    def reserve(fingerprint: str, claim: Any = None) -> Any:
        with db.write() as tx:
            return reserve_child_run(
                tx,
                claim or claimed.claim,
                request_key="review-gen-1",
                input_fingerprint=fingerprint,
                workflow_name="review",
            )

    first = reserve("sha256:a")
    again = reserve("sha256:a")
    assert first.created and not again.created and again.run_id == first.run_id
    before = _snapshot(db)
    with pytest.raises(ChildRunConflictError):
        reserve("sha256:b")
    assert _snapshot(db) == before
    _commit(db, claimed, PassResult("requeue"))
    with pytest.raises(ClaimLostError):  # the pass is over: its claim is gone
        reserve("sha256:a")
    next_pass = _claim(db)
    assert next_pass is not None
    assert reserve("sha256:a", next_pass.claim).run_id == first.run_id  # a repeated pass
    [child] = list_resource_child_runs(db, uid)
    assert (child.run_id, child.run_status) == (first.run_id, None)


def test_deletion_honours_finalizers_and_removal_waits_for_the_cleanup_pass(
    db: Database,
) -> None:
    uid = _apply(db, {"n": 1}, finalizers=("worktree",)).resource.uid
    claimed = _claim(db)
    assert claimed is not None
    _commit(db, claimed, PassResult("settled"))
    with db.write() as tx:
        marked = request_resource_deletion(tx, uid)
    assert not marked.removed
    resource = get_resource_by_uid(db, uid)
    assert resource is not None and resource.deletion_requested_at is not None
    with pytest.raises(ResourceDeletingError):
        _apply(db, {"n": 2})
    cleanup = _claim(db)
    assert cleanup is not None and cleanup.resource.deletion_requested_at is not None
    done = _commit(db, cleanup, PassResult("settled", finalizers=()))
    assert done.removed
    assert get_resource(db, "m", "/p", "k1") is None
    assert all(rows == [] for rows in _snapshot(db).values())


def test_deletion_without_finalizers_removes_the_resource_at_once(db: Database) -> None:
    uid = _apply(db, {"n": 1}).resource.uid
    with db.write() as tx:
        assert request_resource_deletion(tx, uid).removed
    assert get_resource_by_uid(db, uid) is None


def test_history_keeps_the_newest_records(db: Database, clock: ManualClock) -> None:
    uid = _apply(db, {"n": 1}).resource.uid
    ids = []
    for _ in range(HISTORY_KEPT + 5):
        claimed = _claim(db)
        assert claimed is not None
        ids.append(claimed.claim.reconcile_id)
        _commit(db, claimed, PassResult("requeue", requeue_reason="more"))
        clock.advance(1)
    history = list_reconcile_history(db, uid, limit=1000)
    assert [h.reconcile_id for h in history] == list(reversed(ids[-HISTORY_KEPT:]))


def test_a_run_reserved_by_a_resource_is_protected_from_retention(
    db: Database, clock: ManualClock
) -> None:
    uid = _apply(db, {"n": 1}).resource.uid
    claimed = _claim(db)
    assert claimed is not None
    with db.write() as tx:
        child = reserve_child_run(
            tx,
            claimed.claim,
            request_key="summary",
            input_fingerprint="sha256:a",
            workflow_name="summarise",
        )
    run_claim = running(db, child.run_id)  # the scheduler creates the run under that ID
    with db.write() as tx:
        start_node_attempt(tx, run_claim, attempt_id="a1", node_path="n", node_type="compute")
        finish_node_attempt(tx, run_claim, attempt_id="a1", output={})
        complete_run(tx, child.run_id, claim=run_claim, payload={"output": {}})
        record_runner_exit(tx, f"{child.run_id}-e1", outcome=RunnerOutcome.EXITED, exit_code=0)
    clock.advance(DAY_MS)
    cutoff = clock.now_ms()
    assert tree_blockers(db, child.run_id, cutoff) == ["resourceChildRun"]
    assert prunable_trees(db, cutoff) == ([], 1)
    parent = run_parent_resource(db, child.run_id)
    assert parent is not None and (parent.uid, parent.request_key) == (uid, "summary")
    with db.write() as tx:
        request_resource_deletion(tx, uid)  # no finalizers: removed, the run is free
    assert tree_blockers(db, child.run_id, cutoff) == []
    assert run_parent_resource(db, child.run_id) is None
    trees, kept = prunable_trees(db, cutoff)
    assert [t.root_run_id for t in trees] == [child.run_id] and kept == 0


def test_a_due_key_or_a_pass_holding_a_claim_is_runner_work_the_sweep_waits_for(
    db: Database, clock: ManualClock
) -> None:
    _apply(db, {"n": 1})
    assert runner_work_pending(db, clock.now_ms()), "a due key: a pending pass"
    claimed = _claim(db)
    assert claimed is not None
    assert runner_work_pending(db, clock.now_ms()), "a pass in flight"
    _commit(db, claimed, PassResult("settled", status={}))
    assert not runner_work_pending(db, clock.now_ms())
