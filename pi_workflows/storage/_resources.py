"""Resource-manager state: resources, their reconcile queue and claims, passes, child runs.

Implements resource-managers.md and workflow-server.md § Resource managers: every write
of a pass is checked against its resource claim and the resource version it read, in
one transaction with the resource's event. Internal; `pi_workflows.storage` exports it.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from pi_workflows.storage import _queries as q
from pi_workflows.storage._claims import DEFAULT_CLAIM_TTL_MS, hash_token
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._errors import (
    ClaimHeldError,
    ClaimLostError,
    ClaimLostReason,
    StorageError,
)
from pi_workflows.wire.canonical import dumps, sha256_digest

__all__ = [
    "BACKOFF_BASE_MS",
    "BACKOFF_CAP_MS",
    "CONDITION_STATUSES",
    "HISTORY_KEPT",
    "MAX_RESOURCE_EVENT_BYTES",
    "MAX_RESOURCE_JSON_BYTES",
    "RESOURCE_OWNER",
    "ChildRunConflictError",
    "ChildRunRecord",
    "ChildRunReservation",
    "ClaimedReconcile",
    "DeleteOutcome",
    "ParentResource",
    "PassOutcome",
    "PassRecord",
    "PassResult",
    "ReconcileCommit",
    "ResourceApplied",
    "ResourceClaim",
    "ResourceDeletingError",
    "ResourceEffectRow",
    "ResourceEventRow",
    "ResourceLimitError",
    "ResourceNotFoundError",
    "ResourceQueueRow",
    "ResourceRecord",
    "ResourceSummary",
    "ResourceVersionConflictError",
    "ScheduledReconcile",
    "apply_resource",
    "check_resource_claim",
    "claim_next_resource",
    "commit_reconcile",
    "count_due_reconciles",
    "count_reconciling",
    "enqueue_resource",
    "get_resource",
    "get_resource_by_uid",
    "get_resource_queue_row",
    "has_expired_resource_claims",
    "list_reconcile_history",
    "list_resource_child_runs",
    "list_resource_effects",
    "list_resource_events",
    "list_resources",
    "next_reconcile_due_at",
    "reconcile_backoff_ms",
    "recover_resource_claims",
    "release_resource_claim",
    "renew_resource_claim",
    "request_resource_deletion",
    "reserve_child_run",
    "run_parent_resource",
    "scheduled_reconciles",
]

MAX_RESOURCE_JSON_BYTES = 1024 * 1024
"""A resource's spec, status value and conditions are each at most 1 MiB of JSON."""

MAX_RESOURCE_EVENT_BYTES = 64 * 1024
"""A resource event payload is at most 64 KiB of JSON."""

HISTORY_KEPT = 50
"""How many pass records `reconcile_history` keeps per resource (the newest)."""

BACKOFF_BASE_MS = 1_000
"""The backoff after the first failed pass (before jitter)."""

BACKOFF_CAP_MS = 300_000
"""No backoff is longer than five minutes."""

RESOURCE_OWNER = "resourceRunner"
"""The owner type of the claim a reconcile pass holds."""

CONDITION_STATUSES = frozenset({"True", "False", "Unknown"})
"""The values of a condition's `status` (as `pi_workflows.resource_managers` writes them)."""

PassOutcome = Literal["settled", "requeue", "requeueAfter", "error"]
"""How a pass ended: settled (done until a wake-up), requeue (as soon as capacity
allows), requeueAfter (later), error (backoff)."""

_OUTCOMES: frozenset[str] = frozenset({"settled", "requeue", "requeueAfter", "error"})


# --- errors ---------------------------------------------------------------------------------


class ResourceNotFoundError(StorageError):
    """No resource has this identity (manager, project, key) or uid."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"no resource {what}")


class ResourceVersionConflictError(StorageError):
    """A pass's commit read an older resource version: the resource changed meanwhile
    (a new spec, a deletion request). Nothing was changed; a new pass re-reads it."""

    def __init__(self, uid: str, expected: int, actual: int) -> None:
        self.uid = uid
        self.expected = expected
        self.actual = actual
        super().__init__(f"resource {uid} is at version {actual}, not {expected}")


class ResourceDeletingError(StorageError):
    """The resource's deletion was requested; it accepts no new spec."""

    def __init__(self, uid: str) -> None:
        self.uid = uid
        super().__init__(f"resource {uid} is being deleted")


