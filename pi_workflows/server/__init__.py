"""The server process: composition of actors, socket and lifecycle; client operations.

Implements workflow-server.md § Process model, § Server lifecycle and § Live client
protocol (operation handling). The composition root is imported on first use: the
actors import this package's units of database work, and the root imports the actors.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("pi_workflows.server._server"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
