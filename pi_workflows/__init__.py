"""pi-workflows: a durable, crash-correct workflow server for the Pi coding agent.

The package root re-exports the names users need; everything else lives in the
subpackages `wire`, `storage`, `actors`, `supervision`, `server`, `engine` and `cli`.
Every name but the version and the base error loads on first use: a workflow file that
imports the authoring API (in a runner or resolver child) does not pay for the server's
imports, and the command line (a subpackage, so it runs this file) pays for none of them.
"""

import importlib
from typing import TYPE_CHECKING, Any

from pi_workflows._version import __version__
from pi_workflows.errors import PiWorkflowsError

if TYPE_CHECKING:
    from pi_workflows.engine import (
        action,
        agent,
        assistant_message,
        checkpoint,
        choice,
        compute,
        define_workflow,
        human_decision,
        include_workflow,
        notify,
        shell,
    )
    from pi_workflows.resource_managers import (
        Condition,
        ReconcileContext,
        ReconcileResult,
        Resource,
        ResourceManagerDefinition,
        condition_false,
        condition_true,
        condition_unknown,
        define_resource_manager,
    )
    from pi_workflows.server import WorkflowServer
    from pi_workflows.wire.client import (
        HostUnavailableError,
        InvalidRequestError,
        PackageMismatchError,
        RequestFailedError,
        WorkflowClient,
    )
    from pi_workflows.wire.live import (
        LiveViews,
        RunNotFoundError,
        ViewKey,
        ViewUnavailableError,
        ViewUpdate,
        WatchTimeoutError,
    )
    from pi_workflows.wire.views import (
        ContentRef,
        Display,
        RunListItem,
        RunListPage,
        RunPage,
        RunView,
        SessionView,
        TraceItem,
        Value,
    )

_LAZY = {
    "action": "pi_workflows.engine",
    "agent": "pi_workflows.engine",
    "assistant_message": "pi_workflows.engine",
    "checkpoint": "pi_workflows.engine",
    "choice": "pi_workflows.engine",
    "compute": "pi_workflows.engine",
    "define_workflow": "pi_workflows.engine",
    "human_decision": "pi_workflows.engine",
    "include_workflow": "pi_workflows.engine",
    "notify": "pi_workflows.engine",
    "shell": "pi_workflows.engine",
    "Condition": "pi_workflows.resource_managers",
    "ReconcileContext": "pi_workflows.resource_managers",
    "ReconcileResult": "pi_workflows.resource_managers",
    "Resource": "pi_workflows.resource_managers",
    "ResourceManagerDefinition": "pi_workflows.resource_managers",
    "condition_false": "pi_workflows.resource_managers",
    "condition_true": "pi_workflows.resource_managers",
    "condition_unknown": "pi_workflows.resource_managers",
    "define_resource_manager": "pi_workflows.resource_managers",
    "WorkflowServer": "pi_workflows.server",
    "HostUnavailableError": "pi_workflows.wire.client",
    "InvalidRequestError": "pi_workflows.wire.client",
    "PackageMismatchError": "pi_workflows.wire.client",
    "RequestFailedError": "pi_workflows.wire.client",
    "WorkflowClient": "pi_workflows.wire.client",
    "LiveViews": "pi_workflows.wire.live",
    "RunNotFoundError": "pi_workflows.wire.live",
    "ViewKey": "pi_workflows.wire.live",
    "ViewUnavailableError": "pi_workflows.wire.live",
    "ViewUpdate": "pi_workflows.wire.live",
    "WatchTimeoutError": "pi_workflows.wire.live",
    "ContentRef": "pi_workflows.wire.views",
    "Display": "pi_workflows.wire.views",
    "RunListItem": "pi_workflows.wire.views",
    "RunListPage": "pi_workflows.wire.views",
    "RunPage": "pi_workflows.wire.views",
    "RunView": "pi_workflows.wire.views",
    "SessionView": "pi_workflows.wire.views",
    "TraceItem": "pi_workflows.wire.views",
    "Value": "pi_workflows.wire.views",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pi_workflows' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Condition",
    "ContentRef",
    "Display",
    "HostUnavailableError",
    "InvalidRequestError",
    "LiveViews",
    "PackageMismatchError",
    "PiWorkflowsError",
    "ReconcileContext",
    "ReconcileResult",
    "RequestFailedError",
    "Resource",
    "ResourceManagerDefinition",
    "RunListItem",
    "RunListPage",
    "RunNotFoundError",
    "RunPage",
    "RunView",
    "SessionView",
    "TraceItem",
    "Value",
    "ViewKey",
    "ViewUnavailableError",
    "ViewUpdate",
    "WatchTimeoutError",
    "WorkflowClient",
    "WorkflowServer",
    "__version__",
    "action",
    "agent",
    "assistant_message",
    "checkpoint",
    "choice",
    "compute",
    "condition_false",
    "condition_true",
    "condition_unknown",
    "define_resource_manager",
    "define_workflow",
    "human_decision",
    "include_workflow",
    "notify",
    "shell",
]
