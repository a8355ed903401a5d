"""Errors the workflow engine raises, all under `pi_workflows.errors.PiWorkflowsError`.

Implements workflow-server.md § Failure classification for the engine side: each
error carries the `code` a source resolver reports and the `failure_class` a runner
reports, so no failure is ever reported as another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pi_workflows.errors import PiWorkflowsError

if TYPE_CHECKING:
    from pi_workflows.wire.schema_errors import Violation

__all__ = [
    "EffectKeyConflictError",
    "EffectRejectedError",
    "InitialStatusError",
    "InputInvalidError",
    "ManagerSourceChangedError",
    "ReconcileResultError",
    "RequestKeyConflictError",
    "ResourceManagerDefinitionError",
    "ResourceManagerError",
    "ResourceManagerLoadError",
    "ResourceManagerNotFoundError",
    "ResourceRunnerRequiredError",
    "RoutingError",
    "SourceChangedError",
    "SpecInvalidError",
    "WorkflowDefinitionError",
    "WorkflowEngineError",
    "WorkflowLoadError",
    "WorkflowNotFoundError",
]


class WorkflowEngineError(PiWorkflowsError):
    """Base class of every error the workflow engine raises on purpose."""

    code: str = "engineError"
    """Stable camelCase code reported to the server (resolver `code`)."""


class WorkflowDefinitionError(WorkflowEngineError, ValueError):
    """A workflow definition breaks a rule; raised when the workflow is defined or compiled.

    The message names the workflow, the node (or mount, exit, edge) and the fix.
    """

    code = "definitionInvalid"

    def __init__(
        self, message: str, *, workflow: str | None = None, node: str | None = None
    ) -> None:
        self.workflow = workflow
        self.node = node
        where = []
        if workflow is not None:
            where.append(f"workflow {workflow!r}")
        if node is not None:
            where.append(f"node {node!r}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)


class WorkflowLoadError(WorkflowEngineError):
    """A workflow file could not be loaded: it raised on import or has no `workflow`."""

    code = "definitionInvalid"

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


class WorkflowNotFoundError(WorkflowEngineError, LookupError):
    """No workflow with this command name was discovered."""

    code = "workflowNotFound"

    def __init__(self, name: str, available: list[str]) -> None:
        self.name = name
        self.available = available
        shown = ", ".join(available[:50]) + (", …" if len(available) > 50 else "")
        super().__init__(
            f"no workflow named {name!r}; available: {shown or '(none)'}. Add "
            f"'{name}.workflow.py' to <project>/.pi/workflows/ or <agent dir>/workflows/."
        )


class InputInvalidError(WorkflowEngineError, ValueError):
    """A run input (or an include's mapped input) failed the JSON Schema or `input` callable.

    Its message is shown to the client and stored in the command's receipt, so it never
    quotes the input: a schema refusal carries its `violation` (the place and the rule).
    An `input` callable may raise it to refuse with its own message (which must not
    quote the value either); any other exception it raises is reported by type only.
    """

    code = "inputInvalid"

    def __init__(self, message: str, *, violation: Violation | None = None) -> None:
        self.violation = violation
        super().__init__(message)

    @classmethod
    def from_violation(cls, violation: Violation) -> InputInvalidError:
        """The refusal of a schema check: `at /count: must be integer`."""
        return cls(violation.describe("the whole input"), violation=violation)


class SourceChangedError(WorkflowEngineError):
    """A workflow file no longer matches the saved source identity; its code must not run.

    The runner parks the run with `park_reason`; the server never reclaims it by itself.
    """

    code = "sourceChanged"
    failure_class = "sourceChanged"
    park_reason = "workflowSourceChanged"

    def __init__(self, reason: str, *, path: str | None = None, mount: str | None = None) -> None:
        self.reason = reason
        self.path = path
        self.mount = mount
        super().__init__(reason)


class RoutingError(WorkflowEngineError):
    """No route exists for a node's result (an unmatched switch without `default`).

    The run fails with this error (failure class `nodeFailed`).
    """

    code = "routingFailed"
    failure_class = "nodeFailed"

    def __init__(self, node: str, message: str) -> None:
        self.node = node
        super().__init__(f"node {node!r}: {message}")


class EffectKeyConflictError(WorkflowEngineError):
    """An action asked for a second effect of the same type in one node visit.

    The idempotency key is derived from (run, effect type, node path, visit), so two
    such effects would share a key. Use distinct effect types for distinct effects.
    """

    code = "effectKeyConflict"
    failure_class = "nodeFailed"


# ---------------------------------------------------------------------------
# Resource managers. Their messages name the manager, never a path, a spec or a status
# value: they reach the client, the stored receipt and the reconcile history.


class ResourceManagerError(WorkflowEngineError):
    """Base class of every error about a resource manager (its file, spec or pass)."""

    code = "resourceManagerError"


class ResourceManagerDefinitionError(ResourceManagerError, ValueError):
    """`define_resource_manager(...)` was given something that breaks a rule."""

    code = "definitionInvalid"


class ResourceManagerNotFoundError(ResourceManagerError, LookupError):
    """No resource manager with this name was discovered.

    The message lists the names that exist, not the one asked for (the client chose it).
    """

    code = "resourceManagerNotFound"

    def __init__(self, name: str, available: list[str]) -> None:
        self.name = name
        self.available = available
        shown = ", ".join(available[:50]) + (", …" if len(available) > 50 else "")
        super().__init__(
            f"no resource manager has this name; available: {shown or '(none)'}. Add "
            "'<name>.resource_manager.py' to <project>/.pi/resource-managers/ or "
            "<agent dir>/resource-managers/."
        )


class ResourceManagerLoadError(ResourceManagerError):
    """A manager file could not be loaded: unreadable, raised on import, or its
    `resource_manager` attribute is missing, of another type, or has another name."""

    code = "definitionInvalid"


class SpecInvalidError(ResourceManagerError, ValueError):
    """A spec failed the manager's `spec_schema`, or is not plain JSON, or is too big.

    Like `InputInvalidError`, it never quotes the spec: a schema refusal carries its
    `violation` (the place and the rule).
    """

    code = "specInvalid"

    def __init__(self, message: str, *, violation: Violation | None = None) -> None:
        self.violation = violation
        super().__init__(message)


class InitialStatusError(ResourceManagerError, ValueError):
    """`initial_status(spec)` raised, or returned something that is not plain JSON or
    is larger than the status limit."""

    code = "initialStatusInvalid"


class ManagerSourceChangedError(ResourceManagerError):
    """The manager file no longer follows discovery, or its bytes no longer have the
    digest the resolver reported: the proposal must not be committed."""

    code = "sourceChanged"
    failure_class = "sourceChanged"


class ReconcileResultError(ResourceManagerError, ValueError):
    """A pass broke a rule of the reconcile context: a second outcome, a bad condition,
    a status that is not plain JSON, a `requeue_after` out of bounds, a bad finalizer,
    or a return value that is not an outcome of its own context."""

    code = "reconcileInvalid"


class ResourceRunnerRequiredError(ResourceManagerError, RuntimeError):
    """`ctx.workflows.ensure` or `ctx.effects.ensure` was called on a context that no
    resource runner serves (a test, a REPL): those services need the server."""

    code = "resourceRunnerRequired"


class RequestKeyConflictError(ResourceManagerError, ValueError):
    """A child-run request key or an effect key was reused with another input or request
    (another fingerprint). A changed input needs a new key."""

    code = "requestKeyConflict"


class EffectRejectedError(ResourceManagerError):
    """Raised by a manager effect's `apply` to say the external system refused the
    request for certain (nothing applied): the effect becomes `rejected`, not
    `indeterminate`. Its message is stored; it must not quote private data."""

    code = "effectRejected"
