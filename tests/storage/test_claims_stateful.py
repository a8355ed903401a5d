"""A model-based test of claims: acquire, protected write, renew, expire, steal, stale writes.

Hypothesis drives a real database file and a tiny in-memory model side by side: no
stale write ever succeeds, every refusal carries the model's reason, and revisions
never skip or repeat.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from pi_workflows.storage import (
    Claim,
    ClaimHeldError,
    ClaimLostError,
    ClaimLostReason,
    ManualClock,
    acquire_claim,
    get_lease,
    get_run,
    list_events,
    open_database,
    protected_write,
    release_claim,
    renew_claim,
    renew_owner_claims,
    verify,
)
from tests.storage.storage_helpers import enqueue

TTL = 1_000
OWNERS = ("alpha", "beta", "gamma")
RUN = "run-1"


@dataclasses.dataclass
class ModelLease:
    owner: str
    generation: int
    token: str
    expires_at: int


class ClaimMachine(RuleBasedStateMachine):
    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="piw-claims-"))
        self.clock = ManualClock()
        self.db = open_database(self.folder / "state.sqlite", clock=self.clock)
        enqueue(self.db, RUN)
        self.lease: ModelLease | None = None
        self.generation = 0
        self.revision = 1

    def teardown(self) -> None:
        try:
            assert verify(self.db) == []
        finally:
            self.db.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    # --- the model --------------------------------------------------------------------

    def live(self) -> bool:
        return self.lease is not None and self.lease.expires_at > self.clock.now_ms()

    def expected_reason(self, claim: Claim, *, require_live: bool) -> ClaimLostReason | None:
        lease = self.lease
        if lease is None:
            return ClaimLostReason.MISSING_AUTHORITY
        if claim.generation != lease.generation:
            return ClaimLostReason.GENERATION_CHANGED
        if claim.owner_id != lease.owner or claim.owner_type != "control":
            return ClaimLostReason.OWNER_CHANGED
        if claim.token != lease.token:
            return ClaimLostReason.TOKEN_CHANGED
        if require_live and lease.expires_at <= self.clock.now_ms():
            return ClaimLostReason.EXPIRED
        return None

    # --- rules ------------------------------------------------------------------------

    @rule(target=claims, owner=st.sampled_from(OWNERS))
    def acquire(self, owner: str) -> Claim | None:
        was_live = self.live()
        try:
            with self.db.write() as tx:
                claim = acquire_claim(tx, RUN, owner_type="control", owner_id=owner, ttl_ms=TTL)
        except ClaimHeldError:
            assert was_live, "refused to acquire an absent or expired claim"
            return None  # the bundle keeps None; rules skip it
        assert not was_live, "acquired over a live claim"
        self.generation += 1
        assert claim.generation == self.generation
        self.lease = ModelLease(owner, claim.generation, claim.token, self.clock.now_ms() + TTL)
        return claim

    @rule(claim=claims, forge=st.sampled_from(["none", "token", "owner", "generation"]))
    def write(self, claim: Claim | None, forge: str) -> None:
        if claim is None:
            return
        presented = {
            "none": claim,
            "token": dataclasses.replace(claim, token=claim.token + "x"),
            "owner": dataclasses.replace(claim, owner_id="mallory"),
            "generation": dataclasses.replace(claim, generation=claim.generation + 1),
        }[forge]
        expected = self.expected_reason(presented, require_live=True)
        try:
            with self.db.write() as tx:
                result = protected_write(
                    tx, presented, event_type="step", payload={"g": presented.generation}
                )
        except ClaimLostError as exc:
            assert expected is not None, f"a valid write was refused: {exc.reason}"
            assert exc.reason is expected
            return
        assert expected is None, f"a stale write succeeded (expected {expected})"
        self.revision += 1
        assert result.revision == self.revision
        assert self.lease is not None
        self.lease.expires_at = self.clock.now_ms() + TTL

    @rule(claim=claims)
    def renew(self, claim: Claim | None) -> None:
        if claim is None:
            return
        expected = self.expected_reason(claim, require_live=True)
        try:
            with self.db.write() as tx:
                renew_claim(tx, claim)
        except ClaimLostError as exc:
            assert exc.reason is expected
            return
        assert expected is None
        assert self.lease is not None
        self.lease.expires_at = self.clock.now_ms() + TTL

    @rule(owner=st.sampled_from(OWNERS))
    def renew_owner(self, owner: str) -> None:
        with self.db.write() as tx:
            renewed = renew_owner_claims(tx, owner_type="control", owner_id=owner, ttl_ms=TTL)
        should = self.live() and self.lease is not None and self.lease.owner == owner
        assert [r.resource for r in renewed] == ([RUN] if should else [])
        if should:
            assert self.lease is not None
            self.lease.expires_at = self.clock.now_ms() + TTL

    @rule(claim=consumes(claims))
    def release(self, claim: Claim | None) -> None:
        if claim is None:
            return
        expected = self.expected_reason(claim, require_live=False)
        try:
            with self.db.write() as tx:
                release_claim(tx, claim)
        except ClaimLostError as exc:
            assert exc.reason is expected
            return
        assert expected is None
        self.lease = None

    @rule(ms=st.integers(min_value=0, max_value=2 * TTL))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @precondition(lambda self: self.lease is not None)
    @rule()
    def advance_exactly_to_expiry(self) -> None:
        assert self.lease is not None
        self.clock.set(max(self.clock.now_ms(), self.lease.expires_at))

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def database_matches_model(self) -> None:
        run = get_run(self.db, RUN)
        assert run is not None
        assert run.revision == self.revision
        assert run.generation == self.generation
        lease = get_lease(self.db, RUN)
        if self.lease is None:
            assert lease is None
        else:
            assert lease is not None
            assert (lease.owner_id, lease.generation, lease.expires_at) == (
                self.lease.owner,
                self.lease.generation,
                self.lease.expires_at,
            )

    @invariant()
    def revisions_never_skip_or_repeat(self) -> None:
        revisions = [event.revision for event in list_events(self.db, RUN, limit=10_000)]
        assert revisions == list(range(1, self.revision + 1))


ClaimMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestClaims = ClaimMachine.TestCase
