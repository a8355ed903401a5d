"""The process-supervisor actor: owns every child process group of the server.

Implements workflow-server.md § Process supervision: children start in their own
group and are known by PID and start time; stopping is SIGTERM to the group, a
grace period counted in ticks, then SIGKILL, and the child is always reaped. The
actor never waits on a child: a child forked by the zygote is reaped there and its exit
arrives as a message; a cold-started child (no zygote) is polled on each tick.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from dataclasses import dataclass
from typing import Any

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Reply, ServerActor, answer
from pi_workflows.actors._ticker import Tick
from pi_workflows.supervision import (
    ChildExited,
    ChildProcess,
    KillChild,
    LogDrain,
    ProcessIdentity,
    Spawn,
    StopChild,
    StopGroup,
    StopRecorded,
    Zygote,
    ZygoteUnavailable,
    exited_unreaped,
    kill_descendants,
    signal_group,
    signal_own_child,
    spawn_child,
    wait_for_exits,
)

__all__ = ["LOG_CAP_BYTES", "LOG_TAIL_BYTES", "ProcessSupervisorActor"]

LOG_CAP_BYTES = 8 * 1024 * 1024
"""The most a child's output file holds (plus one marker line), however much or however
fast the child prints: its stdout and stderr go through a pipe that `LogDrain` copies
into the file, keeping the first bytes and the last `LOG_TAIL_BYTES`."""
LOG_TAIL_BYTES = 1024 * 1024

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _ZygoteExit:
    """The zygote reaped one of its children (returncode None: the zygote was lost)."""

    spawned: list[ProcessIdentity]
    """Holds the child's identity once `zygote.spawn` returned it. The report may be sent
    before that (a child that exits at once), but it is handled after: this actor is the
    thread inside `spawn` until then."""
    returncode: int | None


@dataclass
class _Supervised:
    identity: ProcessIdentity
    spawn: Spawn
    """The request that started it: where its exit is reported, and with what tag."""
    child: ChildProcess | None
    """The `Popen` handle of a cold-started child; None for a child of the zygote."""
    log_token: int | None = None
    """The child's bounded log in the `LogDrain`, finished once the child is reaped."""
    kill_at_tick: int | None = None
    killed: bool = False