class ResourceLimitError(StorageError):
    """A spec, status, conditions value or list is too large or malformed."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class ChildRunConflictError(StorageError):
    """A child-run request key was reserved before for another input (or workflow).
    A changed input needs a new request key."""

    def __init__(self, uid: str, request_key: str) -> None:
        self.uid = uid
        self.request_key = request_key
        super().__init__(
            f"resource {uid}: request key {request_key!r} was reserved for another input"
        )


# --- records --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ResourceRow:
    uid: str
    manager: str
    project_path: str
    resource_key: str
    resource_version: int
    generation: int
    spec: str
    spec_digest: str
    status: str
    observed_generation: int
    conditions: str
    finalizers: str
    deletion_requested_at: int | None
    source_identity: str
    source_digest: str
    created_at: int
    updated_at: int


@dataclass(frozen=True, slots=True)
class ResourceRecord:
    """One resource, its JSON values decoded."""

    uid: str
    """Stable and never reused."""
    manager: str
    project_path: str
    key: str
    resource_version: int
    """Changes on every write: the compare-and-swap token of a pass."""
    generation: int
    """Changes only when the spec changes."""
    spec: Any
    spec_digest: str
    status: Any
    """The manager's own status value."""
    observed_generation: int
    """The generation the last status or conditions were written for."""
    conditions: tuple[dict[str, Any], ...]
    """Each: type, status (True/False/Unknown), reason, message?, observedGeneration,
    lastTransitionTime."""
    finalizers: tuple[str, ...]
    deletion_requested_at: int | None
    source_identity: dict[str, Any]
    source_digest: str
    created_at: int
    updated_at: int


