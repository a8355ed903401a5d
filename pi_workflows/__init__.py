"""pi-workflows: a durable, crash-correct workflow server for the Pi coding agent.

The package root re-exports the names users need; everything else lives in the
subpackages `wire`, `storage`, `actors`, `supervision`, `server`, `engine` and `cli`.
The server and client names load on first use, so a workflow file that imports the
authoring API (in a runner or resolver child) does not pay for the server's imports.
"""

import importlib
from typing import TYPE_CHECKING, Any

from pi_workflows._version import __version__
from pi_workflows.engine import (
    action,
    agent,
    checkpoint,
    compute,
    define_workflow,
    include_workflow,
    notify,
    shell,
)
from pi_workflows.errors import PiWorkflowsError

if TYPE_CHECKING:
    from pi_workflows.server import WorkflowServer
    from pi_workflows.wire.client import (
        HostUnavailableError,
        InvalidRequestError,
        PackageMismatchError,
        RequestFailedError,
        WorkflowClient,
    )

_LAZY = {
    "WorkflowServer": "pi_workflows.server",
    "HostUnavailableError": "pi_workflows.wire.client",
    "InvalidRequestError": "pi_workflows.wire.client",
    "PackageMismatchError": "pi_workflows.wire.client",
    "RequestFailedError": "pi_workflows.wire.client",
    "WorkflowClient": "pi_workflows.wire.client",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pi_workflows' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "HostUnavailableError",
    "InvalidRequestError",
    "PackageMismatchError",
    "PiWorkflowsError",
    "RequestFailedError",
    "WorkflowClient",
    "WorkflowServer",
    "__version__",
    "action",
    "agent",
    "checkpoint",
    "compute",
    "define_workflow",
    "include_workflow",
    "notify",
    "shell",
]
