"""The server process: composition of actors, socket and lifecycle; client operations.

Implements workflow-server.md § Process model, § Server lifecycle and § Live client
protocol (operation handling).
"""

from pi_workflows.server._server import (
    DEFAULT_IDLE_EXIT_S,
    DEFAULT_MAX_WORKERS,
    IDLE_EXIT_ENV,
    MAX_WORKERS_ENV,
    ServerStartError,
    WorkflowServer,
)

__all__ = [
    "DEFAULT_IDLE_EXIT_S",
    "DEFAULT_MAX_WORKERS",
    "IDLE_EXIT_ENV",
    "MAX_WORKERS_ENV",
    "ServerStartError",
    "WorkflowServer",
]
