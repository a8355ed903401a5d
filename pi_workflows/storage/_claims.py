"""Run claims: acquisition with a new generation, the protected write, renewal, release.

Implements workflow-server.md § Claim rules and the server lease of § Server lifecycle.
A claim's raw token lives only in the `Claim` object of its holder; the database
stores its SHA-256 hash, and neither appears in any repr, error or trace.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import orjson

from pi_workflows.storage import _queries as q
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._errors import (
    ClaimHeldError,
    ClaimLostError,
    ClaimLostReason,
    InvalidTransitionError,
    RevisionConflictError,
    RunNotFoundError,
)
from pi_workflows.storage._rows import LeaseRow, ServerLeaseRow

__all__ = [
    "DEFAULT_CLAIM_TTL_MS",
    "EVENT_TEXT_CHARS",
    "MAX_EVENT_PAYLOAD_BYTES",
    "Claim",
    "OwnerType",
    "RenewedClaim",
    "RunHead",
    "ServerClaim",
    "WriteResult",
    "acquire_claim",
    "acquire_server_epoch",
    "append_event",
    "check_claim",
    "encode_payload",
    "event_text",
    "get_lease",
    "get_server_lease",
    "grant_claim",
    "hash_token",
    "holds_server_lease",
    "protected_write",
    "read_head",
    "release_claim",
    "release_server_epoch",
    "renew_claim",
    "renew_owner_claims",
    "renew_server_epoch",
    "retake_server_epoch",
]

DEFAULT_CLAIM_TTL_MS = 30_000
"""Run claim lifetime; the claim-renewer timer renews every 10 s (a third of it)."""

MAX_EVENT_PAYLOAD_BYTES = 1024 * 1024
"""One event payload is at most 1 MiB of JSON, the protocol frame limit."""

TERMINAL_STATUSES = frozenset({"completed", "failed", "timed_out", "cancelled"})


class OwnerType(enum.StrEnum):
    """Known claim owner types (the column accepts any short name)."""

    HOST = "host"
    """The server launching and supervising a runner (a retained version-1 identifier)."""
    CONTROL = "control"
    """The server taking over a run whose claim expired (recovery, cancel, timeouts)."""


def hash_token(token: str) -> str:
    """Return the stored form of a claim token: the hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _new_token() -> tuple[str, str]:
    token = secrets.token_urlsafe(32)
    return token, hash_token(token)


@dataclass(frozen=True, slots=True)
class Claim:
    """A held claim on one run: the capability a protected write presents.

    Only `acquire_claim` and `claim_for_launch` create claims. `token` is secret: it
    is excluded from `repr` and must never be logged or stored.
    """

    run_id: str
    """The claimed run (the lease resource)."""
    owner_type: str
    """Who holds it, e.g. `OwnerType.HOST`."""
    owner_id: str
    """Which holder, e.g. the server epoch's owner ID."""
    generation: int
    """The fencing number; every new claim on a run gets the next one."""
    token: str = field(repr=False)
    """The raw random token; the database has only its hash."""
    ttl_ms: int = DEFAULT_CLAIM_TTL_MS
    """How far each renewal moves the expiry past the renewal time."""
    token_hash: str = field(init=False, repr=False, compare=False)
    """`hash_token(token)`, computed once; as secret as the token itself."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_hash", hash_token(self.token))


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a protected write or lifecycle transition committed (once the tx commits)."""

    run_id: str
    revision: int
    """The run's new revision, equal to the revision of the appended event."""
    generation: int
    """The claim generation that wrote it (0 for unclaimed transitions of a new run)."""
    expires_at: int | None
    """The renewed claim expiry, or None when the write released or used no claim."""


@dataclass(frozen=True, slots=True)
class RenewedClaim:
    """One claim the renewer extended."""

    resource: str
    generation: int
    expires_at: int


@dataclass(frozen=True, slots=True)
class RunHead:
    """Everything a protected write checks, read in one statement. Internal.

    `lease_token_hash` is excluded from `repr`.
    """

    run_id: str
    status: str
    paused: int
    revision: int
    generation: int
    queue_state: str | None
    lease_owner_type: str | None
    lease_owner_id: str | None
    lease_token_hash: str | None = field(repr=False)
    lease_generation: int | None
    lease_expires_at: int | None

    def lease_is_live(self, now: int) -> bool:
        """Whether a claim is held and unexpired at `now`."""
        return self.lease_expires_at is not None and self.lease_expires_at > now


