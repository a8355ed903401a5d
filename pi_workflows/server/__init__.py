"""The server process: the composition root, the client router and the server's logs.

Implements workflow-server.md § Process model and § Server lifecycle: `WorkflowServer`
starts and stops the actors (`pi_workflows.actors`), which run the units of work of
`pi_workflows.domain`; the router hands each client request to the actor that owns it.
"""

from pi_workflows.server._logging import redirect_output
from pi_workflows.server._router import DEFAULT_DRAIN_S
from pi_workflows.server._server import (
    BLOB_GRACE_ENV,
    DEFAULT_IDLE_EXIT_S,
    DEFAULT_MAX_WORKERS,
    IDLE_EXIT_ENV,
    MAX_WORKERS_ENV,
    ZYGOTE_ENV,
    ServerStartError,
    WorkflowServer,
)

__all__ = [
    "BLOB_GRACE_ENV",
    "DEFAULT_DRAIN_S",
    "DEFAULT_IDLE_EXIT_S",
    "DEFAULT_MAX_WORKERS",
    "IDLE_EXIT_ENV",
    "MAX_WORKERS_ENV",
    "ZYGOTE_ENV",
    "ServerStartError",
    "WorkflowServer",
    "redirect_output",
]
