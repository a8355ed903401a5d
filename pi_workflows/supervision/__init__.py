"""Child-process supervision: spawning, start identities, signals, the server lock.

Implements workflow-server.md § Process supervision and § Server lifecycle.
"""

from pi_workflows.supervision._process import (
    ChildProcess,
    ProcessIdentity,
    exited_unreaped,
    identity_of,
    is_alive,
    signal_group,
    signal_own_child,
    spawn_child,
)
from pi_workflows.supervision._server_lock import ServerAlreadyRunningError, ServerLock

__all__ = [
    "ChildProcess",
    "ProcessIdentity",
    "ServerAlreadyRunningError",
    "ServerLock",
    "exited_unreaped",
    "identity_of",
    "is_alive",
    "signal_group",
    "signal_own_child",
    "spawn_child",
]
