"""The resource runner child (`python -m pi_workflows.engine.resource_runner`): one pass.

It loads the manager's exact applied bytes (`load_manager(..., expected_digest=)`), runs
`reconcile(ctx)` and proposes the outcome over `resource-runner.v1`; it never opens the
database (workflow-server.md § Resource managers: the server commits under the claim).
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
import traceback
from typing import Final

from pi_workflows.engine._errors import ManagerSourceChangedError, ResourceManagerLoadError
from pi_workflows.engine._resource_manager import ReconcileContext, Resource, finish_pass
from pi_workflows.engine._resource_manager_source import load_manager
from pi_workflows.supervision import (
    become_subreaper,
    crash_point,
    set_process_name,
    stop_descendants,
)
from pi_workflows.wire.framing import FrameDecoder, FrameError, encode_frame
from pi_workflows.wire.protocol import ProtocolViolation
from pi_workflows.wire.resource_runner import (
    MAX_ERROR_CLASS_CHARS,
    PassFailed,
    PassProposed,
    PassStart,
    RunnerReadyForPass,
)

__all__ = ["RESOURCE_RUNNER_FD_ENV", "RESOURCE_RUNNER_PROCESS_NAME", "main", "run_pass"]

RESOURCE_RUNNER_FD_ENV: Final = "PI_WORKFLOWS_RESOURCE_RUNNER_FD"
RESOURCE_RUNNER_PROCESS_NAME: Final = "piw-resource-runner"
EXIT_BAD_START: Final = 2
_CLASS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def _error_class(exc: BaseException) -> str:
    """The exception's type name only: its message may carry user data."""
    name = type(exc).__name__
    if not _CLASS_NAME.fullmatch(name):
        return "ReconcileError"
    return name[:MAX_ERROR_CLASS_CHARS]


def run_pass(start: PassStart) -> PassProposed | PassFailed:
    """Load the manager and make one pass. Runs manager code: only in this child."""
    try:
        loaded = load_manager(start.manager, start.path, expected_digest=start.source_digest)
    except ManagerSourceChangedError:
        return PassFailed("sourceChanged")
    except ResourceManagerLoadError:
        traceback.print_exc()  # to this child's private log, never to the server's
        return PassFailed("loadFailed")
    crash_point("runner.reconcile.after_load")
    try:
        resource = Resource.from_wire(start.resource)
    except ValueError:
        return PassFailed("badStart")
    ctx = ReconcileContext(resource, deadline=time.monotonic() + start.deadline_ms / 1000)
    try:
        returned = loaded.definition.reconcile(ctx)
        result = finish_pass(ctx, returned)
    except Exception as exc:  # noqa: BLE001 - manager code: an `error` outcome, by type
        traceback.print_exc()
        return PassFailed(_error_class(exc))
    return PassProposed(result.to_wire())


def _read_frame(sock: socket.socket) -> dict[str, object] | None:
    decoder = FrameDecoder()
    while True:
        data = sock.recv(65536)
        if not data:
            return None
        frames = decoder.feed(data)
        if frames:
            return frames[0]


def main() -> int:
    """Serve one pass on the socket named by `PI_WORKFLOWS_RESOURCE_RUNNER_FD`.

    **Exit status:** 0 once an outcome was sent; 2 for a missing or malformed start.
    """
    set_process_name(RESOURCE_RUNNER_PROCESS_NAME)
    sys.stdout = sys.stderr  # manager prints never reach the channel
    become_subreaper()  # what the manager starts stays below this child until it ends
    sock = socket.socket(fileno=int(os.environ.pop(RESOURCE_RUNNER_FD_ENV)))
    sock.setblocking(True)
    try:
        sock.sendall(encode_frame(RunnerReadyForPass().to_wire()))
        frame = _read_frame(sock)
        if frame is None:
            return EXIT_BAD_START
        start = PassStart.from_wire(frame)
        outcome = run_pass(start)
        crash_point("runner.reconcile.before_result")
        sock.sendall(encode_frame(outcome.to_wire()))
        return 0
    except (FrameError, ProtocolViolation, OSError):
        traceback.print_exc()
        return EXIT_BAD_START
    finally:
        stop_descendants()
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
