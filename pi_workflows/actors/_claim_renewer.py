"""The claim renewer: renews the server lease and every live host claim from a timer.

Implements workflow-server.md § Claim rules ("the server also renews active claims
from a timer ... a backup for a run with no state writes"). It only queues work
for the database actor, so a blocked runner can never stop renewal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Reply, ServerActor, tell_if_alive
from pi_workflows.actors._database import Transact
from pi_workflows.actors._ticker import Tick
from pi_workflows.storage import (
    DEFAULT_CLAIM_TTL_MS,
    ClaimLostError,
    Database,
    OwnerType,
    ServerClaim,
    renew_owner_claims,
    renew_server_epoch,
)

__all__ = ["ClaimRenewerActor", "RenewalDone"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RenewalDone:
    """The database actor finished one renewal round."""

    reply: Reply
    """The number of run claims renewed, or the error (a lost server lease)."""


class ClaimRenewerActor(ServerActor):
    """Owns: the renewal schedule and this server's lease.

    Receives: `Tick`, `RenewalDone`.
    Sends: `Transact` to the database actor.
    Invariants: at most one renewal round in flight; it never waits for a runner.
    On failure: a lost server lease means another server took over; it calls
        `on_lease_lost`, and the server stops rather than write under an old epoch.
    """

    name = "claim-renewer"

    def __init__(
        self,
        database: pykka.ActorRef[Any],
        server_claim: ServerClaim,
        every_ticks: int,
        on_lease_lost: Callable[[str], None],
        on_actor_failure: ActorFailureHandler,
    ) -> None:
        super().__init__(on_actor_failure)
        self._database = database
        self._server_claim = server_claim
        self._every = max(1, every_ticks)
        self._on_lease_lost = on_lease_lost
        self._in_flight = False
        self.rounds = 0

    def on_receive(self, message: Any) -> Any:
        match message:
            case Tick(sequence=sequence):
                if sequence % self._every == 0 and not self._in_flight:
                    self._start_round()
            case RenewalDone(reply=reply):
                self._in_flight = False
                self.rounds += 1
                if isinstance(reply.error, ClaimLostError):
                    log.error(
                        "server lease lost; stopping",
                        extra={"action": "server.lease_lost", "reason": reply.error.reason},
                    )
                    self._on_lease_lost(f"server lease lost ({reply.error.reason})")
                elif reply.error is not None:
                    log.warning(
                        "claim renewal failed",
                        extra={
                            "action": "claims.renew_failed",
                            "reason": type(reply.error).__name__,
                        },
                    )
            case _:
                raise TypeError(f"claim renewer got {type(message).__name__}")
        return None

    def _start_round(self) -> None:
        claim = self._server_claim
        me = self.actor_ref

        def renew(db: Database) -> int:
            with db.write() as tx:
                renew_server_epoch(tx, claim)
                # Run claims keep the lifetime they were granted with at launch (not the
                # server lease's): the timer only backs up renewal by runner writes.
                renewed = renew_owner_claims(
                    tx,
                    owner_type=OwnerType.HOST,
                    owner_id=claim.owner_id,
                    ttl_ms=DEFAULT_CLAIM_TTL_MS,
                )
            return len(renewed)

        def done(reply: Reply) -> None:
            tell_if_alive(me, RenewalDone(reply))

        self._in_flight = True
        self._database.tell(Transact(renew, done, "claims.renew"))