def read_head(tx: Reader, run_id: str) -> RunHead:
    """Read the run, queue and lease facts of `run_id`.

    Raises:
        RunNotFoundError: there is no such run.
    """
    head = tx.fetch_one(q.SELECT_RUN_HEAD, {"run_id": run_id}, RunHead)
    if head is None:
        raise RunNotFoundError(run_id)
    return head


def _mismatch(
    head: RunHead | None, claim: Claim, now: int, *, require_live: bool
) -> ClaimLostReason | None:
    """Compare a presented claim with the stored lease, in the documented order."""
    if head is None or head.lease_generation is None:
        return ClaimLostReason.MISSING_AUTHORITY
    if head.lease_generation != claim.generation:
        return ClaimLostReason.GENERATION_CHANGED
    if head.lease_owner_type != claim.owner_type or head.lease_owner_id != claim.owner_id:
        return ClaimLostReason.OWNER_CHANGED
    if head.lease_token_hash != claim.token_hash:
        return ClaimLostReason.TOKEN_CHANGED
    if require_live and (head.lease_expires_at is None or head.lease_expires_at <= now):
        return ClaimLostReason.EXPIRED
    return None


def check_claim(tx: Tx, claim: Claim, *, require_live: bool = True) -> RunHead:
    """Verify that `claim` is the run's current claim, changing nothing.

    Check order, first failure wins: `missingAuthority` (no run or no claim held),
    `generationChanged` (the fence: another generation holds the run),
    `ownerChanged`, `tokenChanged`, then `expired` (only when `require_live`).
    Generation comes first because a stale holder's most useful diagnosis is "a newer
    generation took over", even if the same owner took it; owner and token mismatches
    within one generation mean a forged or corrupted claim; expiry is checked last,
    for an otherwise exact claim.

    Raises:
        ClaimLostError: with the one reason of the first failed check.
    """
    head = tx.fetch_one(q.SELECT_RUN_HEAD, {"run_id": claim.run_id}, RunHead)
    reason = _mismatch(head, claim, tx.now, require_live=require_live)
    if reason is not None:
        raise ClaimLostError(claim.run_id, claim.generation, reason)
    assert head is not None
    return head


EVENT_TEXT_CHARS = 16 * 1024
"""The most characters of an error or reason an event payload copies: the attempt or
run row keeps the whole text (the run view references it), and a payload stays small."""


def event_text(text: str) -> str:
    """`text`, or its head and a note of what was cut, for an event payload."""
    if len(text) <= EVENT_TEXT_CHARS:
        return text
    return f"{text[:EVENT_TEXT_CHARS]} … ({len(text) - EVENT_TEXT_CHARS} more characters)"


def encode_payload(payload: Any) -> str:
    """Encode an event payload as JSON text, refusing payloads above 1 MiB."""
    data = orjson.dumps(payload)
    if len(data) > MAX_EVENT_PAYLOAD_BYTES:
        raise ValueError(f"event payload is {len(data)} bytes; the limit is 1 MiB")
    return data.decode("utf-8")


def append_event(
    tx: Tx, run_id: str, *, revision: int, event_type: str, generation: int, payload: Any
) -> None:
    """Insert the immutable event of `revision` (the caller updated `runs.revision`)."""
    tx.execute(
        q.INSERT_EVENT,
        {
            "run_id": run_id,
            "revision": revision,
            "event_type": event_type,
            "generation": generation,
            "payload": encode_payload(payload),
            "now": tx.now,
        },
    )


