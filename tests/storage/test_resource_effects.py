"""Resource managers' managed effects on real database files: recorded before `apply`,
observed first after a pass died mid-apply, never applied twice when `observe` proves it
applied, and a key reused with another request refused.
"""

from __future__ import annotations

import pytest

from pi_workflows.storage import (
    DEFAULT_CLAIM_TTL_MS,
    ClaimedReconcile,
    ClaimLostError,
    Database,
    EffectConflictError,
    ManualClock,
    PassResult,
    ResourceEffect,
    ResourceEffectDecision,
    apply_resource,
    claim_next_resource,
    commit_reconcile,
    list_resource_effects,
    request_resource_deletion,
    reserve_resource_effect,
    retry_resource_effect,
    settle_resource_effect,
    verify,
)

pytestmark = pytest.mark.timeout(60)

MERGE = {"pr": 7, "sha": "abc"}


def _pass(db: Database) -> ClaimedReconcile:
    with db.write() as tx:
        claimed = claim_next_resource(tx, owner_id="server-1")
    assert claimed is not None
    return claimed


@pytest.fixture
def uid(db: Database) -> str:
    with db.write() as tx:
        applied = apply_resource(
            tx,
            manager="pr",
            project_path="/p",
            key="pr-7",
            spec={"pr": 7},
            initial_status={},
            source_identity={"kind": "file"},
            source_digest="sha256:src",
        )
    return applied.resource.uid


def _reserve(db: Database, claimed: ClaimedReconcile, request: object = MERGE) -> ResourceEffect:
    with db.write() as tx:
        return reserve_resource_effect(
            tx, claimed.claim, key="merge", kind="github.merge", request=request
        )


def test_an_effect_is_recorded_before_apply_and_adopted_after_it_settles(
    db: Database, uid: str
) -> None:
    first = _pass(db)
    reserved = _reserve(db, first)
    assert reserved.decision is ResourceEffectDecision.APPLY and reserved.state == "applying"
    assert _reserve(db, first).decision is ResourceEffectDecision.APPLY  # a retried message
    with db.write() as tx:
        settle_resource_effect(
            tx, first.claim, key="merge", outcome="applied", result={"merged": True}
        )
        commit_reconcile(tx, first.claim, PassResult("requeue"), jitter=0.0)
    later = _reserve(db, _pass(db))
    assert later.decision is ResourceEffectDecision.ADOPT
    assert (later.state, later.result, later.attempt) == ("applied", {"merged": True}, 1)
    [effect] = list_resource_effects(db, uid)
    assert (effect.effect_type, effect.state) == ("github.merge", "applied")
    assert verify(db) == []


def test_after_a_pass_died_mid_apply_the_next_pass_observes_first(
    db: Database, clock: ManualClock, uid: str
) -> None:
    dead = _pass(db)
    _reserve(db, dead)  # reserved, then the runner was SIGKILLed before settling
    clock.advance(DEFAULT_CLAIM_TTL_MS + 1)
    second = _pass(db)
    found = _reserve(db, second)
    assert found.decision is ResourceEffectDecision.OBSERVE
    with db.write() as tx, pytest.raises(EffectConflictError) as refused:
        settle_resource_effect(tx, second.claim, key="merge", outcome="applied", result={})
    assert refused.value.reason == "notExecutor"
    with db.write() as tx:  # observe proved it applied: settle, never apply again
        proven = settle_resource_effect(
            tx, second.claim, key="merge", outcome="applied", result={"merged": True}, observed=True
        )
    assert (proven.state, proven.attempt) == ("applied", 1)
    with db.write() as tx, pytest.raises(ClaimLostError):
        settle_resource_effect(tx, dead.claim, key="merge", outcome="applied", result={})
    assert verify(db) == []


def test_observe_proving_nothing_applied_opens_the_next_attempt(
    db: Database, clock: ManualClock, uid: str
) -> None:
    _reserve(db, _pass(db))
    clock.advance(DEFAULT_CLAIM_TTL_MS + 1)
    second = _pass(db)
    assert _reserve(db, second).decision is ResourceEffectDecision.OBSERVE
    with db.write() as tx:
        again = retry_resource_effect(tx, second.claim, key="merge")
        assert (again.decision, again.attempt) == (ResourceEffectDecision.APPLY, 2)
        settle_resource_effect(tx, second.claim, key="merge", outcome="rejected", error="409")
    attempts = db.connection.execute(
        "SELECT attempt_number, state FROM effect_attempts ORDER BY attempt_number"
    ).fetchall()
    assert attempts == [(1, "cancelled"), (2, "rejected")]
    assert verify(db) == []


def test_a_key_reused_with_another_request_is_refused_and_changes_nothing(
    db: Database, uid: str
) -> None:
    claimed = _pass(db)
    _reserve(db, claimed)
    before = db.connection.execute("SELECT * FROM effects").fetchall()
    with pytest.raises(EffectConflictError) as conflict:
        _reserve(db, claimed, {"pr": 7, "sha": "def"})
    assert conflict.value.reason == "requestMismatch"
    assert db.connection.execute("SELECT * FROM effects").fetchall() == before


def test_a_removed_resource_takes_its_effects_with_it(db: Database, uid: str) -> None:
    claimed = _pass(db)
    _reserve(db, claimed)
    with db.write() as tx:
        assert request_resource_deletion(tx, uid).removed
    assert list_resource_effects(db, uid) == []
    assert db.connection.execute("SELECT count(*) FROM effect_attempts").fetchone()[0] == 0
