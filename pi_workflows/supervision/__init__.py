"""Child-process supervision: spawning, start identities, signals, the server lock.

Implements workflow-server.md § Process supervision and § Server lifecycle.
"""

from pi_workflows.supervision._crash import (
    CRASH_ENV,
    CRASH_ONCE_ENV,
    CRASH_POINTS,
    CrashPoint,
    CrashSpec,
    InvalidCrashSpecError,
    UnknownCrashPointError,
    armed_crash,
    configure_crash,
    crash_point,
    parse_crash_spec,
)
from pi_workflows.supervision._process import (
    ChildProcess,
    ProcessIdentity,
    exited_unreaped,
    identity_of,
    is_alive,
    signal_group,
    signal_own_child,
    signal_popen_group,
    spawn_child,
    wait_for_exits,
)
from pi_workflows.supervision._server_lock import ServerAlreadyRunningError, ServerLock

__all__ = [
    "CRASH_ENV",
    "CRASH_ONCE_ENV",
    "CRASH_POINTS",
    "ChildProcess",
    "CrashPoint",
    "CrashSpec",
    "InvalidCrashSpecError",
    "ProcessIdentity",
    "ServerAlreadyRunningError",
    "ServerLock",
    "UnknownCrashPointError",
    "armed_crash",
    "configure_crash",
    "crash_point",
    "exited_unreaped",
    "identity_of",
    "is_alive",
    "parse_crash_spec",
    "signal_group",
    "signal_own_child",
    "signal_popen_group",
    "spawn_child",
    "wait_for_exits",
]
