"""The zygote process (`python -m pi_workflows.supervision.zygote MODULE...`).

Implements issue 5's spawn-speed rule without giving up workflow-server.md § Process
supervision: one interpreter, started once per server before the server has threads or
SQLite connections, imports the child programs' modules and then forks each child on
request, so a runner or resolver costs a fork (about a millisecond) instead of a cold
interpreter and its imports. Every forked child still starts in a session (and process
group) of its own; the zygote is its parent, so only the zygote waits for it, signals it
while it is unreaped, and kills its group's strays before reaping it, exactly as the
supervisor does for a directly spawned child.

The control channel is an `AF_UNIX` `SOCK_SEQPACKET` pair: one JSON object per packet,
file descriptors passed with `SCM_RIGHTS`. Requests (server to zygote)::

    {"op": "spawn", "id": N, "module": M, "env": {...}, "cwd": PATH | null,
     "fdRoles": ["stdin" | "stdout" | "stderr" | "env:NAME", ...]}   + one fd per role
    {"op": "signal", "pid": P, "signal": S}      # to P's group, only while P is unreaped

Events (zygote to server)::

    {"op": "ready", "pid": zygote PID, "modules": [...]}
    {"op": "spawned", "id": N, "pid": P, "startTicks": T, "bootId": B}
    {"op": "spawnFailed", "id": N, "error": text}
    {"op": "exited", "pid": P, "returncode": rc}   # rc < 0: the signal that ended it

The zygote is a child subreaper (`supervision._subreaper`): when a child dies, whatever
it left running (a `setsid` escapee of a node, a shell command's background job) is
re-parented to the zygote, which SIGKILLs and reaps all of it before it reads the next
request. End of file on the channel (the server stopped or died) ends the zygote: it
kills the groups of the children it still has (they cannot reach their server any more),
reaps them, stops everything they left behind the same way, and exits. A successor
server's recovery stops whatever a crash left behind.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from pi_workflows.supervision._process import ProcessIdentity, identity_of, set_process_name
from pi_workflows.supervision._subreaper import become_subreaper, stop_descendants

__all__ = ["CONTROL_FD_ENV", "MAX_PACKET", "SPARES_ENV", "main"]

CONTROL_FD_ENV = "PI_WORKFLOWS_ZYGOTE_FD"
MAX_PACKET = 4 * 1024 * 1024
"""Largest control packet; a spawn request carries the child's whole environment."""
MAX_FDS = 8
SPARES_ENV = "PI_WORKFLOWS_ZYGOTE_SPARES"
"""`0` forks every child on request instead of keeping one spare per module."""
_STDIO = {"stdin": 0, "stdout": 1, "stderr": 2}
ORPHAN_STOP_TIMEOUT_S = 2.0
"""The longest the zygote's loop waits for a dead child's orphans to die (SIGKILL takes
microseconds; only a process stuck in the kernel takes longer, and is met again at the
next exit)."""


@dataclass(slots=True)
class _Spare:
    """A child forked ahead of its request: it already leads its own session and group,
    and blocks reading one spawn request (and its fds) from `sock`."""

    pid: int
    sock: socket.socket
    """The zygote's end of the spare's private `SOCK_SEQPACKET` pair."""
    settled: int
    """Read end of the setsid handshake pipe (end of file once the spare called setsid)."""
    identity: ProcessIdentity | None


