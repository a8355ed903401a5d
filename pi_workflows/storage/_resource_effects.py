"""Resource managers' managed effects (`ctx.effects.ensure`) on the shared effect records.

Implements resource-managers.md § The manager: an effect is recorded before it is
applied, a pending or indeterminate one is observed before anything else, a key reused
with another request is an error. Internal; `pi_workflows.storage` exports it.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from pi_workflows.storage import _queries as q
from pi_workflows.storage._content import put_blob, put_json_blob, read_json_blob
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._effects import effect_fingerprint
from pi_workflows.storage._errors import EffectConflictError
from pi_workflows.storage._resources import ResourceClaim, check_resource_claim
from pi_workflows.wire.canonical import dumps

__all__ = [
    "ResourceEffect",
    "ResourceEffectDecision",
    "reserve_resource_effect",
    "retry_resource_effect",
    "settle_resource_effect",
]

_NOT_APPLIED = "not applied (proven by observe)"


class ResourceEffectDecision(enum.StrEnum):
    """What the pass does after `reserve_resource_effect`."""

    APPLY = "apply"
    """Call `apply` now: this pass owns the effect's in-flight attempt."""
    OBSERVE = "observe"
    """Indeterminate: an earlier pass reserved it and never settled it (its runner or
    the server died mid-apply). Call `observe` first, then `settle_resource_effect(...,
    observed=True)` or, if it proves nothing applied, `retry_resource_effect`."""
    ADOPT = "adopt"
    """Settled before: use the stored state and result, never apply again."""


@dataclass(frozen=True, slots=True)
class ResourceEffect:
    """A resource's effect after a reservation or settlement."""

    effect_id: str
    key: str
    """The manager's key (without the resource scope the database adds)."""
    kind: str
    state: str
    """pending, applying, applied or rejected."""
    decision: ResourceEffectDecision
    attempt: int
    """The number of the latest attempt."""
    result: Any = None
    """The stored result of an applied effect."""
    error: str | None = None


@dataclass(frozen=True, slots=True)
class _Row:
    effect_id: str
    resource_uid: str | None
    effect_type: str
    idempotency_key: str
    request_fingerprint: str
    state: str
    result_hash: str | None
    error: str | None
    last_attempt_number: int | None
    last_executor_epoch: str | None


def _stored_key(uid: str, key: str) -> str:
    """The effect's key in the shared table: scoped by its resource."""
    return f"resource:{uid}:{key}"


def _effect_id(stored_key: str) -> str:
    return "effect-" + hashlib.sha256(stored_key.encode("utf-8")).hexdigest()[:32]


def _read(reader: Reader, uid: str, key: str) -> _Row | None:
    params = {"idempotency_key": _stored_key(uid, key)}
    return reader.fetch_one(q.SELECT_RESOURCE_EFFECT_BY_KEY, params, _Row)


def _view(reader: Reader, row: _Row, key: str, decision: ResourceEffectDecision) -> ResourceEffect:
    result = None if row.result_hash is None else read_json_blob(reader, row.result_hash)
    return ResourceEffect(
        effect_id=row.effect_id,
        key=key,
        kind=row.effect_type,
        state=row.state,
        decision=decision,
        attempt=row.last_attempt_number or 0,
        result=result,
        error=row.error,
    )


def _open_attempt(tx: Tx, row: _Row, executor: str) -> None:
    tx.execute(q.UPDATE_EFFECT_START, {"effect_id": row.effect_id, "now": tx.now})
    tx.execute(
        q.INSERT_EFFECT_ATTEMPT,
        {
            "effect_id": row.effect_id,
            "attempt_number": (row.last_attempt_number or 0) + 1,
            "executor_epoch": executor,
            "now": tx.now,
        },
    )
    tx.execute(q.UPDATE_EFFECT_TOUCH, {"effect_id": row.effect_id, "now": tx.now})