def protected_write(
    tx: Tx,
    claim: Claim,
    *,
    event_type: str,
    payload: Any = None,
    change: Callable[[Tx], None] | None = None,
    expected_revision: int | None = None,
) -> WriteResult:
    """Apply one change under a live claim, in the caller's transaction.

    The eight steps of workflow-server.md § Claim rules: (1) read the run's revision
    and lease, (2) compare generation, owner type and ID, and token hash, (3) require a
    future expiry (and `expected_revision`, when given), and (4) renew the heartbeat and
    expiry of that exact claim, all in one `UPDATE ... RETURNING` that matches only the
    exact live claim; only when it matches nothing does a second read find the reason
    (in `check_claim`'s order). Then (5) call `change(tx)`, (6) append the immutable
    event, (7) increase the run revision by one; (8) the caller's `write()` commits.
    All checks run before the first change, so a refusal leaves the transaction exactly
    as it was.

    **Durability:** nothing is durable until the enclosing `Database.write()` block
    commits; if `change` raises, the block rolls everything back.

    Args:
        tx: the open write transaction.
        claim: the caller's claim on the run.
        event_type: the event's type, e.g. `node_update`.
        payload: the event payload (JSON-serializable, at most 1 MiB encoded).
        change: the domain change; it receives `tx` and must write only the run's rows.
        expected_revision: if given, the run's revision must equal it.

    Raises:
        ClaimLostError: the claim is not the live claim (see `check_claim` for the order).
        RevisionConflictError: the run is not at `expected_revision`.
    """
    expires_at = tx.now + claim.ttl_ms
    revision = tx.fetch_value(
        q.UPDATE_LEASE_CHECK_RENEW,
        {
            "run_id": claim.run_id,
            "generation": claim.generation,
            "owner_type": claim.owner_type,
            "owner_id": claim.owner_id,
            "token_hash": claim.token_hash,
            "now": tx.now,
            "expires_at": expires_at,
            "expected_revision": expected_revision,
        },
    )
    if revision is None:
        _raise_refusal(tx, claim, expected_revision)
    if change is not None:
        change(tx)
    revision += 1
    tx.execute(q.UPDATE_RUN_REVISION, {"run_id": claim.run_id, "revision": revision, "now": tx.now})
    append_event(
        tx,
        claim.run_id,
        revision=revision,
        event_type=event_type,
        generation=claim.generation,
        payload=payload,
    )
    return WriteResult(claim.run_id, revision, claim.generation, expires_at)


def _raise_refusal(tx: Tx, claim: Claim, expected_revision: int | None) -> NoReturn:
    """Explain why the fast path matched no claim: the claim reason, else the revision."""
    head = check_claim(tx, claim)
    if expected_revision is not None and head.revision != expected_revision:
        raise RevisionConflictError(claim.run_id, expected_revision, head.revision)
    raise AssertionError("the protected write matched no claim, yet every check passes")


def grant_claim(tx: Tx, head: RunHead, owner_type: str, owner_id: str, ttl_ms: int) -> Claim:
    """Issue the next generation's claim on a checked run. Internal: no checks here."""
    if ttl_ms <= 0:
        raise ValueError("a claim needs a positive lifetime")
    generation = head.generation + 1
    token, token_hash = _new_token()
    tx.execute(q.UPDATE_RUN_GENERATION, {"run_id": head.run_id, "generation": generation})
    tx.execute(
        q.UPSERT_LEASE,
        {
            "run_id": head.run_id,
            "owner_type": owner_type,
            "owner_id": owner_id,
            "token_hash": token_hash,
            "generation": generation,
            "now": tx.now,
            "expires_at": tx.now + ttl_ms,
        },
    )
    return Claim(head.run_id, owner_type, owner_id, generation, token, ttl_ms)


def acquire_claim(
    tx: Tx,
    run_id: str,
    *,
    owner_type: str,
    owner_id: str,
    ttl_ms: int = DEFAULT_CLAIM_TTL_MS,
) -> Claim:
    """Take a new claim on a nonterminal run whose lease is absent or expired.

    The run's generation increases by one, fencing every earlier holder. This is the
    recovery path ("first takes a new claim"); it appends no event and does not change
    the run revision. Launches use `claim_for_launch`, which also changes state.

    **Durability:** the claim exists once the enclosing `write()` commits.

    Raises:
        RunNotFoundError: there is no such run.
        InvalidTransitionError: the run is terminal (a terminal run never has a claim).
        ClaimHeldError: the current claim is still live; it cannot be taken over.
    """
    head = read_head(tx, run_id)
    if head.status in TERMINAL_STATUSES:
        raise InvalidTransitionError(run_id, head.status, "acquire a claim")
    if head.lease_is_live(tx.now):
        assert head.lease_generation is not None and head.lease_expires_at is not None
        raise ClaimHeldError(run_id, head.lease_generation, head.lease_expires_at)
    return grant_claim(tx, head, owner_type, owner_id, ttl_ms)


