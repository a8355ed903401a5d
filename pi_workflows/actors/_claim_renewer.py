"""The claim renewer: renews the server lease and every live host claim from a timer.

Implements workflow-server.md § Claim rules ("the server also renews active claims
from a timer ... a backup for a run with no state writes") and the lease of § Server
lifecycle. It only queues work for the database actor, so a blocked runner can never
stop renewal.

The stored expiry is wall-clock time, because other processes read it. This actor
judges its own lease on the monotonic clock: when more than the lease's lifetime has
passed since its last renewal began (the process was stopped, or the machine slept), or
the database says the lease expired although it has not by that measure (the wall clock
stepped forward), it does not renew the expired lease. It takes the next epoch instead,
if the lock file and the lease row are still its own, and recovers what the lapse left
behind. Only a real competitor (the row names another epoch, owner or token, or the lock
file was replaced) stops the server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Reply, ServerActor, tell_if_alive
from pi_workflows.actors._database import Transact
from pi_workflows.actors._ticker import Tick
from pi_workflows.storage import (
    DEFAULT_CLAIM_TTL_MS,
    ClaimLostError,
    ClaimLostReason,
    Clock,
    Database,
    OwnerType,
    ServerClaim,
    StorageError,
    SystemClock,
    Tx,
    recover_expired_runs,
    renew_owner_claims,
    renew_server_epoch,
    retake_server_epoch,
)

__all__ = ["ClaimRenewerActor", "LeaseHooks", "RenewalDone", "RoundResult"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeaseHooks:
    """What the renewer needs from the server beyond the database (plain callables)."""

    lock_is_ours: Callable[[], bool] = field(default=lambda: True)
    """Whether the global lock file is still the one this server holds."""
    on_new_epoch: Callable[[ServerClaim], None] = field(default=lambda claim: None)
    """Called after a lapse, once the next epoch's lease is committed."""
    pid: int | None = None
    """This server's PID, stored with a new epoch."""


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one committed round did."""

    claim: ServerClaim = field(repr=False)
    """The lease now held: the same one, or the next epoch's after a lapse."""
    renewed: int
    """Run claims renewed."""
    recovered: tuple[str, ...] = ()
    """Runs whose lapsed claims were recovered (requeued, or parked if paused)."""


@dataclass(frozen=True, slots=True)
class RenewalDone:
    """The database actor finished one renewal round."""

    reply: Reply
    """A `RoundResult`, or the error (a lost server lease)."""
    began_ms: int = 0
    """The monotonic reading when the round was sent: a renewal is at least this fresh."""
    retake: bool = False
    """The round took the next epoch after a lapse, instead of renewing."""


