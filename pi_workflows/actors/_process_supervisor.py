"""The process-supervisor actor: owns every child process group of the server.

Implements workflow-server.md § Process supervision: children start in their own
group and are known by PID and start time; stopping is SIGTERM to the group, a
grace period counted in ticks, then SIGKILL, and the child is always reaped. The
actor never waits on a child: `Popen.poll` on each tick does the reaping.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pi_workflows.actors._base import ActorFailureHandler, Reply, ServerActor
from pi_workflows.actors._ticker import Tick
from pi_workflows.supervision import (
    ChildProcess,
    ProcessIdentity,
    exited_unreaped,
    signal_own_child,
    spawn_child,
)

__all__ = ["ChildExited", "ProcessSupervisorActor", "Spawn", "StopChild"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChildExited:
    """A supervised child was reaped."""

    identity: ProcessIdentity
    returncode: int
    """Exit code, or minus the signal number that ended it."""
    killed: bool
    """True when the supervisor had to escalate to SIGKILL."""


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start a child in its own process group."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(repr=False)
    """The child's whole environment (may hold credentials: never logged)."""
    reply: Callable[[Reply], None]
    """Receives the child's `ProcessIdentity`, or the spawn error."""
    on_exit: Callable[[ChildExited], None] | None = None
    """Called on the actor thread once the child is reaped; must not block."""
    cwd: Path | None = None
    log_path: Path | None = None
    pass_fds: tuple[int, ...] = ()
    """File descriptors the child inherits; closed in the server once it is spawned."""


@dataclass(frozen=True, slots=True)
class StopChild:
    """Stop a child's process group: SIGTERM, then SIGKILL after `grace_ticks` ticks."""

    identity: ProcessIdentity
    grace_ticks: int = 20


@dataclass
class _Supervised:
    child: ChildProcess
    on_exit: Callable[[ChildExited], None] | None
    kill_at_tick: int | None = None
    killed: bool = False


class ProcessSupervisorActor(ServerActor):
    """Owns: the registry of child processes (by exact identity) and their groups.

    Receives: `Spawn`, `StopChild`, `Tick`.
    Sends: replies and `ChildExited` callbacks.
    Invariants: every child it started is reaped; only an exact identity is signalled.
    On failure: reported to the server, whose shutdown stops every known group.
    """

    name = "process-supervisor"

    def __init__(self, on_actor_failure: ActorFailureHandler) -> None:
        super().__init__(on_actor_failure)
        self._children: dict[ProcessIdentity, _Supervised] = {}
        self._tick = 0

    def on_receive(self, message: Any) -> Any:
        match message:
            case Spawn(
                argv=argv,
                env=env,
                reply=reply,
                on_exit=on_exit,
                cwd=cwd,
                log_path=path,
                pass_fds=fds,
            ):
                try:
                    child = spawn_child(argv, env=env, cwd=cwd, log_path=path, pass_fds=fds)
                except OSError as exc:
                    reply(Reply(error=exc))
                    return None
                self._children[child.identity] = _Supervised(child, on_exit)
                reply(Reply(child.identity))
            case StopChild(identity=identity, grace_ticks=grace):
                self._stop_child(identity, grace)
            case Tick():
                self._tick += 1
                self._reap_and_escalate()
            case _:
                raise TypeError(f"process supervisor got {type(message).__name__}")
        return None

    def on_stop(self) -> None:
        """Runs in the actor's thread at shutdown: no child outlives the server."""
        for supervised in self._children.values():
            signal_own_child(supervised.child, signal.SIGKILL)
            supervised.child.popen.wait(5)

    @property
    def child_count(self) -> int:
        """Children started and not yet reaped."""
        return len(self._children)

    def _stop_child(self, identity: ProcessIdentity, grace_ticks: int) -> None:
        supervised = self._children.get(identity)
        if supervised is None:
            return
        signal_own_child(supervised.child, signal.SIGTERM)
        if supervised.kill_at_tick is None:
            supervised.kill_at_tick = self._tick + max(1, grace_ticks)

    def _reap_and_escalate(self) -> None:
        for identity, supervised in list(self._children.items()):
            if exited_unreaped(supervised.child):
                # Stop stray members of the group while the zombie leader still
                # reserves its ID, then reap.
                signal_own_child(supervised.child, signal.SIGKILL)
                returncode = supervised.child.popen.wait(5)
                del self._children[identity]
                exited = ChildExited(identity, returncode, supervised.killed)
                if supervised.on_exit is not None:
                    supervised.on_exit(exited)
                continue
            if supervised.kill_at_tick is not None and self._tick >= supervised.kill_at_tick:
                supervised.killed = True
                signal_own_child(supervised.child, signal.SIGKILL)