class _Zygote:
    def __init__(self, control: socket.socket, modules: list[str], warm: str | None) -> None:
        self._control = control
        self._modules = {name: importlib.import_module(name) for name in modules}
        self.warm = warm
        """The module whose `prewarm()` fills shared caches here and whose `rehearse()`
        each spare runs while idle (None: no warm-up)."""
        _warm_hook(warm, "prewarm")
        self._children: set[int] = set()
        self._spares: dict[str, _Spare] = {}
        self._use_spares = os.environ.get(SPARES_ENV) != "0"
        """One spare per module, forked after the previous one was used (see `_Spare`)."""
        self._wakeup_r, self._wakeup_w = os.pipe()
        os.set_blocking(self._wakeup_r, False)
        os.set_blocking(self._wakeup_w, False)
        self._selector = selectors.DefaultSelector()

    def serve(self) -> int:
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd does the work
        signal.set_wakeup_fd(self._wakeup_w)
        selector = self._selector
        selector.register(self._control, selectors.EVENT_READ, "control")
        selector.register(self._wakeup_r, selectors.EVENT_READ, "child")
        gc.freeze()  # keep the imported heap shared with children (no copy-on-write by gc)
        self._send({"op": "ready", "pid": os.getpid(), "modules": sorted(self._modules)})
        while True:
            # Fork the missing spares only while no request waits: a spawn never waits
            # for a spare's fork, and a spare never inherits a request's descriptors.
            self._replenish()
            for key, _ in selector.select():
                if key.data == "child":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wakeup_r, 4096)
                    self._reap()
                elif not self._read_request():
                    self._stop_all()
                    return 0

    def _read_request(self) -> bool:
        try:
            data, fds, _, _ = socket.recv_fds(self._control, MAX_PACKET, MAX_FDS)
        except OSError:
            return False
        if not data:
            for fd in fds:
                os.close(fd)
            return False
        try:
            request = json.loads(data)
            if request.get("op") == "spawn":
                self._spawn(request, data, fds)
            elif request.get("op") == "signal":
                self._signal(int(request["pid"]), int(request["signal"]))
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return True

    def _spawn(self, request: dict[str, Any], data: bytes, fds: list[int]) -> None:
        roles = list(request.get("fdRoles") or [])
        name = request.get("module", "")
        module = self._modules.get(name)
        if module is None or len(roles) != len(fds):
            self._send({"op": "spawnFailed", "id": request.get("id"), "error": "bad request"})
            return
        spare = self._spares.pop(name, None)
        if spare is not None:
            pid = self._hand_to_spare(spare, data, fds)
            if pid is not None:
                self._report_spawned(request, pid, spare.identity)
                return
        try:
            pid, settled_r = self._fork(_child, self, module, request, roles, fds)
        except OSError as exc:
            self._send({"op": "spawnFailed", "id": request.get("id"), "error": str(exc)})
            return
        _await_settled(settled_r)
        self._children.add(pid)
        self._report_spawned(request, pid, identity_of(pid))

    def _fork(self, become: Callable[..., NoReturn], *args: Any) -> tuple[int, int]:
        """Fork a child that runs `become(*args, settled=write end of the handshake)`.

        Returns (pid, read end of the handshake pipe).
        """
        settled_r, settled_w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(settled_r)
            os.close(settled_w)
            raise
        if pid == 0:
            os.close(settled_r)
            become(*args, settled=settled_w)
        os.close(settled_w)
        return pid, settled_r

    def _hand_to_spare(self, spare: _Spare, data: bytes, fds: list[int]) -> int | None:
        """Give the request to a spare; its PID, or None if it is gone (fork instead)."""
        # Report a spare only once it leads a session and group of its own.
        _await_settled(spare.settled)
        try:
            socket.send_fds(spare.sock, [data], fds)
        except OSError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(spare.pid, signal.SIGKILL)  # reaped as a spare, never reported
            spare.sock.close()
            return None
        spare.sock.close()
        self._children.add(spare.pid)
        return spare.pid

    def _replenish(self) -> None:
        if not self._use_spares:
            return
        for name, module in self._modules.items():
            if name in self._spares:
                continue
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                pid, settled_r = self._fork(_spare_child, self, module, theirs, ours)
            except OSError:
                ours.close()
                theirs.close()
                return  # no spare: spawns fork directly
            theirs.close()
            self._spares[name] = _Spare(pid, ours, settled_r, identity_of(pid))

    def _report_spawned(
        self, request: dict[str, Any], pid: int, identity: ProcessIdentity | None
    ) -> None:
        self._send(
            {
                "op": "spawned",
                "id": request.get("id"),
                "pid": pid,
                "startTicks": identity.start_ticks if identity else 0,
                "bootId": identity.boot_id if identity else "",
            }
        )

    def _signal(self, pid: int, signum: int) -> None:
        if pid not in self._children:  # reaped: its PID may belong to anyone now
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signum)

    def _reap(self) -> None:
        ended = False
        while True:  # adopted orphans are reaped here too, known children or not
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                break
            pid = info.si_pid
            # Stop stray members of the group while the zombie leader still reserves its
            # ID, then reap.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            if pid in self._children:
                self._children.discard(pid)
                self._send({"op": "exited", "pid": pid, "returncode": _returncode(status)})
                ended = True
                continue
            for name, spare in list(self._spares.items()):
                if spare.pid == pid:  # a spare died unused: nobody knew it
                    del self._spares[name]
                    _close_spare(spare)
        if ended:
            self._stop_orphans()

    def _stop_orphans(self) -> None:
        """Stop and reap whatever a dead child left behind, `setsid` or not.

        The zygote is a child subreaper, so a runner's (or resolver's) orphans, and the
        orphans of theirs that died before, are re-parented here at the moment it dies,
        before its exit is reported. Every child that is neither a known child nor a
        spare is one of them; the subtrees of the living children are left alone.
        """
        known = self._children | {spare.pid for spare in self._spares.values()}
        stop_descendants(spare=known, timeout_s=ORPHAN_STOP_TIMEOUT_S)

    def _stop_all(self) -> None:
        # The server is gone (or closed us): its runners cannot reach it any more, so
        # stop their groups now instead of leaving them for the next server's recovery.
        spares = list(self._spares.values())
        self._spares.clear()
        pids = list(self._children) + [spare.pid for spare in spares]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        for spare in spares:
            _close_spare(spare)
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            self._children.discard(pid)
        stop_descendants()  # what they left behind: re-parented here as they died

    def _send(self, event: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the server is gone: end of file ends us next
            self._control.send(json.dumps(event).encode("utf-8"))

    def close_in_child(self) -> None:
        signal.set_wakeup_fd(-1)
        self._selector.close()
        for fd in (self._wakeup_r, self._wakeup_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._control.close()
        for spare in self._spares.values():  # other spares' channels are not ours
            _close_spare(spare)
        self._spares.clear()


def _await_settled(settled_r: int) -> None:
    # The child closes its end right after setsid (or dies): before that, a signal to
    # its group finds no group and is lost, and the group has the zygote's ID.
    with contextlib.suppress(OSError):
        os.read(settled_r, 1)
    os.close(settled_r)


def _close_spare(spare: _Spare) -> None:
    spare.sock.close()
    with contextlib.suppress(OSError):
        os.close(spare.settled)


def _warm_hook(warm: str | None, name: str) -> None:
    """Call `name` (`prewarm` in the zygote, `rehearse` in a spare) of the warm module.

    The server names the module (`--warm`), so supervision imports no workflow engine:
    the zygote only forks, and what it preloads and warms is the caller's choice.
    """
    if warm is not None:
        getattr(importlib.import_module(warm), name)()


def _returncode(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _settle(zygote: _Zygote, settled: int) -> None:
    """In a forked child: lead a new session and group, then leave the zygote's state."""
    os.setsid()
    os.close(settled)  # tells the zygote: this child leads its own session and group
    zygote.close_in_child()
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def _child(
    zygote: _Zygote,
    module: Any,
    request: dict[str, Any],
    roles: list[str],
    fds: list[int],
    *,
    settled: int,
) -> NoReturn:
    """In the forked child: become the requested program; never return to the loop."""
    code = 1
    try:
        _settle(zygote, settled)
        code = _become(module, request, roles, fds)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a child never returns into the zygote
        with contextlib.suppress(Exception):
            traceback.print_exc()
    _exit(code)


def _spare_child(
    zygote: _Zygote, module: Any, sock: socket.socket, peer: socket.socket, *, settled: int
) -> NoReturn:
    """In a spare: settle now, then wait for the one request and become its program.

    End of file before a request (the zygote stopped or died) ends the spare.
    """
    code = 1
    try:
        peer.close()  # the zygote's end: only the zygote may hold it, or EOF never comes
        _settle(zygote, settled)
        set_process_name("piw-spare")
        _warm_hook(zygote.warm, "rehearse")
        data, fds, _, _ = socket.recv_fds(sock, MAX_PACKET, MAX_FDS)
        sock.close()
        if not data:
            os._exit(0)
        request = json.loads(data)
        code = _become(module, request, list(request.get("fdRoles") or []), fds)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a child never returns into the zygote
        with contextlib.suppress(Exception):
            traceback.print_exc()
    _exit(code)


def _become(module: Any, request: dict[str, Any], roles: list[str], fds: list[int]) -> int:
    """Take the request's environment, descriptors and folder, then run `module.main()`."""
    env = {str(k): str(v) for k, v in (request.get("env") or {}).items()}
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    for role, fd in zip(roles, fds, strict=True):
        if role in _STDIO:
            os.dup2(fd, _STDIO[role])
        elif role.startswith("env:"):
            os.set_inheritable(fd, True)
            env[role[4:]] = str(fd)
    # Exactly `env` afterwards; only the differences are written (each one is a putenv).
    for key in [key for key in os.environ if key not in env]:
        del os.environ[key]
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
    if request.get("cwd"):
        os.chdir(request["cwd"])
    sys.argv = [module.__name__]
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    # Line-buffered as CPython's own stderr: a print reaches the log at once (`run logs
    # --follow`), and a child killed mid-node does not lose what it printed last.
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)  # noqa: SIM115
    return int(module.main() or 0)


def _exit(code: int) -> NoReturn:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def main() -> int:
    """Serve spawn requests on the inherited control socket until it closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when we stop
    set_process_name("piw-zygote")
    # Orphans of its children (a runner's `setsid` escapees among them) come here, not
    # to init, so the zygote can stop them when their runner is gone.
    become_subreaper()
    control = socket.socket(fileno=int(os.environ.pop(CONTROL_FD_ENV)))
    control.setblocking(True)
    try:
        modules, warm = sys.argv[1:], None
        if modules[:1] == ["--warm"]:
            warm, modules = modules[1], modules[2:]
        zygote = _Zygote(control, modules, warm)
    except Exception:  # noqa: BLE001 - reported as a failed start; the server falls back
        traceback.print_exc()
        return 1
    return zygote.serve()


if __name__ == "__main__":
    sys.exit(main())
