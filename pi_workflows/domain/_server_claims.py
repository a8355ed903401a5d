"""The server lease and the host claims it backs: one renewal round, one retake.

Implements workflow-server.md § Claim rules (the timer renewal of active claims) and
§ Server lifecycle (the lease) for the claim-renewer actor, and the release of the
lease at a graceful stop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pi_workflows.storage import (
    DEFAULT_CLAIM_TTL_MS,
    Database,
    OwnerType,
    ServerClaim,
    StorageError,
    Tx,
    forget_recorded_processes,
    recover_expired_runs,
    release_server_epoch,
    renew_owner_claims,
    renew_server_epoch,
    retake_server_epoch,
)

__all__ = ["RoundResult", "release_server_claim", "renew_server_claims", "retake_server_claims"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one committed round did."""

    claim: ServerClaim = field(repr=False)
    """The lease now held: the same one, or the next epoch's after a lapse."""
    renewed: int
    """Run claims renewed."""
    recovered: tuple[str, ...] = ()
    """Runs whose lapsed claims were recovered (requeued, or parked if paused)."""


def renew_server_claims(db: Database, claim: ServerClaim) -> RoundResult:
    """Renew the server lease and this server's host claims, then recover runs whose
    claims lapsed with no runner left."""
    with db.write() as tx:
        renew_server_epoch(tx, claim)
        renewed = _renew_run_claims(tx, claim)
    return RoundResult(claim, renewed, _recover_lapsed(db, claim))


def retake_server_claims(db: Database, claim: ServerClaim, pid: int | None) -> RoundResult:
    """After a lapse: take the next epoch (if the lease row is still this server's),
    renew the host claims under it, and recover what the lapse left behind."""
    with db.write() as tx:
        new_claim = retake_server_epoch(tx, claim, pid=pid)
        renewed = _renew_run_claims(tx, new_claim)
    return RoundResult(new_claim, renewed, _recover_lapsed(db, new_claim))


def release_server_claim(db: Database, claim: ServerClaim, children_gone: bool) -> None:
    """A graceful stop: release the lease; with every child reaped (the process
    supervisor stopped), no recorded process of this server is left to stop."""
    with db.write() as tx:
        if children_gone:
            forget_recorded_processes(tx)
        release_server_epoch(tx, claim)


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