def renew_claim(tx: Tx, claim: Claim) -> int:
    """Renew one exact, still-live claim and return its new expiry.

    An expired claim cannot renew itself, even with the right token.

    Raises:
        ClaimLostError: as for `protected_write`.
    """
    check_claim(tx, claim)
    expires_at = tx.now + claim.ttl_ms
    tx.execute(
        q.UPDATE_LEASE_RENEW,
        {
            "run_id": claim.run_id,
            "generation": claim.generation,
            "now": tx.now,
            "expires_at": expires_at,
        },
    )
    return expires_at


def renew_owner_claims(
    tx: Tx, *, owner_type: str, owner_id: str, ttl_ms: int = DEFAULT_CLAIM_TTL_MS
) -> list[RenewedClaim]:
    """Renew every live claim of one owner (the claim-renewer timer's backup renewal).

    Expired claims are skipped: they stay expired until recovery takes a new claim.
    Returns the renewed claims, ordered by resource.
    """
    rows = tx.fetch_all(
        q.UPDATE_OWNER_LEASES_RENEW,
        {
            "owner_type": owner_type,
            "owner_id": owner_id,
            "now": tx.now,
            "expires_at": tx.now + ttl_ms,
        },
        RenewedClaim,
    )
    return sorted(rows, key=lambda row: row.resource)


def release_claim(tx: Tx, claim: Claim) -> None:
    """Release one exact claim (its expiry does not matter; its identity does).

    Raises:
        ClaimLostError: `missingAuthority`, `generationChanged`, `ownerChanged` or
            `tokenChanged`; an expired but otherwise exact claim is released.
    """
    check_claim(tx, claim, require_live=False)
    tx.execute(q.DELETE_LEASE, {"run_id": claim.run_id})


def get_lease(reader: Reader, run_id: str) -> LeaseRow | None:
    """Return the claim held on `run_id` (live or expired), without its token hash."""
    return reader.fetch_one(q.SELECT_LEASE, {"run_id": run_id}, LeaseRow)


# --- The server lease and epoch -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerClaim:
    """The live server lease of this process; `token` is secret and not in `repr`."""

    epoch: int
    """The server epoch; messages from an older epoch are rejected."""
    owner_id: str
    token: str = field(repr=False)
    ttl_ms: int = DEFAULT_CLAIM_TTL_MS


@dataclass(frozen=True, slots=True)
class _ServerHead:
    epoch: int
    owner_id: str
    token_hash: str = field(repr=False)
    expires_at: int
    released_at: int | None


def acquire_server_epoch(
    tx: Tx,
    *,
    owner_id: str,
    pid: int | None,
    ttl_ms: int = DEFAULT_CLAIM_TTL_MS,
    previous_owner_gone: bool = False,
) -> ServerClaim:
    """Take the server lease with the next epoch (the first step of recovery).

    Args:
        owner_id: this server process's owner ID.
        pid: this process's PID, for status and diagnostics.
        ttl_ms: the lease lifetime; the claim renewer renews it.
        previous_owner_gone: the caller proved the previous holder dead (it holds the
            global OS lock), so a still-unexpired lease is taken over at once instead
            of waiting for its expiry.

    Raises:
        ClaimHeldError: another server's lease is live and `previous_owner_gone` is
            false (resource `server`).
    """
    head = tx.fetch_one(q.SELECT_SERVER_LEASE_HEAD, {}, _ServerHead)
    live = head is not None and head.released_at is None and head.expires_at > tx.now
    if live and not previous_owner_gone:
        assert head is not None
        raise ClaimHeldError("server", head.epoch, head.expires_at)
    epoch = 1 if head is None else head.epoch + 1
    token, token_hash = _new_token()
    tx.execute(
        q.UPSERT_SERVER_LEASE,
        {
            "epoch": epoch,
            "owner_id": owner_id,
            "token_hash": token_hash,
            "pid": pid,
            "now": tx.now,
            "expires_at": tx.now + ttl_ms,
        },
    )
    return ServerClaim(epoch, owner_id, token, ttl_ms)