def reserve_resource_effect(
    tx: Tx, claim: ResourceClaim, *, key: str, kind: str, request: Any
) -> ResourceEffect:
    """Record the effect of `key` before the pass applies it, or find it.

    Under the pass's live claim (no version check: an effect is not a resource write).
    A new key opens attempt 1 for this pass (`apply`). The same key and request: an
    attempt of this pass is `apply` again (a retried message); one of an earlier pass
    that never settled is `observe`; a pending effect opens the next attempt (`apply`);
    an applied or rejected one is `adopt`.

    Raises:
        ClaimLostError: the claim is not the live claim.
        EffectConflictError: `requestMismatch`, the key is bound to another kind or
            request (a changed request needs a new key).
    """
    if not 1 <= len(key) <= 512:
        raise ValueError("an effect key has 1 to 512 characters")
    check_resource_claim(tx, claim)
    fingerprint = effect_fingerprint(kind, request)
    row = _read(tx, claim.uid, key)
    if row is None:
        stored = _stored_key(claim.uid, key)
        effect_id = _effect_id(stored)
        tx.execute(
            q.INSERT_RESOURCE_EFFECT,
            {
                "effect_id": effect_id,
                "resource_uid": claim.uid,
                "effect_type": kind,
                "idempotency_key": stored,
                "request_fingerprint": fingerprint,
                "request_hash": put_blob(tx, dumps({"effectType": kind, "request": request})),
                "now": tx.now,
            },
        )
        tx.execute(
            q.INSERT_EFFECT_ATTEMPT,
            {
                "effect_id": effect_id,
                "attempt_number": 1,
                "executor_epoch": claim.reconcile_id,
                "now": tx.now,
            },
        )
        return ResourceEffect(effect_id, key, kind, "applying", ResourceEffectDecision.APPLY, 1)
    if row.request_fingerprint != fingerprint:
        raise EffectConflictError(
            key, "requestMismatch", "the key was reserved for another request"
        )
    if row.state == "applying":
        mine = row.last_executor_epoch == claim.reconcile_id
        decision = ResourceEffectDecision.APPLY if mine else ResourceEffectDecision.OBSERVE
        return _view(tx, row, key, decision)
    if row.state == "pending":
        _open_attempt(tx, row, claim.reconcile_id)
        fresh = _read(tx, claim.uid, key)
        assert fresh is not None
        return _view(tx, fresh, key, ResourceEffectDecision.APPLY)
    return _view(tx, row, key, ResourceEffectDecision.ADOPT)


def settle_resource_effect(
    tx: Tx,
    claim: ResourceClaim,
    *,
    key: str,
    outcome: Literal["applied", "rejected"],
    result: Any = None,
    error: str | None = None,
    observed: bool = False,
) -> ResourceEffect:
    """Close the effect's in-flight attempt and the effect with `outcome`.

    Only the pass that owns the attempt may settle it, unless `observed`: `observe`
    proved the outcome of an earlier pass's attempt. Settling again with the same
    outcome changes nothing; another outcome is a conflict.

    Raises:
        ClaimLostError: the claim is not the live claim.
        EffectConflictError: `notFound`, `notExecutor` (another pass's attempt, not
            observed) or `outcomeMismatch`.
    """
    check_resource_claim(tx, claim)
    row = _read(tx, claim.uid, key)
    if row is None:
        raise EffectConflictError(key, "notFound", "no effect was reserved under the key")
    if row.state in ("applied", "rejected"):
        if row.state != outcome:
            raise EffectConflictError(key, "outcomeMismatch", f"the effect is {row.state}")
        return _view(tx, row, key, ResourceEffectDecision.ADOPT)
    if row.state != "applying":
        raise EffectConflictError(key, "terminal", f"the effect is {row.state}")
    if not observed and row.last_executor_epoch != claim.reconcile_id:
        raise EffectConflictError(key, "notExecutor", "another pass owns the attempt")
    result_hash = put_json_blob(tx, result) if outcome == "applied" else None
    params = {
        "effect_id": row.effect_id,
        "state": outcome,
        "result_hash": result_hash,
        "error": error,
        "now": tx.now,
    }
    tx.execute(q.UPDATE_EFFECT_ATTEMPT_CLOSE, params)
    tx.execute(q.UPDATE_EFFECT_SETTLE, params)
    settled = _read(tx, claim.uid, key)
    assert settled is not None
    return _view(tx, settled, key, ResourceEffectDecision.ADOPT)


def retry_resource_effect(tx: Tx, claim: ResourceClaim, *, key: str) -> ResourceEffect:
    """`observe` proved that the in-flight attempt did not apply: it becomes `cancelled`
    and this pass opens the next attempt (`apply`).

    Raises:
        ClaimLostError: the claim is not the live claim.
        EffectConflictError: `notFound`, or `terminal` (it is settled).
    """
    check_resource_claim(tx, claim)
    row = _read(tx, claim.uid, key)
    if row is None:
        raise EffectConflictError(key, "notFound", "no effect was reserved under the key")
    if row.state != "applying":
        raise EffectConflictError(key, "terminal", f"the effect is {row.state}")
    if row.last_executor_epoch == claim.reconcile_id:
        return _view(tx, row, key, ResourceEffectDecision.APPLY)
    tx.execute(
        q.UPDATE_EFFECT_ATTEMPT_CLOSE,
        {
            "effect_id": row.effect_id,
            "state": "cancelled",
            "result_hash": None,
            "error": _NOT_APPLIED,
            "now": tx.now,
        },
    )
    tx.execute(
        q.INSERT_EFFECT_ATTEMPT,
        {
            "effect_id": row.effect_id,
            "attempt_number": (row.last_attempt_number or 0) + 1,
            "executor_epoch": claim.reconcile_id,
            "now": tx.now,
        },
    )
    tx.execute(q.UPDATE_EFFECT_TOUCH, {"effect_id": row.effect_id, "now": tx.now})
    fresh = _read(tx, claim.uid, key)
    assert fresh is not None
    return _view(tx, fresh, key, ResourceEffectDecision.APPLY)