def _record(row: _ResourceRow) -> ResourceRecord:
    return ResourceRecord(
        uid=row.uid,
        manager=row.manager,
        project_path=row.project_path,
        key=row.resource_key,
        resource_version=row.resource_version,
        generation=row.generation,
        spec=orjson.loads(row.spec),
        spec_digest=row.spec_digest,
        status=orjson.loads(row.status),
        observed_generation=row.observed_generation,
        conditions=tuple(orjson.loads(row.conditions)),
        finalizers=tuple(orjson.loads(row.finalizers)),
        deletion_requested_at=row.deletion_requested_at,
        source_identity=orjson.loads(row.source_identity),
        source_digest=row.source_digest,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


@dataclass(frozen=True, slots=True)
class ResourceSummary:
    """One row of the resource list: identity, versions, conditions (JSON text) and
    delivery state, without the spec or status value."""

    uid: str
    manager: str
    project_path: str
    resource_key: str
    resource_version: int
    generation: int
    observed_generation: int
    conditions: str
    finalizers: str
    deletion_requested_at: int | None
    updated_at: int
    available_at: int | None
    """When the key is due (None: not queued, settled)."""
    retries: int | None
    queue_reason: str | None
    claim_expires_at: int | None
    """The expiry of the pass claim, if one is held (it may have expired)."""


@dataclass(frozen=True, slots=True)
class ResourceQueueRow:
    """The one queue row of a resource."""

    uid: str
    available_at: int
    retries: int
    reason: str
    hints: int
    """How many enqueues updated the row (a pass compares it with what it claimed)."""
    enqueued_at: int
    updated_at: int


@dataclass(frozen=True, slots=True)
class ResourceEventRow:
    """One immutable resource event; `payload` is JSON text."""

    uid: str
    resource_version: int
    event_type: str
    payload: str
    recorded_at: int


@dataclass(frozen=True, slots=True)
class ResourceApplied:
    """What `apply_resource` did: `created`, `spec_changed` (a new generation),
    `changed` (any write: spec or manager source); neither is a no-op."""

    resource: ResourceRecord
    created: bool
    changed: bool
    spec_changed: bool


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    """A held claim on one resource's reconcile pass: the capability its writes present.

    `resource_version` and `generation` are what the pass read; its commit is refused
    if the resource has another version by then. `token` is secret (not in `repr`).
    """

    uid: str
    owner_type: str
    owner_id: str
    generation: int
    """The claim's fencing number (resources.claim_generation), not the spec's."""
    reconcile_id: str
    """Names the pass in the history and the logs."""
    resource_version: int
    resource_generation: int
    """The spec generation the pass reconciles."""
    token: str = field(repr=False)
    ttl_ms: int = DEFAULT_CLAIM_TTL_MS
    token_hash: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_hash", hash_token(self.token))


@dataclass(frozen=True, slots=True)
class ClaimedReconcile:
    """A claimed pass: the claim, the resource as the pass must read it, and the
    retry counter (consecutive failed passes before this one)."""

    claim: ResourceClaim
    resource: ResourceRecord
    retries: int


@dataclass(frozen=True, slots=True)
class _ClaimRow:
    uid: str
    owner_type: str
    owner_id: str
    token_hash: str = field(repr=False)
    generation: int
    reconcile_id: str
    resource_version: int
    hints: int
    acquired_at: int
    heartbeat_at: int
    expires_at: int


@dataclass(frozen=True, slots=True)
class PassResult:
    """What a resource runner proposes at the end of one pass.

    `status`, `conditions` and `finalizers` are None when the pass leaves them as they
    are. Conditions are mappings with `type`, `status` (True/False/Unknown), `reason`
    and an optional `message`; storage stamps `observedGeneration` (the generation the
    pass read) and `lastTransitionTime` (kept while a type's status stays the same).
    An `error` pass writes no status or conditions. The server builds it from the
    runner's proposal (`pi_workflows.resource_managers.ReconcileResult`, conditions as
    their `to_wire()`), or as `error` when the pass raised.
    """

    outcome: PassOutcome
    status: Any = None
    conditions: Sequence[Mapping[str, Any]] | None = None
    finalizers: Sequence[str] | None = None
    requeue_after_ms: int | None = None
    """For `requeueAfter`: the delay from the commit."""
    requeue_reason: str | None = None
    error_class: str | None = None
    """For `error`: a class name or code, never a message with user data."""
    duration_ms: int | None = None
    """How long the pass ran (default: from the claim to the commit)."""


@dataclass(frozen=True, slots=True)
class ReconcileCommit:
    """What `commit_reconcile` stored: the resource's version after it, whether the
    resource is gone (deletion with no finalizer left), and the next delivery
    (`available_at` None: the key is not queued)."""

    uid: str
    resource_version: int
    removed: bool
    available_at: int | None
    retries: int


@dataclass(frozen=True, slots=True)
class DeleteOutcome:
    """What `request_resource_deletion` did: removed at once (no finalizers), or
    marked for deletion and enqueued for its cleanup pass."""

    uid: str
    removed: bool
    resource_version: int | None


@dataclass(frozen=True, slots=True)
class ChildRunReservation:
    """A reserved child run: `created` False when the request key had it already."""

    run_id: str
    created: bool


@dataclass(frozen=True, slots=True)
class _ChildRow:
    uid: str
    request_key: str
    input_fingerprint: str
    workflow_name: str
    run_id: str
    reserved_at: int


@dataclass(frozen=True, slots=True)
class ChildRunRecord:
    """One child run of a resource; `run_status` is None until the run row exists."""

    request_key: str
    input_fingerprint: str
    workflow_name: str
    run_id: str
    reserved_at: int
    run_status: str | None


@dataclass(frozen=True, slots=True)
class ParentResource:
    """The resource that reserved a run, for the run's view."""

    uid: str
    manager: str
    project_path: str
    resource_key: str
    request_key: str


@dataclass(frozen=True, slots=True)
class PassRecord:
    """One committed pass in the bounded history."""

    reconcile_id: str
    generation: int
    outcome: str
    requeue_reason: str | None
    error_class: str | None
    started_at: int
    duration_ms: int
    recorded_at: int


@dataclass(frozen=True, slots=True)
class ResourceEffectRow:
    """One managed effect a resource's passes reserved."""

    effect_id: str
    effect_type: str
    idempotency_key: str
    state: str
    error: str | None
    created_at: int
    updated_at: int
    settled_at: int | None


@dataclass(frozen=True, slots=True)
class ScheduledReconcile:
    """A queued key (recovery step 7 and the scheduler's view of the queue)."""

    uid: str
    manager: str
    project_path: str
    resource_key: str
    available_at: int
    retries: int
    reason: str
    claim_expires_at: int | None


@dataclass(frozen=True, slots=True)
class _Uid:
    uid: str


# --- pure helpers ---------------------------------------------------------------------------


def reconcile_backoff_ms(
    retries: int, *, jitter: float, base_ms: int = BACKOFF_BASE_MS, cap_ms: int = BACKOFF_CAP_MS
) -> int:
    """The delay before the pass after `retries` consecutive failed passes (>= 1).

    Exponential with "equal jitter": the ceiling `min(cap, base * 2**(retries-1))`, of
    which the upper half is scaled by `jitter` in [0, 1). Below the cap, each step's
    range starts at the previous step's ceiling, so delays grow whatever the draws;
    once capped they stay in [cap/2, cap], and none exceeds `cap_ms`.
    """
    if retries < 1:
        raise ValueError("backoff needs at least one failed pass")
    if not 0.0 <= jitter < 1.0:
        raise ValueError("jitter must be in [0, 1)")
    ceiling: int = min(cap_ms, base_ms << min(retries - 1, 62))
    half = ceiling // 2
    return half + int((ceiling - half) * jitter)


def _json_text(value: Any, what: str, limit: int = MAX_RESOURCE_JSON_BYTES) -> str:
    """Canonical JSON text of `value`, refusing one that is not JSON or too large."""
    try:
        data = dumps(value)
    except (TypeError, ValueError) as exc:
        raise ResourceLimitError(f"the {what} is not JSON: {type(exc).__name__}") from None
    if len(data) > limit:
        raise ResourceLimitError(f"the {what} is {len(data)} bytes; the limit is {limit}")
    return data.decode("utf-8")


def _names(values: Sequence[str], what: str) -> tuple[str, ...]:
    """A list of distinct short names (finalizers), in first-seen order."""
    if isinstance(values, str):
        raise ResourceLimitError(f"{what} must be a list of names")
    names: list[str] = []
    for value in values:
        if not isinstance(value, str) or not 1 <= len(value) <= 200:
            raise ResourceLimitError(f"each of {what} must be a name of 1 to 200 characters")
        if value not in names:
            names.append(value)
    if len(names) > 64:
        raise ResourceLimitError(f"at most 64 {what}")
    return tuple(names)


def _stamp_conditions(
    given: Sequence[Mapping[str, Any]],
    previous: Sequence[Mapping[str, Any]],
    generation: int,
    now: int,
) -> list[dict[str, Any]]:
    """Validate `given` and stamp each with the generation and its transition time."""
    before = {c.get("type"): c for c in previous}
    stamped: list[dict[str, Any]] = []
    seen: set[str] = set()
    for condition in given:
        kind, status = condition.get("type"), condition.get("status")
        reason, message = condition.get("reason"), condition.get("message")
        if not isinstance(kind, str) or not 1 <= len(kind) <= 200 or kind in seen:
            raise ResourceLimitError("each condition needs a distinct type of 1 to 200 characters")
        if status not in CONDITION_STATUSES:
            raise ResourceLimitError("a condition's status is True, False or Unknown")
        if not isinstance(reason, str) or not 1 <= len(reason) <= 200:
            raise ResourceLimitError("each condition needs a reason of 1 to 200 characters")
        if message is not None and not isinstance(message, str):
            raise ResourceLimitError("a condition's message is text")
        seen.add(kind)
        old = before.get(kind)
        same = old is not None and old.get("status") == status
        entry: dict[str, Any] = {"type": kind, "status": status, "reason": reason}
        if message is not None:
            entry["message"] = message
        entry["observedGeneration"] = generation
        entry["lastTransitionTime"] = old["lastTransitionTime"] if same and old else now
        stamped.append(entry)
    return stamped


def _event(tx: Tx, uid: str, version: int, event_type: str, payload: Mapping[str, Any]) -> None:
    tx.execute(
        q.INSERT_RESOURCE_EVENT,
        {
            "uid": uid,
            "resource_version": version,
            "event_type": event_type,
            "payload": _json_text(dict(payload), "event payload", MAX_RESOURCE_EVENT_BYTES),
            "now": tx.now,
        },
    )


# --- reads ----------------------------------------------------------------------------------


def get_resource(
    reader: Reader, manager: str, project_path: str, key: str
) -> ResourceRecord | None:
    """The resource with this identity, or None."""
    params = {"manager": manager, "project_path": project_path, "resource_key": key}
    row = reader.fetch_one(q.SELECT_RESOURCE_BY_KEY, params, _ResourceRow)
    return None if row is None else _record(row)


def get_resource_by_uid(reader: Reader, uid: str) -> ResourceRecord | None:
    """The resource with this uid, or None."""
    row = reader.fetch_one(q.SELECT_RESOURCE_BY_UID, {"uid": uid}, _ResourceRow)
    return None if row is None else _record(row)


def _require(reader: Reader, uid: str) -> ResourceRecord:
    resource = get_resource_by_uid(reader, uid)
    if resource is None:
        raise ResourceNotFoundError(uid)
    return resource


def list_resources(
    reader: Reader,
    *,
    manager: str | None = None,
    project_path: str | None = None,
    limit: int = 1000,
) -> list[ResourceSummary]:
    """Resources by manager, project and key (optionally of one manager or project)."""
    params = {"manager": manager, "project_path": project_path, "limit": limit}
    return reader.fetch_all(q.SELECT_RESOURCE_SUMMARIES, params, ResourceSummary)


def get_resource_queue_row(reader: Reader, uid: str) -> ResourceQueueRow | None:
    """The resource's queue row, or None when it is not queued."""
    return reader.fetch_one(q.SELECT_RESOURCE_QUEUE_ROW, {"uid": uid}, ResourceQueueRow)


def list_resource_events(
    reader: Reader, uid: str, *, after: int = 0, limit: int = 100
) -> list[ResourceEventRow]:
    """The resource's events after version `after`, oldest first."""
    params = {"uid": uid, "after": after, "limit": limit}
    return reader.fetch_all(q.SELECT_RESOURCE_EVENTS, params, ResourceEventRow)


def list_reconcile_history(
    reader: Reader, uid: str, *, limit: int = HISTORY_KEPT
) -> list[PassRecord]:
    """The resource's recent passes, newest first."""
    return reader.fetch_all(q.SELECT_RECONCILE_HISTORY, {"uid": uid, "limit": limit}, PassRecord)


def list_resource_child_runs(reader: Reader, uid: str) -> list[ChildRunRecord]:
    """The resource's child runs in reservation order."""
    return reader.fetch_all(q.SELECT_RESOURCE_CHILD_RUNS, {"uid": uid}, ChildRunRecord)


def list_resource_effects(reader: Reader, uid: str) -> list[ResourceEffectRow]:
    """The resource's managed effects in reservation order."""
    return reader.fetch_all(q.SELECT_RESOURCE_EFFECTS, {"uid": uid}, ResourceEffectRow)


def run_parent_resource(reader: Reader, run_id: str) -> ParentResource | None:
    """The resource that reserved `run_id` as a child run, or None."""
    return reader.fetch_one(q.SELECT_RUN_PARENT_RESOURCE, {"run_id": run_id}, ParentResource)


def scheduled_reconciles(reader: Reader, *, limit: int = 1000) -> list[ScheduledReconcile]:
    """Every queued key, soonest first (recovery step 7 restores the schedule from it)."""
    return reader.fetch_all(q.SELECT_SCHEDULED_RECONCILES, {"limit": limit}, ScheduledReconcile)


def next_reconcile_due_at(reader: Reader, now: int) -> int | None:
    """The earliest time an unclaimed (or expired-claim) queued key is due, or None."""
    value = reader.fetch_value(q.SELECT_NEXT_RESOURCE_DUE_AT, {"now": now})
    return None if value is None else int(value)


def count_reconciling(reader: Reader, now: int) -> int:
    """Passes running at `now` (live resource claims): they use scheduler capacity."""
    return int(reader.fetch_value(q.COUNT_LIVE_RESOURCE_CLAIMS, {"now": now}))


def count_due_reconciles(reader: Reader, now: int) -> int:
    """Keys due at `now` that no live claim holds: reconciles waiting for admission."""
    return int(reader.fetch_value(q.COUNT_DUE_RESOURCES, {"now": now}))


# --- apply, enqueue, delete -----------------------------------------------------------------


def apply_resource(
    tx: Tx,
    *,
    manager: str,
    project_path: str,
    key: str,
    spec: Any,
    initial_status: Any,
    source_identity: Mapping[str, Any],
    source_digest: str,
    finalizers: Sequence[str] = (),
) -> ResourceApplied:
    """Create the resource, or give it a new spec (and manager source).

    A new resource starts at version 1 and generation 1 with `initial_status` and
    `finalizers`. A changed spec raises the generation; a changed manager source (its
    digest: the file was applied again) only the version. The same spec and source is a
    no-op that returns the current record and enqueues nothing. Every write bumps the
    version, appends its event and enqueues the key.

    Raises:
        ResourceLimitError: the spec or status is not JSON or larger than 1 MiB.
        ResourceDeletingError: the resource's deletion was requested.
    """
    spec_text = _json_text(spec, "spec")
    spec_digest = sha256_digest(spec)
    identity_text = _json_text(dict(source_identity), "source identity")
    current = get_resource(tx, manager, project_path, key)
    if current is None:
        status_text = _json_text(initial_status, "status")
        uid = f"resource-{uuid.uuid4().hex}"
        tx.execute(
            q.INSERT_RESOURCE,
            {
                "uid": uid,
                "manager": manager,
                "project_path": project_path,
                "resource_key": key,
                "spec": spec_text,
                "spec_digest": spec_digest,
                "status": status_text,
                "finalizers": _json_text(list(_names(finalizers, "finalizers")), "finalizers"),
                "source_identity": identity_text,
                "source_digest": source_digest,
                "now": tx.now,
            },
        )
        _event(tx, uid, 1, "resource.created", {"generation": 1, "specDigest": spec_digest})
        enqueue_resource(tx, uid, reason="applied")
        return ResourceApplied(_require(tx, uid), created=True, changed=True, spec_changed=True)
    spec_changed = current.spec_digest != spec_digest
    if not spec_changed and current.source_digest == source_digest:
        return ResourceApplied(current, created=False, changed=False, spec_changed=False)
    if current.deletion_requested_at is not None:
        raise ResourceDeletingError(current.uid)
    version = current.resource_version + 1
    generation = current.generation + 1 if spec_changed else current.generation
    tx.execute(
        q.UPDATE_RESOURCE_SPEC,
        {
            "uid": current.uid,
            "spec": spec_text,
            "spec_digest": spec_digest,
            "generation": generation,
            "source_identity": identity_text,
            "source_digest": source_digest,
            "resource_version": version,
            "now": tx.now,
        },
    )
    event_type = "resource.specChanged" if spec_changed else "resource.sourceChanged"
    _event(
        tx, current.uid, version, event_type, {"generation": generation, "specDigest": spec_digest}
    )
    enqueue_resource(tx, current.uid, reason="applied")
    updated = _require(tx, current.uid)
    return ResourceApplied(updated, created=False, changed=True, spec_changed=spec_changed)


def enqueue_resource(tx: Tx, uid: str, *, reason: str, delay_ms: int = 0) -> ResourceQueueRow:
    """A wake-up hint: make the key due at `now + delay_ms`, or keep it due earlier.

    There is one queue row per resource: repeated enqueues update it (and count a hint,
    so a pass that is running keeps the key queued when it settles), never add copies.
    The retry counter stays, so a hint does not reset the backoff of a failing resource
    but wakes it at once.

    Raises:
        ResourceNotFoundError: there is no such resource.
    """
    if delay_ms < 0:
        raise ValueError("a delay cannot be negative")
    if get_resource_by_uid(tx, uid) is None:
        raise ResourceNotFoundError(uid)
    params = {"uid": uid, "available_at": tx.now + delay_ms, "reason": reason, "now": tx.now}
    tx.execute(q.UPSERT_RESOURCE_QUEUE, params)
    row = get_resource_queue_row(tx, uid)
    assert row is not None
    return row


def _remove(tx: Tx, uid: str) -> None:
    """Delete the resource; its queue row, claim, history, events, child-run links and
    effects go with it (their runs stay, and are no longer protected)."""
    tx.execute(q.DELETE_RESOURCE, {"uid": uid})


def request_resource_deletion(tx: Tx, uid: str) -> DeleteOutcome:
    """Request deletion: remove the resource now if it holds no finalizer; otherwise
    record the deletion time (a new version and event) and enqueue its cleanup pass,
    whose commit removes it once its finalizers are empty. Requesting again while the
    deletion is pending changes nothing.

    Raises:
        ResourceNotFoundError: there is no such resource.
    """
    current = _require(tx, uid)
    if not current.finalizers:
        _remove(tx, uid)
        return DeleteOutcome(uid, removed=True, resource_version=None)
    if current.deletion_requested_at is not None:
        return DeleteOutcome(uid, removed=False, resource_version=current.resource_version)
    version = current.resource_version + 1
    tx.execute(q.UPDATE_RESOURCE_DELETION, {"uid": uid, "resource_version": version, "now": tx.now})
    _event(tx, uid, version, "resource.deletionRequested", {"finalizers": list(current.finalizers)})
    enqueue_resource(tx, uid, reason="deletionRequested")
    return DeleteOutcome(uid, removed=False, resource_version=version)


# --- claims ---------------------------------------------------------------------------------


def claim_next_resource(
    tx: Tx, *, owner_id: str, owner_type: str = RESOURCE_OWNER, ttl_ms: int = DEFAULT_CLAIM_TTL_MS
) -> ClaimedReconcile | None:
    """Claim the next due key for one pass, or None when no key is due.

    Skips keys with a live claim; a key whose claim expired is due again, and its new
    claim gets the next generation, which fences the old holder. The claim records the
    resource version and generation the pass reads.
    """
    if ttl_ms <= 0:
        raise ValueError("a claim needs a positive lifetime")
    uid = tx.fetch_value(q.SELECT_NEXT_DUE_RESOURCE, {"now": tx.now})
    if uid is None:
        return None
    return _claim(tx, str(uid), owner_type=owner_type, owner_id=owner_id, ttl_ms=ttl_ms)


def _claim(tx: Tx, uid: str, *, owner_type: str, owner_id: str, ttl_ms: int) -> ClaimedReconcile:
    held = tx.fetch_one(q.SELECT_RESOURCE_CLAIM, {"uid": uid}, _ClaimRow)
    if held is not None and held.expires_at > tx.now:
        raise ClaimHeldError(uid, held.generation, held.expires_at)
    resource = _require(tx, uid)
    queue = get_resource_queue_row(tx, uid)
    generation = int(tx.fetch_value(q.SELECT_RESOURCE_CLAIM_GENERATION, {"uid": uid})) + 1
    token = secrets.token_urlsafe(32)
    claim = ResourceClaim(
        uid=uid,
        owner_type=owner_type,
        owner_id=owner_id,
        generation=generation,
        reconcile_id=f"reconcile-{uuid.uuid4().hex}",
        resource_version=resource.resource_version,
        resource_generation=resource.generation,
        token=token,
        ttl_ms=ttl_ms,
    )
    tx.lifecycle.append("reconcile_claim")  # its COMMIT passes the claim's crash points
    if held is not None:
        tx.execute(q.DELETE_RESOURCE_CLAIM, {"uid": uid})
    tx.execute(q.UPDATE_RESOURCE_CLAIM_GENERATION, {"uid": uid, "claim_generation": generation})
    tx.execute(
        q.INSERT_RESOURCE_CLAIM,
        {
            "uid": uid,
            "owner_type": owner_type,
            "owner_id": owner_id,
            "token_hash": claim.token_hash,
            "generation": generation,
            "reconcile_id": claim.reconcile_id,
            "resource_version": resource.resource_version,
            "hints": 0 if queue is None else queue.hints,
            "now": tx.now,
            "expires_at": tx.now + ttl_ms,
        },
    )
    return ClaimedReconcile(claim, resource, 0 if queue is None else queue.retries)


def _check(tx: Tx, claim: ResourceClaim, *, require_live: bool = True) -> _ClaimRow:
    """The stored claim if `claim` is it, in the order of run claims' checks."""
    row = tx.fetch_one(q.SELECT_RESOURCE_CLAIM, {"uid": claim.uid}, _ClaimRow)
    reason: ClaimLostReason | None = None
    if row is None:
        reason = ClaimLostReason.MISSING_AUTHORITY
    elif row.generation != claim.generation:
        reason = ClaimLostReason.GENERATION_CHANGED
    elif row.owner_type != claim.owner_type or row.owner_id != claim.owner_id:
        reason = ClaimLostReason.OWNER_CHANGED
    elif row.token_hash != claim.token_hash:
        reason = ClaimLostReason.TOKEN_CHANGED
    elif require_live and row.expires_at <= tx.now:
        reason = ClaimLostReason.EXPIRED
    if reason is not None:
        raise ClaimLostError(claim.uid, claim.generation, reason)
    assert row is not None
    return row


def check_resource_claim(tx: Tx, claim: ResourceClaim, *, require_live: bool = True) -> None:
    """Verify that `claim` is the resource's current (live) claim, changing nothing.

    Raises:
        ClaimLostError: with the first failing check, in the order of run claims:
            `missingAuthority`, `generationChanged`, `ownerChanged`, `tokenChanged`,
            `expired`.
    """
    _check(tx, claim, require_live=require_live)


def renew_resource_claim(tx: Tx, claim: ResourceClaim) -> int:
    """Extend the exact live claim; returns its new expiry.

    Raises:
        ClaimLostError: it is not the live claim (an expired claim cannot renew itself).
    """
    expires_at = tx.fetch_value(
        q.RENEW_RESOURCE_CLAIM,
        {
            "uid": claim.uid,
            "generation": claim.generation,
            "owner_type": claim.owner_type,
            "owner_id": claim.owner_id,
            "token_hash": claim.token_hash,
            "now": tx.now,
            "expires_at": tx.now + claim.ttl_ms,
        },
    )
    if expires_at is None:
        _check(tx, claim)
        raise AssertionError("the renewal matched no claim, yet every check passes")
    return int(expires_at)


def release_resource_claim(tx: Tx, claim: ResourceClaim) -> None:
    """Give the claim up without a result (a refused commit, a stopped runner): the
    queue row stays, so the key is due again. Needs the exact claim, not a live one.

    Raises:
        ClaimLostError: another claim holds the resource, or none.
    """
    _check(tx, claim, require_live=False)
    tx.execute(q.DELETE_RESOURCE_CLAIM, {"uid": claim.uid})


def has_expired_resource_claims(reader: Reader, now: int, *, every: bool = False) -> bool:
    """True when `recover_resource_claims` would return a key (read first, so a server
    with nothing to recover opens no write transaction)."""
    params = {"now": now, "every": 1 if every else 0}
    return bool(reader.fetch_value(q.ANY_EXPIRED_RESOURCE_CLAIM, params))


def recover_resource_claims(tx: Tx, *, every: bool = False) -> list[str]:
    """Return every key whose claim expired to the queue, due now (the scheduler's
    sweep); with `every`, all claims (recovery step 7 at startup: the processes of an
    earlier server are gone, so none of its passes can still commit). Deletes those
    claims; returns their uids."""
    params = {"now": tx.now, "every": 1 if every else 0}
    expired = [r.uid for r in tx.fetch_all(q.SELECT_EXPIRED_RESOURCE_CLAIMS, params, _Uid)]
    for uid in expired:
        tx.execute(q.DELETE_RESOURCE_CLAIM, {"uid": uid})
        enqueue_resource(tx, uid, reason="claimExpired")
    return expired


# --- the pass commit ------------------------------------------------------------------------


def _check_result(result: PassResult) -> None:
    if result.outcome not in _OUTCOMES:
        raise ResourceLimitError(f"unknown pass outcome {result.outcome!r}")
    if result.outcome == "requeueAfter" and (
        result.requeue_after_ms is None or result.requeue_after_ms < 0
    ):
        raise ResourceLimitError("requeueAfter needs a delay of zero or more milliseconds")
    if result.outcome == "error" and (
        result.status is not None or result.conditions is not None or result.finalizers is not None
    ):
        raise ResourceLimitError("a failed pass writes no status, conditions or finalizers")
    for text in (result.requeue_reason, result.error_class):
        if text is not None and len(text) > 200:
            raise ResourceLimitError("a requeue reason or error class is at most 200 characters")


def commit_reconcile(
    tx: Tx, claim: ResourceClaim, result: PassResult, *, jitter: float
) -> ReconcileCommit:
    """Commit one pass's result, checked against its claim and the version it read.

    In the caller's transaction, all checks before the first change: the exact live
    claim (`ClaimLostError`), then the compare-and-swap on the resource version
    (`ResourceVersionConflictError`: a new spec or a deletion request arrived during the
    pass), then the result's shape (`ResourceLimitError`). Then:

    - status, conditions (stamped with the pass's generation) and finalizers are written
      when they change, with a new version and a `reconcile.committed` event;
      `observed_generation` becomes the pass's generation when it writes status or
      conditions, so conditions of an older generation never land on a newer spec;
    - a resource whose deletion was requested and that holds no finalizer is removed;
    - delivery: `settled` removes the queue row (it stays due now if a wake-up arrived
      during the pass); `requeue` is due now and `requeueAfter` later (both reset the
      retry counter); `error` raises the counter and waits `reconcile_backoff_ms`;
    - the claim is released and the pass joins the bounded history.

    `jitter` in [0, 1) scales the backoff's upper half (the caller draws it).
    """
    held = _check(tx, claim)
    current = _require(tx, claim.uid)
    if current.resource_version != claim.resource_version:
        raise ResourceVersionConflictError(
            claim.uid, claim.resource_version, current.resource_version
        )
    _check_result(result)
    if not 0.0 <= jitter < 1.0:
        raise ValueError("jitter must be in [0, 1)")
    tx.lifecycle.append("reconcile_commit")  # its COMMIT passes the pass's crash points
    now, uid = tx.now, claim.uid
    generation = current.generation
    status_text = None if result.status is None else _json_text(result.status, "status")
    conditions = (
        None
        if result.conditions is None
        else _stamp_conditions(result.conditions, current.conditions, generation, now)
    )
    conditions_text = None if conditions is None else _json_text(conditions, "conditions")
    finalizers = (
        current.finalizers if result.finalizers is None else _names(result.finalizers, "finalizers")
    )
    writes_status = status_text is not None or conditions_text is not None
    observed = (
        generation if writes_status or result.outcome == "settled" else current.observed_generation
    )
    new_status = current.status if result.status is None else result.status
    new_conditions = current.conditions if conditions is None else tuple(conditions)
    changed = (
        new_status != current.status
        or new_conditions != current.conditions
        or finalizers != current.finalizers
        or observed != current.observed_generation
    )
    version = current.resource_version
    if changed:
        version += 1
        tx.execute(
            q.UPDATE_RESOURCE_STATUS,
            {
                "uid": uid,
                "status": status_text or _json_text(current.status, "status"),
                "conditions": conditions_text or _json_text(list(current.conditions), "conditions"),
                "observed_generation": observed,
                "finalizers": _json_text(list(finalizers), "finalizers"),
                "resource_version": version,
                "now": now,
            },
        )
        payload = {
            "reconcileId": claim.reconcile_id,
            "outcome": result.outcome,
            "generation": generation,
            "observedGeneration": observed,
        }
        _event(tx, uid, version, "reconcile.committed", payload)
    started_at = held.acquired_at
    duration = result.duration_ms if result.duration_ms is not None else max(0, now - started_at)
    if current.deletion_requested_at is not None and not finalizers:
        _remove(tx, uid)
        return ReconcileCommit(uid, version, removed=True, available_at=None, retries=0)
    available_at, retries = _deliver(tx, held, result, jitter)
    tx.execute(q.DELETE_RESOURCE_CLAIM, {"uid": uid})
    tx.execute(
        q.INSERT_RECONCILE_HISTORY,
        {
            "uid": uid,
            "reconcile_id": claim.reconcile_id,
            "generation": generation,
            "outcome": result.outcome,
            "requeue_reason": result.requeue_reason,
            "error_class": result.error_class,
            "started_at": started_at,
            "duration_ms": max(0, duration),
            "now": now,
        },
    )
    tx.execute(q.TRIM_RECONCILE_HISTORY, {"uid": uid, "keep": HISTORY_KEPT})
    return ReconcileCommit(uid, version, removed=False, available_at=available_at, retries=retries)


def _deliver(tx: Tx, held: _ClaimRow, result: PassResult, jitter: float) -> tuple[int | None, int]:
    """Write the queue row a pass's outcome asks for; returns (available_at, retries)."""
    now, uid = tx.now, held.uid
    queue = get_resource_queue_row(tx, uid)
    woken = queue is not None and queue.hints > held.hints
    retries = 0
    reason = result.requeue_reason or result.outcome
    if result.outcome == "settled":
        if not woken:
            tx.execute(q.DELETE_RESOURCE_QUEUE_ROW, {"uid": uid})
            return None, 0
        available_at, reason = now, queue.reason if queue is not None else "wokenDuringPass"
    elif result.outcome == "requeue":
        available_at = now
    elif result.outcome == "requeueAfter":
        assert result.requeue_after_ms is not None
        available_at = now if woken else now + result.requeue_after_ms
    else:
        retries = (0 if queue is None else queue.retries) + 1
        available_at = now + reconcile_backoff_ms(retries, jitter=jitter)
        reason = result.error_class or "error"
    params = {
        "uid": uid,
        "available_at": available_at,
        "retries": retries,
        "reason": reason,
        "now": now,
    }
    tx.execute(q.UPSERT_RESOURCE_QUEUE_AFTER_RECONCILE, params)
    return available_at, retries


# --- child runs -----------------------------------------------------------------------------


def reserve_child_run(
    tx: Tx,
    claim: ResourceClaim,
    *,
    request_key: str,
    input_fingerprint: str,
    workflow_name: str,
) -> ChildRunReservation:
    """Find or reserve the child run of `request_key` (`ctx.workflows.ensure`).

    Under the pass's live claim (no version check: a reservation is not a resource
    write). The same key and fingerprint returns the run ID reserved before; another
    fingerprint or workflow raises `ChildRunConflictError`; a new key mints a run ID
    and stores it in this transaction, before the scheduler creates the queued run
    under that ID, so recovery finds it and a repeated pass never starts a second one.

    Raises:
        ClaimLostError: the claim is not the live claim.
        ChildRunConflictError: the key was reserved for another input or workflow.
    """
    if not 1 <= len(request_key) <= 512:
        raise ResourceLimitError("a request key has 1 to 512 characters")
    _check(tx, claim)
    params = {"uid": claim.uid, "request_key": request_key}
    existing = tx.fetch_one(q.SELECT_RESOURCE_CHILD_RUN, params, _ChildRow)
    if existing is not None:
        if (
            existing.input_fingerprint != input_fingerprint
            or existing.workflow_name != workflow_name
        ):
            raise ChildRunConflictError(claim.uid, request_key)
        return ChildRunReservation(existing.run_id, created=False)
    run_id = f"run-{uuid.uuid4().hex}"
    tx.execute(
        q.INSERT_RESOURCE_CHILD_RUN,
        {
            **params,
            "input_fingerprint": input_fingerprint,
            "workflow_name": workflow_name,
            "run_id": run_id,
            "now": tx.now,
        },
    )
    return ChildRunReservation(run_id, created=True)
