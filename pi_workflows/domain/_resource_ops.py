"""Resource managers' client operations: `resourceManager.apply|list|get|reconcile|delete`.

Each command looks up its receipt, applies its change (storage functions that take `tx`)
and records its receipt in one transaction (`run_command`). `apply` commits only what
the source resolver child proposed, after the server re-checked the manager's source
(`verify_manager_source`, which runs no code). Errors name the rule, never a path or
a payload value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pi_workflows.domain._operations import (
    OperationContext,
    OperationError,
    rejected,
    response,
    run_command,
)
from pi_workflows.domain._resource_work import RECENT_PASSES, resource_list_view, resource_view
from pi_workflows.engine import (
    MANAGER_NAME_PATTERN,
    MAX_SPEC_BYTES,
    ApplyProposal,
    ManagerSourceChangedError,
    verify_manager_source,
)
from pi_workflows.storage import (
    CommandRequest,
    Database,
    ResourceDeletingError,
    ResourceLimitError,
    ResourceNotFoundError,
    Tx,
    apply_resource,
    enqueue_resource,
    get_resource,
    request_resource_deletion,
)
from pi_workflows.wire.canonical import CanonicalJSONError, dumps
from pi_workflows.wire.protocol import RequestMessage

__all__ = [
    "RESOURCE_MANAGER_COMMANDS",
    "RESOURCE_MANAGER_READS",
    "ResourceRef",
    "apply_resource_manager",
    "apply_spec",
    "resource_manager_command",
    "resource_manager_read",
    "resource_ref",
]

RESOURCE_MANAGER_READS = frozenset({"resourceManager.list", "resourceManager.get"})
"""Answered on the reader actor (one read transaction, no receipt)."""
RESOURCE_MANAGER_COMMANDS = frozenset({"resourceManager.reconcile", "resourceManager.delete"})
"""Commands on the database actor (`resourceManager.apply` resolves first)."""

MAX_KEY_CHARS = 256
_NAME = re.compile(MANAGER_NAME_PATTERN)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class ResourceRef:
    """The resource a request names: `(manager, project, key)`, parsed once."""

    manager: str
    key: str
    discovery_project: str | None
    """`payload.projectPath` as sent: the project whose `.pi/resource-managers/` is
    searched first (None: only the agent directory)."""
    project_path: str
    """The project the resource belongs to (the agent directory when none was given,
    as for a run started without a project)."""


def _manager(payload: Mapping[str, Any]) -> str:
    manager = payload.get("manager")
    if not isinstance(manager, str) or not _NAME.match(manager):
        raise OperationError(
            "rejected",
            "managerInvalid",
            "payload.manager must be a resource manager name: a letter or digit, then up "
            "to 127 letters, digits, '-' or '_'",
        )
    return manager


def _key(payload: Mapping[str, Any]) -> str:
    key = payload.get("key")
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS or _CONTROL.search(key):
        raise OperationError(
            "rejected",
            "keyInvalid",
            f"payload.key must be a string of 1 to {MAX_KEY_CHARS} printable characters",
        )
    return key


def _project(payload: Mapping[str, Any]) -> str | None:
    project = payload.get("projectPath")
    if project is None:
        return None
    if not isinstance(project, str) or not Path(project).is_absolute() or _CONTROL.search(project):
        raise OperationError(
            "rejected", "projectPathInvalid", "payload.projectPath must be an absolute path"
        )
    return project


def resource_ref(request: RequestMessage, ctx: OperationContext) -> ResourceRef:
    """The manager, key and project of a get, apply, reconcile or delete request.

    Raises:
        OperationError: a malformed manager name, key or project path (`rejected`).
    """
    payload = request["payload"]
    project = _project(payload)
    return ResourceRef(
        manager=_manager(payload),
        key=_key(payload),
        discovery_project=project,
        project_path=project or str(ctx.agent_dir),
    )


def apply_spec(request: RequestMessage) -> Any:
    """`payload.spec`, checked for size before any child is started.

    Raises:
        OperationError: no spec, a spec that is not plain JSON, or one over 1 MiB.
    """
    payload = request["payload"]
    if "spec" not in payload:
        raise OperationError("rejected", "specRequired", "payload.spec holds the resource's spec")
    try:
        size = len(dumps(payload["spec"]))
    except CanonicalJSONError as exc:
        raise OperationError(
            "rejected", "specInvalid", f"the spec is not plain JSON: {exc}"
        ) from None
    if size > MAX_SPEC_BYTES:
        raise OperationError(
            "rejected",
            "specTooLarge",
            f"the spec is {size} bytes of JSON; a spec is at most {MAX_SPEC_BYTES} bytes",
        )
    return payload["spec"]


def _not_found() -> OperationError:
    # Never echoes the manager or key: the caller knows what it asked for.
    return OperationError(
        "notFound", "resourceNotFound", "no resource has this manager and key in this project"
    )


def _answer_errors(request: RequestMessage, exc: Exception) -> dict[str, Any]:
    if isinstance(exc, OperationError):
        return rejected(request, exc.outcome, exc.code, str(exc))
    if isinstance(exc, ResourceNotFoundError):
        error = _not_found()
        return rejected(request, error.outcome, error.code, str(error))
    raise exc


# --- reads ---------------------------------------------------------------------------


def resource_manager_read(
    db: Database, request: RequestMessage, ctx: OperationContext
) -> dict[str, Any]:
    """`resourceManager.list` (`payload: {manager?, projectPath?}`): `{resources: [...]}`;
    `resourceManager.get` (`payload: {manager, key, projectPath?}`): the resource with
    its queue row, child runs, effects and recent passes (`resource_view`)."""
    try:
        if request["operation"] == "resourceManager.list":
            payload = request["payload"]
            manager = _manager(payload) if payload.get("manager") is not None else None
            project = _project(payload)
            view = resource_list_view(db, db.clock.now_ms(), manager, project)
            return response(request, "accepted", receipt=view)
        ref = resource_ref(request, ctx)
        view = resource_view(db, ref.manager, ref.project_path, ref.key, RECENT_PASSES)
        return response(request, "accepted", receipt=view)
    except (OperationError, ResourceNotFoundError) as exc:
        return _answer_errors(request, exc)


# --- commands ------------------------------------------------------------------------


def _receipt_base(ref: ResourceRef, uid: str) -> dict[str, Any]:
    return {"uid": uid, "manager": ref.manager, "key": ref.key}


def _reconcile(ref: ResourceRef) -> Any:
    def change(tx: Tx, command: CommandRequest) -> tuple[None, None, dict[str, Any]]:
        resource = get_resource(tx, ref.manager, ref.project_path, ref.key)
        if resource is None:
            raise _not_found()
        row = enqueue_resource(tx, resource.uid, reason="reconcileRequested")
        body = {**_receipt_base(ref, resource.uid), "availableAt": row.available_at}
        return None, None, body

    return change


def _delete(ref: ResourceRef) -> Any:
    def change(tx: Tx, command: CommandRequest) -> tuple[None, None, dict[str, Any]]:
        resource = get_resource(tx, ref.manager, ref.project_path, ref.key)
        if resource is None:
            raise _not_found()
        outcome = request_resource_deletion(tx, resource.uid)
        body = {
            **_receipt_base(ref, resource.uid),
            "removed": outcome.removed,
            "resourceVersion": outcome.resource_version,
            "finalizers": [] if outcome.removed else list(resource.finalizers),
        }
        return None, None, body

    return change


def resource_manager_command(
    db: Database, request: RequestMessage, ctx: OperationContext
) -> dict[str, Any]:
    """`resourceManager.reconcile` (a wake-up hint: the key is due now) and
    `resourceManager.delete` (removed now without finalizers, else marked and its
    cleanup pass queued); `payload: {manager, key, projectPath?}`. Receipt, change and
    receipt record in one transaction; a missing resource is `notFound` (not stored)."""
    try:
        ref = resource_ref(request, ctx)
        if request["operation"] == "resourceManager.reconcile":
            return run_command(db, request, _reconcile(ref))
        return run_command(db, request, _delete(ref))
    except (OperationError, ResourceNotFoundError) as exc:
        return _answer_errors(request, exc)


def apply_resource_manager(
    db: Database,
    request: RequestMessage,
    ctx: OperationContext,
    resolved: Mapping[str, Any],
) -> dict[str, Any]:
    """`resourceManager.apply` after the resolver child answered (`apply_answer`).

    A refusal of the child (no such manager, a manager that does not load, an invalid
    spec or initial status) is stored as the receipt. Otherwise, in the write
    transaction, the server checks that discovery still finds the resolved file and
    its bytes still have the resolved digest (`sourceChanged`, a `conflict` that is not
    stored: apply again), then creates the resource or gives it the new spec. The same
    spec is a no-op (same resource version); a changed spec raises the generation.
    """
    try:
        ref = resource_ref(request, ctx)
        return run_command(db, request, _apply(ref, ctx, resolved))
    except (OperationError, ResourceNotFoundError) as exc:
        return _answer_errors(request, exc)


def _proposal(ref: ResourceRef, resolved: Mapping[str, Any]) -> ApplyProposal:
    if not resolved.get("ok"):
        raise OperationError(
            "rejected",
            str(resolved.get("code") or "definitionInvalid"),
            str(resolved.get("message") or "the resource manager could not be loaded"),
        )
    try:
        proposal = ApplyProposal.from_wire(resolved)
    except ValueError as exc:
        raise OperationError("rejected", "definitionInvalid", str(exc)) from None
    if proposal.manager != ref.manager:
        raise OperationError(
            "rejected", "definitionInvalid", "the resolver answered for another manager"
        )
    return proposal


def _apply(ref: ResourceRef, ctx: OperationContext, resolved: Mapping[str, Any]) -> Any:
    def change(tx: Tx, command: CommandRequest) -> tuple[None, None, dict[str, Any]]:
        proposal = _proposal(ref, resolved)
        project = Path(ref.discovery_project) if ref.discovery_project is not None else None
        try:
            verify_manager_source(
                project, ctx.agent_dir, ref.manager, proposal.path, proposal.source_digest
            )
        except ManagerSourceChangedError as exc:
            raise OperationError("conflict", "sourceChanged", str(exc)) from None
        try:
            applied = apply_resource(
                tx,
                manager=ref.manager,
                project_path=ref.project_path,
                key=ref.key,
                spec=proposal.spec,
                initial_status=proposal.initial_status,
                source_identity={"kind": "file", "manager": ref.manager, "path": proposal.path},
                source_digest=proposal.source_digest,
            )
        except ResourceDeletingError:
            raise OperationError(
                "rejected",
                "resourceDeleting",
                "the resource is being deleted; it accepts no new spec until it is removed",
            ) from None
        except ResourceLimitError as exc:
            raise OperationError("rejected", "specInvalid", str(exc)) from None
        resource = applied.resource
        body = {
            **_receipt_base(ref, resource.uid),
            "resourceVersion": resource.resource_version,
            "generation": resource.generation,
            "created": applied.created,
            "changed": applied.changed,
            "specChanged": applied.spec_changed,
        }
        return None, None, body

    return change
