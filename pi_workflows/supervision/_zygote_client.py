"""The server's end of the zygote: start it once, fork children through it, hear exits.

See `pi_workflows.supervision.zygote` for the process and its control protocol. One
`Zygote` is shared by the process-supervisor actor (runners) and the resolver threads;
it is thread-safe. When the zygote cannot start or dies, `spawn` raises
`ZygoteUnavailable` and callers start a cold interpreter instead, and every child it
had is reported to its owner with an unknown fate (`on_exit(None)`), so the owner can
stop that child's group by exact identity.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from pi_workflows.supervision._process import ProcessIdentity
from pi_workflows.supervision.zygote import CONTROL_FD_ENV, MAX_PACKET

__all__ = ["ExitCallback", "Zygote", "ZygoteUnavailable"]

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 30.0
SPAWN_TIMEOUT_S = 10.0
RESTART_LIMIT = 3
"""Zygote starts per server before it gives up and callers spawn cold interpreters."""

MAX_EVENT = 64 * 1024
"""Largest event the zygote sends (spawned, exited, ready: all small)."""

ExitCallback = Callable[[int | None], None]
"""Called once per child on the zygote's reader thread: the exit code (minus the signal
number), or None when the zygote was lost and the child's fate is unknown. Must not block."""


ZYGOTE_MODULE = "pi_workflows.supervision.zygote"


class ZygoteUnavailable(Exception):  # noqa: N818 - a condition, not a failure of the caller
    """The zygote could not fork this child; spawn a cold interpreter instead."""


class _Process:
    """One started zygote process and its control channel."""

    def __init__(self, modules: Sequence[str], log_path: Path | None, warm: str | None) -> None:
        server_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for end in (server_end, zygote_end):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_PACKET)
        env = dict(os.environ)
        env[CONTROL_FD_ENV] = str(zygote_end.fileno())
        output = (
            os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if log_path is not None
            else subprocess.DEVNULL
        )
        try:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", ZYGOTE_MODULE, *_warm_args(warm), *modules],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                start_new_session=True,  # terminal signals reach the server, not the zygote
                close_fds=True,
                pass_fds=(zygote_end.fileno(),),
            )
        finally:
            zygote_end.close()
            if isinstance(output, int) and output >= 0:
                os.close(output)
        self.sock = server_end
        self.ready = False

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)
        self.sock.close()


