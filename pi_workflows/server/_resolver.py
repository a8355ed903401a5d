"""Start-time source resolution in a short-lived child: the server never imports workflows.

Implements the source-resolver part of workflow-server.md § Process model and issue 5's
"source identity": `run.start` hands the reference to `python -m pi_workflows.engine.resolve`
in its own process group, bounded in time and output, and commits the run only with
what the child reported.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Protocol

import pykka

from pi_workflows.actors import Address, wait_reply
from pi_workflows.supervision import KillChild, ProcessIdentity, Spawn
from pi_workflows.wire.canonical import CanonicalJSONError, dumps, loads

__all__ = [
    "RESOLVER_MODULE",
    "RESOLVE_TIMEOUT_S",
    "ResolverChildren",
    "ResolverPort",
    "resolve_apply",
    "resolve_start",
    "resolver_spawns",
]

RESOLVE_TIMEOUT_S = 30.0
MAX_RESOLVER_OUTPUT = 4 * 1024 * 1024
RESOLVER_MODULE = "pi_workflows.engine.resolve"

_spawns = 0
_spawns_lock = threading.Lock()


def resolver_spawns() -> int:
    """Resolver children started by this process so far (tests and benchmarks read it)."""
    with _spawns_lock:
        return _spawns


def _count_spawn() -> None:
    global _spawns  # noqa: PLW0603 - a process-wide counter, changed under its lock
    with _spawns_lock:
        _spawns += 1


class ResolverChildren(Protocol):
    """Starts and kills resolver children: the server passes the process supervisor's
    port (`ResolverPort`), so the supervisor is the one signaller."""

    def start(self, cwd: Path | None, child_end: socket.socket) -> ProcessIdentity:
        """Start one resolver with `child_end` as its stdin and stdout (then closed here)."""
        ...

    def kill(self, identity: ProcessIdentity) -> None:
        """SIGKILL the resolver's group: nothing the workflow started outlives it."""
        ...


def resolve_start(
    workflow: str,
    project_path: str | None,
    agent_dir: Path,
    workflow_input: Any,
    children: ResolverChildren,
) -> dict[str, Any]:
    """Run the resolver child and return its one response object.

    Never raises for a bad workflow: failures come back as `{"ok": false, ...}`. Runs on
    a resolver thread, never on an actor; it waits for the child, bounded in time.
    """
    request = {
        "workflow": workflow,
        "projectPath": project_path,
        "agentDir": str(agent_dir),
        "input": workflow_input,
    }
    return _ask(request, project_path, children, "the workflow")


def resolve_apply(
    manager: str,
    project_path: str | None,
    agent_dir: Path,
    spec: Any,
    children: ResolverChildren,
) -> dict[str, Any]:
    """`resourceManager.apply`'s resolution: the child's `apply_answer` (the manager's
    proposal, or a refusal). The server still re-checks the source before it commits.

    Never raises for a bad manager or spec; runs on a resolver thread, like `resolve_start`.
    """
    request = {
        "resourceManager": manager,
        "projectPath": project_path,
        "agentDir": str(agent_dir),
        "spec": spec,
    }
    return _ask(request, project_path, children, "the resource manager")


def _ask(
    request: dict[str, Any], project_path: str | None, children: ResolverChildren, what: str
) -> dict[str, Any]:
    """Send one request line to a new resolver child and read its one answer line."""
    line = dumps(request)
    cwd = Path(project_path) if project_path and Path(project_path).is_dir() else None
    _count_spawn()
    server_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with server_end:
        try:
            identity = children.start(cwd, child_end)
        except OSError:
            return _failure("definitionInvalid", f"{what} could not be loaded")
        try:
            server_end.settimeout(RESOLVE_TIMEOUT_S)
            server_end.sendall(line + b"\n")
            out = _read_line(server_end)
        except TimeoutError:
            return _failure("definitionInvalid", f"loading {what} took too long")
        except OSError:
            out = b""
        finally:
            children.kill(identity)
    return _answer(out, what)


def _read_line(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_RESOLVER_OUTPUT:
        chunk = sock.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if b"\n" in chunk:
            break
    return b"".join(chunks)


def _answer(out: bytes, what: str) -> dict[str, Any]:
    line = out[:MAX_RESOLVER_OUTPUT].split(b"\n", 1)[0]
    try:
        answer = loads(line)
    except CanonicalJSONError:
        return _failure("definitionInvalid", f"{what} could not be loaded")
    if not isinstance(answer, dict) or "ok" not in answer:
        return _failure("definitionInvalid", f"{what} could not be loaded")
    return answer


def _failure(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "code": code, "message": message}


SPAWN_REPLY_S = 10.0


class ResolverPort:
    """Resolver children through the supervisor, for the resolver threads (not actors).

    **Blocking:** `start` waits (at most `SPAWN_REPLY_S`) for the spawn's identity; only a
    resolver thread calls it. `kill` only queues.
    """

    def __init__(self, supervisor: pykka.ActorRef[Any]) -> None:
        self._supervisor = supervisor

    def start(self, cwd: Path | None, child_end: socket.socket) -> ProcessIdentity:
        """Start one resolver with `child_end` as its stdin and stdout.

        Raises:
            OSError: the spawn failed, or the supervisor did not answer in time.
        """
        fd = child_end.detach()  # the supervisor closes it once the child has it

        def send(box: Address) -> None:
            self._supervisor.tell(
                Spawn(
                    [sys.executable, "-m", RESOLVER_MODULE],
                    os.environ,
                    box,
                    report_exit=False,  # the resolver thread reads its answer, then kills it
                    cwd=cwd,
                    pass_fds=(fd,),
                    preloaded=RESOLVER_MODULE,
                    stdio=True,
                )
            )

        try:
            identity: ProcessIdentity = wait_reply(send, SPAWN_REPLY_S)
        except (TimeoutError, pykka.ActorDeadError) as exc:
            raise OSError(f"no resolver was started: {type(exc).__name__}") from None
        return identity

    def kill(self, identity: ProcessIdentity) -> None:
        with contextlib.suppress(pykka.ActorDeadError):
            self._supervisor.tell(KillChild(identity))
