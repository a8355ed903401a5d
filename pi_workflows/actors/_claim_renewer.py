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
from dataclasses import dataclass, field
from typing import Any, Protocol

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Address, Done, Reply, ServerActor
from pi_workflows.actors._database import Transact
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import RenewServerClaims, RetakeServerClaims, RoundResult
from pi_workflows.storage import ClaimLostError, ClaimLostReason, Clock, ServerClaim, SystemClock

__all = ["ClaimRenewerActor", "LeaseHooks", "RenewalRound"]

log = logging.getLogger(__name__)


class LockCheck(Protocol):
    """The server's lock file, as the renewer asks about it (`supervision.ServerLock`)."""

    def still_ours(self) -> bool:
        """Whether the lock file is still the one this server holds."""
        ...


@dataclass(frozen=True, slots=True)
class LeaseLost:
    """To the server: another server took the lease (or the lock file); stop now."""

    reason: str


@dataclass(frozen=True, slots=True)
class ServerEpochTaken:
    """To the server: after a lapse, the next epoch's lease is committed and ours."""

    claim: ServerClaim = field(repr=False)


@dataclass(frozen=True, slots=True)
class RenewalRound:
    """Tag: one renewal round (its answer is a `RoundResult`, or the error)."""

    began_ms: int = 0
    """The monotonic reading when the round was sent: a renewal is at least this fresh."""
    retake: bool = False
    """The round took the next epoch after a lapse, instead of renewing."""


class ClaimRenewerActor(ServerActor):
    """Owns: the renewal schedule and this server's lease.

    Receives: `Tick`, `Done` (its rounds' answers).
    Sends: `Transact` to the database actor; `LeaseLost`, `ServerEpochTaken` to the server.
    Invariants: at most one renewal round in flight; it never waits for a runner; an
        expired lease is never renewed, only replaced by the next epoch.
    On failure: a lease held by another epoch, owner or token, or a replaced lock file,
        means another server took over; it tells the server `LeaseLost`, and the server
        stops rather than write under an old epoch. A lapse with no competitor takes the
        next epoch (`ServerEpochTaken`) and the server carries on.
    """

    name = "claim-renewer"

    def __init__(
        self,
        database: pykka.ActorRef[Any],
        server_claim: ServerClaim,
        every_ticks: int,
        server: Address,
        on_actor_failure: ActorFailureHandler,
        *,
        clock: Clock | None = None,
        lock: LockCheck | None = None,
        pid: int | None = None,
    ) -> None:
        super().__init__(on_actor_failure)
        self._database = database
        self._server_claim = server_claim
        self._every = max(1, every_ticks)
        self._server = server
        """Told `LeaseLost` and `ServerEpochTaken`."""
        self._clock: Clock = clock or SystemClock()
        self._lock = lock
        """The server's lock file (None: always this server's)."""
        self._pid = pid
        """This server's PID, stored with a new epoch."""
        self._renewed_ms = self._clock.monotonic_ms()  # the lease was just taken
        self._in_flight = False
        self._lost = False
        self.rounds = 0

    def on_receive(self, message: Any) -> Any:
        match message:
            case Tick(sequence=sequence):
                self._on_tick(sequence)
            case Done(tag=RenewalRound() as round_, reply=reply):
                self._on_done(round_, reply)
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
            self._start_round(RenewServerClaims(self._server_claim), retake=False)

    def _on_done(self, done: RenewalRound, reply: Reply) -> None:
        self._in_flight = False
        self.rounds += 1
        error = reply.error
        if error is None:
            self._renewed(done, reply.value)
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

    def _renewed(self, done: RenewalRound, result: RoundResult) -> None:
        self._renewed_ms = done.began_ms
        if result.claim.epoch != self._server_claim.epoch:
            self._server_claim = result.claim
            log.warning(
                "no other server took over: continuing under the next epoch",
                extra={"action": "server.epoch_renewed", "epoch": result.claim.epoch},
            )
            self._server.tell(ServerEpochTaken(result.claim))
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
        self._server.tell(LeaseLost(reason))

    def _retake(self) -> None:
        if self._lock is not None and not self._lock.still_ours():
            self._lose("server lease lost (the lock file was replaced)", "lockReplaced")
            return
        self._start_round(RetakeServerClaims(self._server_claim, self._pid), retake=True)

    def _start_round(self, unit: object, *, retake: bool) -> None:
        self._in_flight = True
        tag = RenewalRound(self._clock.monotonic_ms(), retake)
        self._database.tell(Transact(unit, self.actor_ref, tag, hold_when_full=True))
