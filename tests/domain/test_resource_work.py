"""Resource managers' units of work and views, run as the database and reader actors run
them (`perform` on a unit record) against a real state file: apply, claim, commit,
child-run reservation, deletion, recovery, and the `get` and `list` views.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows.domain import (
    ApplyResource,
    ClaimReconcile,
    CommitReconcile,
    DeleteResource,
    EnqueueResource,
    EnsureChildRun,
    ListResources,
    RecoverResourceClaims,
    ReleaseReconcileClaim,
    ReserveChildRun,
    ReserveResourceEffect,
    ResourceView,
    RetryResourceEffect,
    SettleResourceEffect,
    perform,
    unit_label,
)
from pi_workflows.storage import (
    DEFAULT_CLAIM_TTL_MS,
    ChildRunConflictError,
    ClaimedReconcile,
    ClaimLostError,
    Database,
    ManualClock,
    PassResult,
    ResourceEffectDecision,
    ResourceNotFoundError,
    ResourceVersionConflictError,
    open_database,
)

pytestmark = pytest.mark.timeout(60)

SOURCE = {"kind": "file", "path": "/p/.pi/resource-managers/docs.resource_manager.py"}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def db(tmp_path: Path, clock: ManualClock) -> Iterator[Database]:
    database = open_database(tmp_path / "state.sqlite", clock=clock)
    try:
        yield database
    finally:
        database.close()


def _apply(db: Database, spec: object, finalizers: tuple[str, ...] = ()) -> object:
    return perform(
        db,
        ApplyResource(
            manager="docs",
            project_path="/p",
            key="readme",
            spec=spec,
            initial_status={"summaries": 0},
            source_identity=SOURCE,
            source_digest="sha256:src",
            finalizers=finalizers,
        ),
    )


def _claim(db: Database) -> ClaimedReconcile:
    claimed = perform(db, ClaimReconcile(owner_id="server-1"))
    assert isinstance(claimed, ClaimedReconcile)
    return claimed


def test_a_pass_through_the_units_settles_and_shows_in_the_views(
    db: Database, clock: ManualClock
) -> None:
    _apply(db, {"dir": "docs"})
    claimed = _claim(db)
    assert claimed.resource.spec == {"dir": "docs"}
    assert perform(db, ClaimReconcile(owner_id="server-2")) is None  # one pass per key
    child = perform(
        db,
        ReserveChildRun(
            claim=claimed.claim,
            request_key="readme.md@1",
            input_fingerprint="sha256:in",
            workflow_name="summarise",
        ),
    )
    clock.advance(40)
    result = PassResult(
        "settled",
        status={"summaries": 1},
        conditions=[{"type": "Ready", "status": "False", "reason": "ChildRunning"}],
    )
    perform(db, CommitReconcile(claim=claimed.claim, result=result))

    view = perform(db, ResourceView(manager="docs", project_path="/p", key="readme"))
    assert view["resource"]["status"] == {"summaries": 1}
    assert view["resource"]["observedGeneration"] == 1
    assert view["resource"]["conditions"][0]["reason"] == "ChildRunning"
    assert view["queue"] is None
    assert view["childRuns"] == [
        {
            "requestKey": "readme.md@1",
            "workflow": "summarise",
            "runId": child.run_id,
            "status": "reserved",
            "reservedAt": clock.now_ms() - 40,
        }
    ]
    assert [(p["outcome"], p["durationMs"]) for p in view["recentPasses"]] == [("settled", 40)]
    assert view["effects"] == []

    listed = perform(db, ListResources(now=clock.now_ms()))
    [entry] = listed["resources"]
    assert (entry["manager"], entry["key"], entry["queue"], entry["reconciling"]) == (
        "docs",
        "readme",
        None,
        False,
    )
    assert perform(db, ListResources(now=clock.now_ms(), manager="other")) == {"resources": []}
    assert unit_label(ResourceView(manager="docs", project_path="/p", key="readme")) == (
        "resource.get"
    )


def test_the_units_refuse_a_stale_pass_a_lost_claim_and_another_input(
    db: Database, clock: ManualClock
) -> None:
    _apply(db, {"dir": "docs"})
    claimed = _claim(db)
    perform(
        db,
        ReserveChildRun(
            claim=claimed.claim, request_key="r", input_fingerprint="sha256:a", workflow_name="w"
        ),
    )
    with pytest.raises(ChildRunConflictError):
        perform(
            db,
            ReserveChildRun(
                claim=claimed.claim,
                request_key="r",
                input_fingerprint="sha256:b",
                workflow_name="w",
            ),
        )
    _apply(db, {"dir": "docs", "depth": 2})
    with pytest.raises(ResourceVersionConflictError):
        perform(db, CommitReconcile(claim=claimed.claim, result=PassResult("settled")))
    perform(db, ReleaseReconcileClaim(claim=claimed.claim))
    with pytest.raises(ClaimLostError):
        perform(db, CommitReconcile(claim=claimed.claim, result=PassResult("settled")))
    again = _claim(db)
    assert again.claim.resource_generation == 2


def test_recovery_returns_an_abandoned_pass_and_deletion_waits_for_its_finalizer(
    db: Database, clock: ManualClock
) -> None:
    _apply(db, {"dir": "docs"}, finalizers=("summaries",))
    abandoned = _claim(db)  # its runner was SIGKILLed: nobody renews the claim
    clock.advance(DEFAULT_CLAIM_TTL_MS + 1)
    assert perform(db, RecoverResourceClaims()) == (abandoned.claim.uid,)
    cleanup_due = perform(db, DeleteResource(manager="docs", project_path="/p", key="readme"))
    assert not cleanup_due.removed
    cleanup = _claim(db)
    assert cleanup.resource.deletion_requested_at is not None
    done = perform(
        db,
        CommitReconcile(claim=cleanup.claim, result=PassResult("settled", finalizers=())),
    )
    assert done.removed
    with pytest.raises(ResourceNotFoundError):
        perform(db, ResourceView(manager="docs", project_path="/p", key="readme"))
    with pytest.raises(ResourceNotFoundError):
        perform(db, EnqueueResource(manager="docs", project_path="/p", key="readme", reason="cli"))


def test_an_error_pass_backs_off_and_a_hint_wakes_it(db: Database, clock: ManualClock) -> None:
    _apply(db, {"dir": "docs"})
    claimed = _claim(db)
    failed = perform(
        db,
        CommitReconcile(
            claim=claimed.claim,
            result=PassResult("error", error_class="OSError"),
            jitter=0.0,
        ),
    )
    assert failed.retries == 1 and failed.available_at == clock.now_ms() + 500
    assert perform(db, ClaimReconcile(owner_id="server-1")) is None
    row = perform(
        db, EnqueueResource(manager="docs", project_path="/p", key="readme", reason="cli")
    )
    assert row.available_at == clock.now_ms() and row.retries == 1
    assert _claim(db).retries == 1


def test_an_effect_interrupted_mid_apply_is_observed_by_the_next_pass_and_shown(
    db: Database, clock: ManualClock
) -> None:
    _apply(db, {"dir": "docs"})
    dead = _claim(db)
    reserve = ReserveResourceEffect(
        claim=dead.claim, key="publish", kind="site.publish", request={"rev": 1}
    )
    assert perform(db, reserve).decision is ResourceEffectDecision.APPLY
    clock.advance(DEFAULT_CLAIM_TTL_MS + 1)  # the pass died between reservation and settlement
    nxt = _claim(db)
    again = perform(
        db,
        ReserveResourceEffect(
            claim=nxt.claim, key="publish", kind="site.publish", request={"rev": 1}
        ),
    )
    assert again.decision is ResourceEffectDecision.OBSERVE
    opened = perform(db, RetryResourceEffect(claim=nxt.claim, key="publish"))
    assert (opened.decision, opened.attempt) == (ResourceEffectDecision.APPLY, 2)
    settled = perform(
        db,
        SettleResourceEffect(claim=nxt.claim, key="publish", outcome="applied", result={"ok": 1}),
    )
    assert (settled.state, settled.result) == ("applied", {"ok": 1})
    view = perform(db, ResourceView(manager="docs", project_path="/p", key="readme"))
    assert [(e["kind"], e["state"]) for e in view["effects"]] == [("site.publish", "applied")]


def test_ensure_child_run_refuses_without_reserving_and_a_conflict_keeps_the_first(
    db: Database,
) -> None:
    _apply(db, {"path": "README.md"})
    claim = _claim(db).claim
    refused = perform(
        db,
        EnsureChildRun(
            claim,
            request_key="sum/1",
            input_fingerprint="sha256:a",
            workflow_name="summarise",
            resolved={"ok": False, "code": "workflowNotFound", "message": "no such workflow"},
        ),
    )
    assert (refused.run_id, refused.error_code) == (None, "workflowNotFound")
    view = perform(db, ResourceView(manager="docs", project_path="/p", key="readme"))
    assert view["childRuns"] == [], "a refusal reserves nothing"

    first = perform(
        db,
        ReserveChildRun(
            claim, request_key="sum/1", input_fingerprint="sha256:a", workflow_name="summarise"
        ),
    )
    other = perform(
        db,
        EnsureChildRun(
            claim,
            request_key="sum/1",
            input_fingerprint="sha256:b",
            workflow_name="summarise",
            resolved={"ok": False},
        ),
    )
    assert (other.run_id, other.error_code) == (None, "requestKeyConflict")
    view = perform(db, ResourceView(manager="docs", project_path="/p", key="readme"))
    assert [c["runId"] for c in view["childRuns"]] == [first.run_id]
