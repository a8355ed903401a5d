"""Child-process supervision: spawning, start identities, signals, the server lock.

Implements workflow-server.md § Process supervision and § Server lifecycle.
"""

from pi_workflows.supervision._crash import (
    CRASH_ENV,
    CRASH_ONCE_ENV,
    CRASH_POINTS,
    RUNNER_MESSAGE_POINTS,
    RUNNER_SENT_KINDS,
    CrashPoint,
    CrashSpec,
    InvalidCrashSpecError,
    UnknownCrashPointError,
    armed_crash,
    configure_crash,
    crash_point,
    parse_crash_spec,
)
from pi_workflows.supervision._log_drain import LogDrain
from pi_workflows.supervision._pi_group import (
    Descendant,
    end_descendants,
    snapshot_descendants,
    terminate_then_kill,
)
from pi_workflows.supervision._pi_keeper import keeper_argv
from pi_workflows.supervision._process import (
    ChildProcess,
    ProcessIdentity,
    exited_unreaped,
    identity_of,
    is_alive,
    open_pidfd,
    set_process_name,
    signal_group,
    signal_own_child,
    signal_popen_group,
    spawn_child,
    wait_for_exits,
)
from pi_workflows.supervision._server_lock import ServerAlreadyRunningError, ServerLock
from pi_workflows.supervision._subreaper import (
    DescendantCap,
    become_subreaper,
    descendants,
    kill_descendants,
    stop_descendants,
)
from pi_workflows.supervision._zygote_client import Zygote, ZygoteUnavailable

__all__ = [
    "CRASH_ENV",
    "CRASH_ONCE_ENV",
    "CRASH_POINTS",
    "RUNNER_MESSAGE_POINTS",
    "RUNNER_SENT_KINDS",
    "ChildProcess",
    "CrashPoint",
    "CrashSpec",
    "Descendant",
    "DescendantCap",
    "InvalidCrashSpecError",
    "LogDrain",
    "ProcessIdentity",
    "ServerAlreadyRunningError",
    "ServerLock",
    "UnknownCrashPointError",
    "Zygote",
    "ZygoteUnavailable",
    "armed_crash",
    "become_subreaper",
    "configure_crash",
    "crash_point",
    "descendants",
    "end_descendants",
    "exited_unreaped",
    "identity_of",
    "is_alive",
    "keeper_argv",
    "kill_descendants",
    "open_pidfd",
    "parse_crash_spec",
    "set_process_name",
    "signal_group",
    "signal_own_child",
    "signal_popen_group",
    "snapshot_descendants",
    "spawn_child",
    "stop_descendants",
    "terminate_then_kill",
    "wait_for_exits",
]
