"""Resource managers' units of work and views: data in, data out, each write in one
transaction of the database actor (workflow-server.md § Resource managers).

The scheduler and the resource runner host call these through `_units.py` records; the
`resource-manager list` and `get` views are built here from storage reads.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from pi_workflows.domain._operations import OperationError, check_resolved_start
from pi_workflows.storage import (
    DEFAULT_CLAIM_TTL_MS,
    RESOURCE_OWNER,
    ChildRunConflictError,
    ChildRunReservation,
    ClaimedReconcile,
    Database,
    DeleteOutcome,
    ExecutionMode,
    NewRun,
    PassResult,
    Reader,
    ReconcileCommit,
    ResourceApplied,
    ResourceClaim,
    ResourceEffect,
    ResourceNotFoundError,
    ResourceQueueRow,
    ResourceRecord,
    ResourceSummary,
    apply_resource,
    claim_next_resource,
    commit_reconcile,
    enqueue_resource,
    enqueue_run,
    get_resource,
    get_resource_by_uid,
    get_resource_queue_row,
    get_run,
    has_expired_resource_claims,
    list_reconcile_history,
    list_resource_child_runs,
    list_resource_effects,
    list_resources,
    recover_resource_claims,
    release_resource_claim,
    request_resource_deletion,
    reserve_child_run,
    reserve_resource_effect,
    retry_resource_effect,
    run_result_payload,
    settle_resource_effect,
)

__all__ = [
    "RECENT_PASSES",
    "ChildRunAnswer",
    "apply_resource_spec",
    "claim_reconcile",
    "commit_reconcile_pass",
    "delete_resource",
    "enqueue_resource_key",
    "ensure_resource_child_run",
    "pass_result_from_proposal",
    "recover_reconcile_claims",
    "release_reconcile_claim",
    "reserve_pass_effect",
    "reserve_resource_child_run",
    "resource_list_view",
    "resource_view",
    "retry_pass_effect",
    "settle_pass_effect",
]

RECENT_PASSES = 20
"""How many passes `resource-manager get` shows (storage keeps more)."""


def _find(reader: Reader, manager: str, project_path: str, key: str) -> ResourceRecord:
    resource = get_resource(reader, manager, project_path, key)
    if resource is None:
        # Names the manager and key the caller gave, never the project path.
        raise ResourceNotFoundError(f"{manager}/{key}")
    return resource


# --- units of work ---------------------------------------------------------------------------


def apply_resource_spec(
    db: Database,
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
    """`apply`, once the resolver child checked the manager and the server checked its
    source: create the resource or give it a new spec (see `apply_resource`)."""
    with db.write() as tx:
        return apply_resource(
            tx,
            manager=manager,
            project_path=project_path,
            key=key,
            spec=spec,
            initial_status=initial_status,
            source_identity=source_identity,
            source_digest=source_digest,
            finalizers=finalizers,
        )


def enqueue_resource_key(
    db: Database, *, manager: str, project_path: str, key: str, reason: str, delay_ms: int = 0
) -> ResourceQueueRow:
    """A wake-up hint (`reconcile`, a child run's completion, a timer) for one key."""
    with db.write() as tx:
        resource = _find(tx, manager, project_path, key)
        return enqueue_resource(tx, resource.uid, reason=reason, delay_ms=delay_ms)


def claim_reconcile(
    db: Database, owner_id: str, ttl_ms: int = DEFAULT_CLAIM_TTL_MS
) -> ClaimedReconcile | None:
    """Claim the next due key for a resource runner (None: nothing is due)."""
    with db.write() as tx:
        return claim_next_resource(tx, owner_id=owner_id, owner_type=RESOURCE_OWNER, ttl_ms=ttl_ms)


_OUTCOMES = frozenset({"settled", "requeue", "requeueAfter"})


def pass_result_from_proposal(
    claim: ResourceClaim, proposal: Mapping[str, Any], duration_ms: int
) -> PassResult:
    """The `PassResult` to commit from a resource runner's `ReconcileResult` wire form.

    Raises:
        ValueError: the proposal is malformed or answers another read of the resource
            (storage checks sizes and condition shapes as it commits).
    """
    outcome = proposal.get("outcome")
    if outcome not in _OUTCOMES:
        raise ValueError("a pass proposes settled, requeue or requeueAfter")
    if proposal.get("resourceVersion") != claim.resource_version:
        raise ValueError("the proposal answers another resource version")
    finalizers = proposal.get("finalizers")
    if finalizers is not None and not (
        isinstance(finalizers, list) and all(isinstance(f, str) for f in finalizers)
    ):
        raise ValueError("finalizers must be a list of names")
    after = proposal.get("requeueAfterMs")
    if outcome == "requeueAfter" and (
        isinstance(after, bool) or not isinstance(after, int) or after < 1
    ):
        raise ValueError("requeueAfter needs a positive requeueAfterMs")
    conditions = proposal.get("conditions") if outcome == "settled" else None
    if conditions is not None and not (
        isinstance(conditions, list) and all(isinstance(c, Mapping) for c in conditions)
    ):
        raise ValueError("conditions must be a list of objects")
    return PassResult(
        outcome=outcome,
        status=proposal.get("status") if outcome == "settled" else None,
        conditions=conditions,
        finalizers=finalizers,
        requeue_after_ms=after if outcome == "requeueAfter" else None,
        duration_ms=duration_ms,
    )


def commit_reconcile_pass(
    db: Database, claim: ResourceClaim, result: PassResult, jitter: float | None = None
) -> ReconcileCommit:
    """Commit the result a resource runner proposed, under its claim and the version it
    read (see `commit_reconcile`). `jitter` None draws the backoff's jitter here."""
    drawn = random.random() if jitter is None else jitter  # noqa: S311 (spreading retries, not a secret)
    with db.write() as tx:
        return commit_reconcile(tx, claim, result, jitter=drawn)


def release_reconcile_claim(db: Database, claim: ResourceClaim) -> None:
    """Give a pass's claim up without a result (its commit was refused, its runner
    stopped): the key stays queued."""
    with db.write() as tx:
        release_resource_claim(tx, claim)


def delete_resource(db: Database, manager: str, project_path: str, key: str) -> DeleteOutcome:
    """`delete`: remove the resource now, or mark it and enqueue its cleanup pass."""
    with db.write() as tx:
        return request_resource_deletion(tx, _find(tx, manager, project_path, key).uid)


def reserve_resource_child_run(
    db: Database,
    claim: ResourceClaim,
    request_key: str,
    input_fingerprint: str,
    workflow_name: str,
) -> ChildRunReservation:
    """`ctx.workflows.ensure`'s durable half: find or reserve the child run's ID."""
    with db.write() as tx:
        return reserve_child_run(
            tx,
            claim,
            request_key=request_key,
            input_fingerprint=input_fingerprint,
            workflow_name=workflow_name,
        )


@dataclass(frozen=True, slots=True)
class ChildRunAnswer:
    """`ctx.workflows.ensure`'s answer to the resource runner: the child run's ID and
    state (`created` when this call queued it), or a refusal (`error_code`)."""

    run_id: str | None
    state: str | None = None
    """The run's stored status (`queued`, `running`, `completed`, `failed`, ...)."""
    output: Any = None
    created: bool = False
    error_code: str | None = None
    """`requestKeyConflict` or the resolver's code (`definitionInvalid`, ...)."""
    error: str | None = None


def _child_state(reader: Reader, run_id: str, created: bool) -> ChildRunAnswer:
    run = get_run(reader, run_id)
    assert run is not None
    output = None
    if run.status == "completed":
        payload = run_result_payload(reader, run_id) or {}
        output = payload.get("output")
    return ChildRunAnswer(run_id, run.status, output, created, error=run.failure_class)


def _queue_child(
    tx: Any, run_id: str, workflow: str, project_path: str, resolved: Mapping[str, Any]
) -> ChildRunAnswer | None:
    """Create the reserved child as a headless queued run, as `run.start` does from the
    resolver's answer; a refusal (None: queued) rolls the reservation back with it."""
    try:
        check_resolved_start(tx, resolved)  # the refusals of a headless `run.start`
    except OperationError as exc:
        return ChildRunAnswer(None, error_code=exc.code, error=str(exc))
    enqueue_run(
        tx,
        NewRun(
            run_id=run_id,
            workflow_name=workflow,
            project_path=project_path,
            source_identity=resolved["sourceIdentity"],
            definition_digest=resolved["definitionDigest"],
            input_hash=resolved["inputHash"],
            input=resolved["input"],
            title=resolved.get("title"),
            execution_mode=ExecutionMode.HEADLESS,
        ),
    )
    return None


class _RefusedError(Exception):
    """Rolls the reservation's transaction back with the refusal as its answer."""

    def __init__(self, answer: ChildRunAnswer) -> None:
        super().__init__(answer.error_code)
        self.answer = answer


_CONFLICT = ChildRunAnswer(
    None,
    error_code="requestKeyConflict",
    error="the request key was used with another workflow or input",
)


def _ensure_child(
    tx: Any, claim: ResourceClaim, key: str, fingerprint: str, *, workflow: str, resolved: Any
) -> ChildRunAnswer:
    try:
        reserved = reserve_child_run(
            tx, claim, request_key=key, input_fingerprint=fingerprint, workflow_name=workflow
        )
    except ChildRunConflictError:
        raise _RefusedError(_CONFLICT) from None
    if get_run(tx, reserved.run_id) is not None:
        return _child_state(tx, reserved.run_id, created=False)
    resource = get_resource_by_uid(tx, claim.uid)
    assert resource is not None  # the live claim holds it
    refused = _queue_child(tx, reserved.run_id, workflow, resource.project_path, resolved)
    if refused is not None:
        raise _RefusedError(refused)
    return _child_state(tx, reserved.run_id, created=True)


def ensure_resource_child_run(
    db: Database,
    claim: ResourceClaim,
    *,
    request_key: str,
    input_fingerprint: str,
    workflow_name: str,
    resolved: Mapping[str, Any],
) -> ChildRunAnswer:
    """`ctx.workflows.ensure` in one transaction under the pass's claim: find the child
    run of `request_key`, or reserve its run ID and queue the run under that ID (a
    headless run of the resource's project, from the resolver's answer the resource
    runner made). Never two children for one key: the reservation and the queued run
    commit together, and a later pass finds the same ID. A refusal (a key reused with
    another input, a workflow that does not resolve) commits nothing.

    Raises:
        ClaimLostError: the claim is not the live claim.
    """
    try:
        with db.write() as tx:
            return _ensure_child(
                tx, claim, request_key, input_fingerprint, workflow=workflow_name, resolved=resolved
            )
    except _RefusedError as refused:
        return refused.answer


def reserve_pass_effect(
    db: Database, claim: ResourceClaim, key: str, kind: str, request: Any
) -> ResourceEffect:
    """`ctx.effects.ensure`'s record before `apply` (see `reserve_resource_effect`):
    the answer says apply, observe first, or adopt the stored outcome."""
    with db.write() as tx:
        return reserve_resource_effect(tx, claim, key=key, kind=kind, request=request)


def settle_pass_effect(
    db: Database,
    *,
    claim: ResourceClaim,
    key: str,
    outcome: Literal["applied", "rejected"],
    result: Any = None,
    error: str | None = None,
    observed: bool = False,
) -> ResourceEffect:
    """Record what `apply` (or, with `observed`, `observe`) established."""
    with db.write() as tx:
        return settle_resource_effect(
            tx, claim, key=key, outcome=outcome, result=result, error=error, observed=observed
        )


def retry_pass_effect(db: Database, claim: ResourceClaim, key: str) -> ResourceEffect:
    """`observe` proved the earlier attempt did not apply: open this pass's attempt."""
    with db.write() as tx:
        return retry_resource_effect(tx, claim, key=key)


def recover_reconcile_claims(db: Database, every: bool = False) -> tuple[str, ...]:
    """The scheduler's sweep: expired claims return their keys to the queue; with
    `every` (recovery step 7 at startup), all claims. Returns their uids. With none to
    return it opens no write transaction."""
    with db.read():
        if not has_expired_resource_claims(db, db.clock.now_ms(), every=every):
            return ()
    with db.write() as tx:
        return tuple(recover_resource_claims(tx, every=every))


# --- views -----------------------------------------------------------------------------------


def _queue_wire(available_at: int | None, retries: int | None, reason: str | None) -> Any:
    if available_at is None:
        return None
    return {"availableAt": available_at, "retries": retries or 0, "reason": reason}


def _summary_wire(summary: ResourceSummary, now: int) -> dict[str, Any]:
    reconciling = summary.claim_expires_at is not None and summary.claim_expires_at > now
    return {
        "uid": summary.uid,
        "manager": summary.manager,
        "project": summary.project_path,
        "key": summary.resource_key,
        "resourceVersion": summary.resource_version,
        "generation": summary.generation,
        "observedGeneration": summary.observed_generation,
        "conditions": orjson.loads(summary.conditions),
        "finalizers": orjson.loads(summary.finalizers),
        "deletionRequestedAt": summary.deletion_requested_at,
        "updatedAt": summary.updated_at,
        "queue": _queue_wire(summary.available_at, summary.retries, summary.queue_reason),
        "reconciling": reconciling,
    }


def resource_list_view(
    db: Database, now: int, manager: str | None = None, project_path: str | None = None
) -> dict[str, Any]:
    """`resource-manager list`: `{resources: [...]}` by manager, project and key, each
    with its versions, conditions, delivery state and whether a pass holds it at `now`."""
    summaries = list_resources(db, manager=manager, project_path=project_path)
    return {"resources": [_summary_wire(s, now) for s in summaries]}


def resource_view(
    db: Database, manager: str, project_path: str, key: str, history: int = RECENT_PASSES
) -> dict[str, Any]:
    """`resource-manager get MANAGER KEY`: the resource (spec, status, conditions,
    finalizers), its delivery state, child runs, managed effects and recent passes
    (newest first). Raises `ResourceNotFoundError`."""
    resource = _find(db, manager, project_path, key)
    queue = get_resource_queue_row(db, resource.uid)
    return {
        "resource": {
            "uid": resource.uid,
            "manager": resource.manager,
            "project": resource.project_path,
            "key": resource.key,
            "resourceVersion": resource.resource_version,
            "generation": resource.generation,
            "observedGeneration": resource.observed_generation,
            "spec": resource.spec,
            "status": resource.status,
            "conditions": list(resource.conditions),
            "finalizers": list(resource.finalizers),
            "deletionRequestedAt": resource.deletion_requested_at,
            "sourceDigest": resource.source_digest,
            "createdAt": resource.created_at,
            "updatedAt": resource.updated_at,
        },
        "queue": None
        if queue is None
        else _queue_wire(queue.available_at, queue.retries, queue.reason),
        "childRuns": [
            {
                "requestKey": child.request_key,
                "workflow": child.workflow_name,
                "runId": child.run_id,
                "status": child.run_status or "reserved",
                "reservedAt": child.reserved_at,
            }
            for child in list_resource_child_runs(db, resource.uid)
        ],
        "effects": [
            {
                "effectId": effect.effect_id,
                "kind": effect.effect_type,
                # The manager's key, without the scope the database adds.
                "key": effect.idempotency_key.removeprefix(f"resource:{resource.uid}:"),
                "state": effect.state,
                "updatedAt": effect.updated_at,
            }
            for effect in list_resource_effects(db, resource.uid)
        ],
        "recentPasses": [
            {
                "reconcileId": record.reconcile_id,
                "generation": record.generation,
                "outcome": record.outcome,
                "requeueReason": record.requeue_reason,
                "errorClass": record.error_class,
                "startedAt": record.started_at,
                "durationMs": record.duration_ms,
            }
            for record in list_reconcile_history(db, resource.uid, limit=history)
        ],
    }
