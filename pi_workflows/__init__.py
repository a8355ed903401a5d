"""pi-workflows: a durable, crash-correct workflow server for the Pi coding agent.

The package root re-exports the names users need; everything else lives in the
subpackages `wire`, `storage`, `actors`, `supervision`, `server` and `cli`.
"""

from pi_workflows._version import __version__
from pi_workflows.engine import (
    action,
    checkpoint,
    compute,
    define_workflow,
    include_workflow,
    notify,
    shell,
)
from pi_workflows.errors import PiWorkflowsError
from pi_workflows.server import WorkflowServer
from pi_workflows.wire.client import (
    HostUnavailableError,
    PackageMismatchError,
    RequestFailedError,
    WorkflowClient,
)

__all__ = [
    "HostUnavailableError",
    "PackageMismatchError",
    "PiWorkflowsError",
    "RequestFailedError",
    "WorkflowClient",
    "WorkflowServer",
    "__version__",
    "action",
    "checkpoint",
    "compute",
    "define_workflow",
    "include_workflow",
    "notify",
    "shell",
]