class Zygote:
    """A lazily started, restartable zygote for the given modules.

    Args:
        modules: the programs it may run (each module's `main()` is the child).
        log_path: where the zygote's own stdout and stderr go (0600).
        warm: a module whose `prewarm()` the zygote runs once and whose `rehearse()`
            each idle spare runs (the server passes the engine); None: no warm-up.

    **Blocking:** `spawn` waits for one fork round trip (bounded); nothing waits on a child.
    """

    def __init__(
        self, modules: Sequence[str], log_path: Path | None = None, warm: str | None = None
    ) -> None:
        self.modules = frozenset(modules)
        self._log_path = log_path
        self._warm = warm
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._process: _Process | None = None
        self._starts = 0
        self._closed = False
        self._ids = 0
        self._pending: dict[int, tuple[Future[ProcessIdentity], ExitCallback]] = {}
        self._exits: dict[int, ExitCallback] = {}

    def prestart(self) -> None:
        """Start the zygote process now (it imports while the server starts)."""
        with self._lock, contextlib.suppress(ZygoteUnavailable):
            self._process_locked(wait_ready=False)

    def spawn(
        self,
        module: str,
        *,
        env: Mapping[str, str],
        cwd: Path | None,
        fds: Sequence[tuple[str, int]],
        on_exit: ExitCallback,
    ) -> ProcessIdentity:
        """Fork `module`'s `main()` in a new session; return the child's identity.

        `fds` are (role, fd) pairs: role `stdin`, `stdout`, `stderr`, or `env:NAME` (the
        child finds the descriptor's number in NAME). The caller keeps and closes its fds.

        Raises:
            ZygoteUnavailable: no zygote, or it failed this fork; nothing was started.
        """
        if module not in self.modules:
            raise ZygoteUnavailable(f"{module} is not preloaded")
        with self._lock:
            process = self._process_locked(wait_ready=True)
            self._ids += 1
            request_id = self._ids
            future: Future[ProcessIdentity] = Future()
            self._pending[request_id] = (future, on_exit)
        request = {
            "op": "spawn",
            "id": request_id,
            "module": module,
            "env": dict(env),
            "cwd": str(cwd) if cwd is not None else None,
            "fdRoles": [role for role, _ in fds],
        }
        try:
            with self._send_lock:
                socket.send_fds(
                    process.sock, [json.dumps(request).encode("utf-8")], [fd for _, fd in fds]
                )
            return future.result(SPAWN_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            with self._lock:
                self._pending.pop(request_id, None)
            raise ZygoteUnavailable(f"the zygote did not fork: {type(exc).__name__}") from exc

    def signal_group(self, pid: int, sig: signal.Signals) -> None:
        """Signal a child's group while the zygote has not reaped it (else nothing)."""
        with self._lock:
            process = self._process
            if process is None or pid not in self._exits:
                return
        with self._send_lock, contextlib.suppress(OSError):
            process.sock.send(json.dumps({"op": "signal", "pid": pid, "signal": int(sig)}).encode())

    def close(self) -> None:
        """Stop the zygote; it kills the groups of the children it still has."""
        with self._lock:
            self._closed = True
            process, self._process = self._process, None
        if process is not None:
            process.stop()

    # --- internals ---------------------------------------------------------------------

    def _process_locked(self, *, wait_ready: bool) -> _Process:
        if self._closed:
            raise ZygoteUnavailable("closed")
        process = self._process
        if process is None:
            if self._starts >= RESTART_LIMIT:
                raise ZygoteUnavailable("the zygote failed too often")
            self._starts += 1
            try:
                process = _Process(sorted(self.modules), self._log_path, self._warm)
            except OSError as exc:
                raise ZygoteUnavailable(f"the zygote did not start: {exc}") from exc
            self._process = process
        if wait_ready and not process.ready:
            self._await_ready(process)
        return process

    def _await_ready(self, process: _Process) -> None:
        process.sock.settimeout(READY_TIMEOUT_S)
        try:
            data = process.sock.recv(MAX_EVENT)
            event = json.loads(data) if data else {}
        except (OSError, ValueError):
            event = {}
        if event.get("op") != "ready":
            self._process = None
            process.stop()
            log.warning("zygote failed to start", extra={"action": "zygote.failed"})
            raise ZygoteUnavailable("the zygote did not report ready")
        process.sock.settimeout(None)
        process.ready = True
        threading.Thread(
            target=self._read, args=(process,), name="zygote-reader", daemon=True
        ).start()

    def _read(self, process: _Process) -> None:
        while True:
            try:
                data = process.sock.recv(MAX_EVENT)
            except OSError:
                data = b""
            if not data:
                self._lost(process)
                return
            try:
                event: dict[str, Any] = json.loads(data)
            except ValueError:
                continue
            self._on_event(event)

    def _on_event(self, event: dict[str, Any]) -> None:
        op = event.get("op")
        if op in ("spawned", "spawnFailed"):
            with self._lock:
                entry = self._pending.pop(int(event.get("id") or 0), None)
                if entry is not None and op == "spawned":
                    self._exits[int(event["pid"])] = entry[1]
            if entry is None:
                return
            future, _ = entry
            if op == "spawned":
                future.set_result(
                    ProcessIdentity(
                        int(event["pid"]), int(event["startTicks"]), str(event["bootId"])
                    )
                )
            else:
                future.set_exception(OSError(str(event.get("error"))))
        elif op == "exited":
            with self._lock:
                callback = self._exits.pop(int(event["pid"]), None)
            if callback is not None:
                callback(int(event["returncode"]))

    def _lost(self, process: _Process) -> None:
        with self._lock:
            if self._process is process:
                self._process = None
            orphans, self._exits = list(self._exits.values()), {}
            pending, self._pending = list(self._pending.values()), {}
            closing = self._closed
        if not closing:
            log.warning("zygote lost", extra={"action": "zygote.lost"})
        for future, _ in pending:
            future.set_exception(OSError("zygote lost"))
        for callback in orphans:
            callback(None)
        if not closing:
            with contextlib.suppress(OSError):
                process.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.popen.wait(5)


def _warm_args(warm: str | None) -> list[str]:
    """The zygote's argv option naming its warm-up module, if any."""
    return ["--warm", warm] if warm is not None else []