class ClaimRenewerActor(ServerActor):
    """Owns: the renewal schedule and this server's lease.

    Receives: `Tick`, `RenewalDone`.
    Sends: `Transact` to the database actor.
    Invariants: at most one renewal round in flight; it never waits for a runner; an
        expired lease is never renewed, only replaced by the next epoch.
    On failure: a lease held by another epoch, owner or token, or a replaced lock file,
        means another server took over; it calls `on_lease_lost`, and the server stops
        rather than write under an old epoch. A lapse with no competitor takes the next
        epoch (`LeaseHooks.on_new_epoch`) and the server carries on.
    """

    name = "claim-renewer"

    def __init__(
        self,
        database: pykka.ActorRef[Any],
        server_claim: ServerClaim,
        every_ticks: int,
        on_lease_lost: Callable[[str], None],
        on_actor_failure: ActorFailureHandler,
        *,
        clock: Clock | None = None,
        hooks: LeaseHooks | None = None,
    ) -> None:
        super().__init__(on_actor_failure)
        self._database = database
        self._server_claim = server_claim
        self._every = max(1, every_ticks)
        self._on_lease_lost = on_lease_lost
        self._clock: Clock = clock or SystemClock()
        self._hooks = hooks or LeaseHooks()
        self._renewed_ms = self._clock.monotonic_ms()  # the lease was just taken
        self._in_flight = False
        self._lost = False
        self.rounds = 0

    def on_receive(self, message: Any) -> Any:
        match message:
            case Tick(sequence=sequence):
                self._on_tick(sequence)
            case RenewalDone():
                self._on_done(message)
            case _:
                raise TypeError(f"claim renewer got {type(message).__name__}")
        return None

    def _on_tick(self, sequence: int) -> None:
        if self._in_flight or self._lost:
            return
        if self._lapsed():
            # Nothing renewed for a whole lease: this process did not run (SIGSTOP, a
            # suspended machine) or could not write. The lease has expired.
            self._retake()
        elif sequence % self._every == 0:
            self._start_round(self._renew_work(self._server_claim), retake=False)

    def _on_done(self, done: RenewalDone) -> None:
        self._in_flight = False
        self.rounds += 1
        error = done.reply.error
        if error is None:
            self._renewed(done)
        elif isinstance(error, ClaimLostError):
            if error.reason is ClaimLostReason.EXPIRED and not done.retake:
                if not self._lapsed():
                    # Expired by the wall clock, not by ours: the clock stepped forward.
                    log.warning(
                        "the server lease expired by the wall clock; taking the next epoch",
                        extra={"action": "server.clock_jumped", "epoch": self._server_claim.epoch},
                    )
                self._retake()
            else:
                self._lose(f"server lease lost ({error.reason})", str(error.reason))
        else:
            log.warning(
                "claim renewal failed",
                extra={"action": "claims.renew_failed", "reason": type(error).__name__},
            )

    def _lapsed(self) -> bool:
        """Whether a whole lease passed, by the monotonic clock, since the last renewal
        began (logged: the server stalled, or its renewal waited that long)."""
        lapsed_ms = self._clock.monotonic_ms() - self._renewed_ms
        if lapsed_ms < self._server_claim.ttl_ms:
            return False
        log.warning(
            f"the server lease lapsed: no renewal for {lapsed_ms / 1000:.1f} s",
            extra={"action": "server.stalled", "epoch": self._server_claim.epoch},
        )
        return True

    def _renewed(self, done: RenewalDone) -> None:
        result: RoundResult = done.reply.value
        self._renewed_ms = done.began_ms
        if result.claim.epoch != self._server_claim.epoch:
            self._server_claim = result.claim
            log.warning(
                "no other server took over: continuing under the next epoch",
                extra={"action": "server.epoch_renewed", "epoch": result.claim.epoch},
            )
            self._hooks.on_new_epoch(result.claim)
        for run_id in result.recovered:
            log.warning(
                "the run's claim lapsed with no runner left; recovered",
                extra={"action": "claims.lapsed_run_recovered", "run_id": run_id},
            )

    def _lose(self, reason: str, code: str) -> None:
        self._lost = True
        log.error(
            "server lease lost; stopping", extra={"action": "server.lease_lost", "reason": code}
        )
        self._on_lease_lost(reason)

    def _retake(self) -> None:
        if not self._hooks.lock_is_ours():
            self._lose("server lease lost (the lock file was replaced)", "lockReplaced")
            return
        self._start_round(self._retake_work(self._server_claim), retake=True)

    def _renew_work(self, claim: ServerClaim) -> Callable[[Database], RoundResult]:
        def renew(db: Database) -> RoundResult:
            with db.write() as tx:
                renew_server_epoch(tx, claim)
                renewed = _renew_run_claims(tx, claim)
            return RoundResult(claim, renewed, _recover_lapsed(db, claim))

        return renew

    def _retake_work(self, claim: ServerClaim) -> Callable[[Database], RoundResult]:
        pid = self._hooks.pid

        def retake(db: Database) -> RoundResult:
            with db.write() as tx:
                new_claim = retake_server_epoch(tx, claim, pid=pid)
                renewed = _renew_run_claims(tx, new_claim)
            return RoundResult(new_claim, renewed, _recover_lapsed(db, new_claim))

        return retake

    def _start_round(self, work: Callable[[Database], RoundResult], *, retake: bool) -> None:
        me = self.actor_ref
        began_ms = self._clock.monotonic_ms()

        def done(reply: Reply) -> None:
            tell_if_alive(me, RenewalDone(reply, began_ms, retake))

        self._in_flight = True
        self._database.tell(Transact(work, done, "claims.renew", hold_when_full=True))


def _renew_run_claims(tx: Tx, claim: ServerClaim) -> int:
    # Run claims keep the lifetime they were granted with at launch (not the server
    # lease's): the timer only backs up renewal by runner writes. Expired ones are not
    # renewed: `_recover_lapsed` takes them over.
    return len(
        renew_owner_claims(
            tx, owner_type=OwnerType.HOST, owner_id=claim.owner_id, ttl_ms=DEFAULT_CLAIM_TTL_MS
        )
    )


def _recover_lapsed(db: Database, claim: ServerClaim) -> tuple[str, ...]:
    """Recover claimed runs whose claim lapsed with no runner left (after the renewal,
    in its own savepoint: a refusal here never costs the lease its renewal)."""
    try:
        with db.write() as tx:
            recovered = recover_expired_runs(
                tx, owner_id=claim.owner_id, ttl_ms=DEFAULT_CLAIM_TTL_MS
            )
    except StorageError as exc:
        log.warning(
            "recovering lapsed claims failed",
            extra={"action": "claims.recover_failed", "reason": type(exc).__name__},
        )
        return ()
    return tuple(run.run_id for run in recovered)