class ProcessSupervisorActor(ServerActor):
    """Owns: the registry of child processes (by exact identity) and their groups.

    Receives: `Spawn`, `StopChild`, `KillChild`, `StopGroup`, `StopRecorded`, `Tick` (and the
        zygote's exit reports).
    Sends: `Done` for each spawn and `StopRecorded`; `ChildExited` to a spawn's `reply_to`.
    Invariants: every child it started is reaped; only an exact identity is signalled;
        it is the one place in the server that signals a process group.
    On failure: reported to the server, whose shutdown stops every known group.
    """

    name = "process-supervisor"

    def __init__(self, on_actor_failure: ActorFailureHandler, zygote: Zygote | None = None) -> None:
        super().__init__(on_actor_failure)
        self._zygote = zygote
        self._children: dict[ProcessIdentity, _Supervised] = {}
        self._tick = 0
        self._logs = LogDrain(LOG_CAP_BYTES, LOG_TAIL_BYTES)

    def on_receive(self, message: Any) -> Any:
        match message:
            case Spawn():
                self._spawn(message)
            case _ZygoteExit(spawned=spawned, returncode=returncode):
                if spawned:  # else the spawn failed after all: the child is nobody's
                    self._zygote_exit(spawned[0], returncode)
            case StopChild(identity=identity, grace_ticks=grace):
                self._stop_child(identity, grace)
            case KillChild(identity=identity):
                supervised = self._children.get(identity)
                if supervised is not None:
                    supervised.killed = True
                    self._kill(supervised)
            case StopGroup(identity=identity):
                self._stop_group(identity)
            case StopRecorded(identities=identities, reply_to=reply_to, timeout_s=timeout_s):
                answer(reply_to, None, Reply(self._stop_recorded(identities, timeout_s)))
            case Tick():
                self._tick += 1
                self._reap_and_escalate()
            case _:
                raise TypeError(f"process supervisor got {type(message).__name__}")
        return None

    def _stop_group(self, identity: ProcessIdentity) -> None:
        """SIGKILL a registered group and every descendant of its leader.

        The group is frozen (SIGSTOP) first, so no member can act on a descendant's
        death in between: a shell whose `sleep` died would go on to its next command (a
        side effect the step's read-back would then find). Descendants that left the
        group (a Pi child's tools run in sessions of their own) are killed while the tree
        still links them to the leader, then the group itself.
        """
        signal_group(identity, signal.SIGSTOP)
        kill_descendants(identity)
        signal_group(identity, signal.SIGKILL)

    def on_stop(self) -> None:
        """Runs in the actor's thread at shutdown: no child outlives the server."""
        for supervised in self._children.values():
            self._kill(supervised)
        for supervised in self._children.values():
            if supervised.child is not None:
                supervised.child.popen.wait(5)
        warm = [s.identity for s in self._children.values() if s.child is None]
        wait_for_exits(warm, timeout_s=5.0)  # the zygote reaps them; their exits are enough
        self._logs.close()  # after the exits: what they wrote last is in the logs

    @property
    def child_count(self) -> int:
        """Children started and not yet reaped."""
        return len(self._children)

    def _spawn(self, spawn: Spawn) -> None:
        token, output_fd = None, None
        try:
            if spawn.log_path is not None:
                token, output_fd = self._logs.open(spawn.log_path)
            identity, child = self._start(spawn, output_fd)
        except OSError as exc:
            if token is not None:
                self._logs.finish(token)
            answer(spawn.reply_to, spawn.tag, Reply(error=exc))
            return
        finally:
            if output_fd is not None:
                os.close(output_fd)  # the child has its own copy of the pipe's write end
        self._children[identity] = _Supervised(identity, spawn, child, token)
        answer(spawn.reply_to, spawn.tag, Reply(identity))

    def _start(
        self, spawn: Spawn, output_fd: int | None
    ) -> tuple[ProcessIdentity, ChildProcess | None]:
        """Fork warm through the zygote when it can, else start a cold interpreter.

        Raises:
            OSError: the cold start failed.
        """
        if self._zygote is not None and spawn.preloaded is not None:
            try:
                identity = self._spawn_warm(spawn, self._zygote, output_fd)
            except ZygoteUnavailable as exc:
                log.info("cold spawn: %s", exc, extra={"action": "zygote.unavailable"})
            else:
                for fd in spawn.pass_fds:
                    os.close(fd)
                return identity, None
        child = spawn_child(
            spawn.argv,
            env=spawn.env,
            cwd=spawn.cwd,
            output_fd=output_fd,
            pass_fds=spawn.pass_fds,
            stdio_fd=spawn.pass_fds[0] if spawn.stdio and spawn.pass_fds else None,
        )
        return child.identity, child

    def _spawn_warm(self, spawn: Spawn, zygote: Zygote, output_fd: int | None) -> ProcessIdentity:
        assert spawn.preloaded is not None
        actor = self.actor_ref
        holder: list[ProcessIdentity] = []

        def exited(returncode: int | None) -> None:  # on the zygote's reader thread
            with contextlib.suppress(pykka.ActorDeadError):  # stopped: on_stop saw it end
                actor.tell(_ZygoteExit(holder, returncode))

        fds: list[tuple[str, int]] = []
        if output_fd is not None:
            fds += [("stdout", output_fd), ("stderr", output_fd)]
        if spawn.fd_env is not None and spawn.pass_fds:
            fds.append((f"env:{spawn.fd_env}", spawn.pass_fds[0]))
        if spawn.stdio and spawn.pass_fds:
            fds += [("stdin", spawn.pass_fds[0]), ("stdout", spawn.pass_fds[0])]
        identity = zygote.spawn(
            spawn.preloaded, env=spawn.env, cwd=spawn.cwd, fds=fds, on_exit=exited
        )
        holder.append(identity)  # before this actor handles any exit report of the child
        return identity

    def _zygote_exit(self, identity: ProcessIdentity, returncode: int | None) -> None:
        supervised = self._children.pop(identity, None)
        if supervised is None:
            return
        if returncode is None:
            # The zygote died: the child is nobody's to reap now. Stop its group by exact
            # identity and report it as killed.
            signal_group(identity, signal.SIGKILL)
            returncode, supervised.killed = -signal.SIGKILL, True
        self._finish_log(supervised)
        _report_exit(supervised, returncode)

    def _signal(self, supervised: _Supervised, sig: signal.Signals) -> None:
        if supervised.child is not None:
            signal_own_child(supervised.child, sig)
        elif self._zygote is not None:
            self._zygote.signal_group(supervised.identity.pid, sig)

    def _kill(self, supervised: _Supervised) -> None:
        """SIGKILL a child's whole tree: its `setsid` escapees first, then its group.

        A runner is a child subreaper, so while it lives every process a node started is
        below it; killed first, none is left for init (a cold runner has no zygote to
        adopt them after it dies).
        """
        kill_descendants(supervised.identity)
        self._signal(supervised, signal.SIGKILL)

    def _stop_child(self, identity: ProcessIdentity, grace_ticks: int) -> None:
        supervised = self._children.get(identity)
        if supervised is None:
            return
        # The group gets its grace period; what left the group (a `setsid` escapee, a
        # registered shell command's own group) is killed now, as a registered group is.
        kill_descendants(identity, outside_group=True)
        self._signal(supervised, signal.SIGTERM)
        if supervised.kill_at_tick is None:
            supervised.kill_at_tick = self._tick + max(1, grace_ticks)

    def _stop_recorded(self, identities: tuple[ProcessIdentity, ...], timeout_s: float) -> int:
        stopped = [identity for identity in identities if signal_group(identity, signal.SIGKILL)]
        if not wait_for_exits(stopped, timeout_s):
            log.warning("a stale process outlived SIGKILL", extra={"action": "server.recovery"})
        return len(stopped)

    def _finish_log(self, supervised: _Supervised) -> None:
        if supervised.log_token is not None:
            self._logs.finish(supervised.log_token)
            supervised.log_token = None

    def _reap_and_escalate(self) -> None:
        for identity, supervised in list(self._children.items()):
            child = supervised.child
            if child is not None and exited_unreaped(child):
                # Stop stray members of the group while the zombie leader still
                # reserves its ID, then reap.
                signal_own_child(child, signal.SIGKILL)
                returncode = child.popen.wait(5)
                del self._children[identity]
                self._finish_log(supervised)
                _report_exit(supervised, returncode)
                continue
            if supervised.kill_at_tick is not None and self._tick >= supervised.kill_at_tick:
                supervised.killed = True
                self._kill(supervised)


def _report_exit(supervised: _Supervised, returncode: int) -> None:
    spawn = supervised.spawn
    if spawn.report_exit:
        exited = ChildExited(spawn.tag, supervised.identity, returncode, supervised.killed)
        with contextlib.suppress(pykka.ActorDeadError):  # its owner stopped first
            spawn.reply_to.tell(exited)