def _check_server_claim(tx: Tx, claim: ServerClaim, *, require_live: bool) -> None:
    head = tx.fetch_one(q.SELECT_SERVER_LEASE_HEAD, {}, _ServerHead)
    if head is None or head.released_at is not None:
        reason: ClaimLostReason | None = ClaimLostReason.MISSING_AUTHORITY
    elif head.epoch != claim.epoch:
        reason = ClaimLostReason.GENERATION_CHANGED
    elif head.owner_id != claim.owner_id:
        reason = ClaimLostReason.OWNER_CHANGED
    elif head.token_hash != hash_token(claim.token):
        reason = ClaimLostReason.TOKEN_CHANGED
    elif require_live and head.expires_at <= tx.now:
        reason = ClaimLostReason.EXPIRED
    else:
        reason = None
    if reason is not None:
        raise ClaimLostError("server", claim.epoch, reason)


def renew_server_epoch(tx: Tx, claim: ServerClaim) -> int:
    """Renew this server's live lease and return the new expiry.

    Raises:
        ClaimLostError: the lease expired, was released, or a newer epoch holds it.
    """
    _check_server_claim(tx, claim, require_live=True)
    expires_at = tx.now + claim.ttl_ms
    tx.execute(
        q.UPDATE_SERVER_LEASE_RENEW, {"epoch": claim.epoch, "now": tx.now, "expires_at": expires_at}
    )
    return expires_at


def retake_server_epoch(tx: Tx, claim: ServerClaim, *, pid: int | None) -> ServerClaim:
    """After a stall: take the next epoch if the lease row is still this server's.

    An expired lease cannot renew itself, but a server that stalled past its expiry (a
    suspended laptop, SIGSTOP, a wall-clock step) may start a new epoch when no other
    server took the row in the meantime: the same epoch, owner and token, not released.
    The owner ID stays, so this process's run claims stay its own; the epoch and the
    token are new, as at a start. The caller proves the global lock is still its own.

    Raises:
        ClaimLostError: the row names another epoch, owner or token, or was released: a
            real competitor took over (or this server is stopping), so it must exit.
    """
    _check_server_claim(tx, claim, require_live=False)
    epoch = claim.epoch + 1
    token, token_hash = _new_token()
    tx.execute(
        q.UPSERT_SERVER_LEASE,
        {
            "epoch": epoch,
            "owner_id": claim.owner_id,
            "token_hash": token_hash,
            "pid": pid,
            "now": tx.now,
            "expires_at": tx.now + claim.ttl_ms,
        },
    )
    return ServerClaim(epoch, claim.owner_id, token, claim.ttl_ms)


def release_server_epoch(tx: Tx, claim: ServerClaim) -> None:
    """Release this server's lease at shutdown; the epoch number is kept.

    Raises:
        ClaimLostError: a newer epoch holds the lease (or it was already released).
    """
    _check_server_claim(tx, claim, require_live=False)
    tx.execute(q.UPDATE_SERVER_LEASE_RELEASE, {"epoch": claim.epoch, "now": tx.now})


_SELECT_HOLDS_SERVER_LEASE = """
SELECT 1 FROM server_lease WHERE singleton = 1 AND owner_id = :owner_id
  AND released_at IS NULL AND expires_at > :now
"""


def holds_server_lease(reader: Reader, owner_id: str, now: int) -> bool:
    """Whether `owner_id` holds the live server lease at `now` (checked before a server
    claims new work: a server that woke from a stall past its lease, or lost it to a
    competitor, admits nothing until its renewer took the next epoch)."""
    found = reader.fetch_value(_SELECT_HOLDS_SERVER_LEASE, {"owner_id": owner_id, "now": now})
    return found is not None


def get_server_lease(reader: Reader) -> ServerLeaseRow | None:
    """Return the server lease record without its token hash."""
    return reader.fetch_one(q.SELECT_SERVER_LEASE, {}, ServerLeaseRow)
