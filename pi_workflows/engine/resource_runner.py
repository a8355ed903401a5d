"""The resource runner child (`python -m pi_workflows.engine.resource_runner`): one pass.

It loads the manager's applied bytes, runs `reconcile(ctx)` (its `ensure` calls go over
the same channel, `ChannelHost`) and proposes the outcome over `resource-runner.v1`; it
never opens the database: the server commits under the pass's claim.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from pi_workflows._paths import agent_dir
from pi_workflows.engine._context import NOT_APPLIED
from pi_workflows.engine._errors import (
    EffectRejectedError,
    ManagerSourceChangedError,
    RequestKeyConflictError,
    ResourceManagerError,
    ResourceManagerLoadError,
)
from pi_workflows.engine._resource_manager import ReconcileContext, Resource, finish_pass
from pi_workflows.engine._resource_manager_services import (
    ChildRun,
    ChildRunCall,
    ManagedEffect,
    ManagedEffectCall,
)
from pi_workflows.engine._resource_manager_source import load_manager
from pi_workflows.engine.resolve import resolve_request
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
    ChildRunAnswered,
    ChildRunRequested,
    EffectAnswered,
    EffectRequested,
    PassFailed,
    PassProposed,
    PassStart,
    RunnerReadyForPass,
    decode_server_answer,
)

__all__ = [
    "RESOURCE_RUNNER_FD_ENV",
    "RESOURCE_RUNNER_PROCESS_NAME",
    "ChannelHost",
    "main",
    "run_pass",
]

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


_RUN_STATES: Final = {
    "completed": "done",
    "failed": "failed",
    "timed_out": "failed",
    "cancelled": "cancelled",
    "waiting": "parked",
}
"""A stored run status as `ChildRun.state` names it (`queued`, `running` stay)."""


class ChannelHost:
    """`WorkflowsHost` and `ManagerEffectHost` over the private channel: one request,
    then its answer, in the pass's own thread."""

    def __init__(
        self,
        ask: Callable[[dict[str, Any]], ChildRunAnswered | EffectAnswered],
        project: Path,
        agent_dir: Path,
    ) -> None:
        self._ask = ask
        self._project = project
        self._agent_dir = agent_dir

    def ensure_child(self, call: ChildRunCall) -> ChildRun:
        resolved = resolve_request(
            {
                "workflow": call.workflow,
                "projectPath": str(self._project),
                "agentDir": str(self._agent_dir),
                "input": call.input,
            }
        )
        resolved.pop("reuse", None)  # the server's definition cache is not fed from here
        answer = self._ask(
            ChildRunRequested(
                call.request_key, call.workflow, call.input_fingerprint, resolved
            ).to_wire()
        )
        if not isinstance(answer, ChildRunAnswered):
            raise ResourceManagerError("the server answered another request")
        if answer.error_code == "requestKeyConflict":
            raise RequestKeyConflictError(
                f"request key {call.request_key!r} was used with another workflow or input"
            )
        if answer.run_id is None or answer.state is None:
            raise ResourceManagerError(
                f"ctx.workflows.ensure refused: {answer.error_code or 'unknown'}"
            )
        state = _RUN_STATES.get(answer.state, answer.state)
        return ChildRun(
            call.request_key,
            answer.run_id,
            state,
            output=answer.output if state == "done" else None,
            error=answer.error if state in ("failed", "parked") else None,
        )

    def _effect(self, step: EffectRequested) -> EffectAnswered:
        answer = self._ask(step.to_wire())
        if not isinstance(answer, EffectAnswered):
            raise ResourceManagerError("the server answered another request")
        if answer.error_code == "requestMismatch":
            raise RequestKeyConflictError(f"effect key {step.key!r} was used with another request")
        if answer.decision is None:
            raise ResourceManagerError(
                f"ctx.effects.ensure refused: {answer.error_code or 'unknown'}"
            )
        return answer

    def ensure_effect(self, call: ManagedEffectCall) -> ManagedEffect:
        key = call.key
        reserved = self._effect(EffectRequested("reserve", key, call.kind, call.request))
        if reserved.decision == "observe":
            try:
                seen = call.observe(key, call.request)
            except Exception as exc:  # manager code: the effect stays indeterminate
                raise ResourceManagerError(
                    f"effect {key!r} is indeterminate: observe could not tell"
                ) from exc
            if seen is not NOT_APPLIED:
                settled = self._effect(
                    EffectRequested("settle", key, outcome="applied", result=seen, observed=True)
                )
                return _managed(call, settled)
            reserved = self._effect(EffectRequested("retry", key))
        if reserved.decision == "adopt":
            return _managed(call, reserved)
        try:
            result = call.apply(key, call.request)
        except EffectRejectedError as exc:
            rejected = EffectRequested("settle", key, outcome="rejected", error=str(exc)[:500])
            return _managed(call, self._effect(rejected))
        applied = EffectRequested("settle", key, outcome="applied", result=result)
        return _managed(call, self._effect(applied))


def _managed(call: ManagedEffectCall, answer: EffectAnswered) -> ManagedEffect:
    if answer.state == "rejected":
        return ManagedEffect(call.key, call.kind, "rejected", error=answer.error)
    if answer.state != "applied":
        raise ResourceManagerError(f"effect {call.key!r} is {answer.state}")
    return ManagedEffect(call.key, call.kind, "applied", result=answer.result)


def run_pass(start: PassStart, host: ChannelHost | None = None) -> PassProposed | PassFailed:
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
    ctx = ReconcileContext(
        resource,
        deadline=time.monotonic() + start.deadline_ms / 1000,
        workflows=host,
        effects=host,
    )
    try:
        returned = loaded.definition.reconcile(ctx)
        result = finish_pass(ctx, returned)
    except Exception as exc:  # noqa: BLE001 - manager code: an `error` outcome, by type
        traceback.print_exc()
        return PassFailed(_error_class(exc))
    return PassProposed(result.to_wire())


class _Channel:
    """The child's end: frames in order, one decoder for the whole pass."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._decoder = FrameDecoder()
        self._frames: list[dict[str, Any]] = []

    def send(self, frame: dict[str, Any]) -> None:
        self._sock.sendall(encode_frame(frame))

    def read(self) -> dict[str, Any] | None:
        while not self._frames:
            data = self._sock.recv(65536)
            if not data:
                return None
            self._frames.extend(self._decoder.feed(data))
        return self._frames.pop(0)

    def ask(self, frame: dict[str, Any]) -> ChildRunAnswered | EffectAnswered:
        """Send one request and wait for its answer (the server answers in order).

        Raises:
            ResourceManagerError: the channel closed (the pass is being stopped).
        """
        self.send(frame)
        answer = self.read()
        if answer is None:
            raise ResourceManagerError("the server closed the channel")
        return decode_server_answer(answer)


def main() -> int:
    """Serve one pass on the socket named by `PI_WORKFLOWS_RESOURCE_RUNNER_FD`.

    **Exit status:** 0 once an outcome was sent; 2 for a missing or malformed start.
    """
    set_process_name(RESOURCE_RUNNER_PROCESS_NAME)
    sys.stdout = sys.stderr  # manager prints never reach the channel
    become_subreaper()  # what the manager starts stays below this child until it ends
    sock = socket.socket(fileno=int(os.environ.pop(RESOURCE_RUNNER_FD_ENV)))
    sock.setblocking(True)
    channel = _Channel(sock)
    try:
        channel.send(RunnerReadyForPass().to_wire())
        frame = channel.read()
        if frame is None:
            return EXIT_BAD_START
        start = PassStart.from_wire(frame)
        host = ChannelHost(
            channel.ask,
            Path(start.project_path) if start.project_path else Path.cwd(),
            Path(start.agent_dir) if start.agent_dir else agent_dir(),
        )
        outcome = run_pass(start, host)
        crash_point("runner.reconcile.before_result")
        channel.send(outcome.to_wire())
        return 0
    except (FrameError, ProtocolViolation, OSError):
        traceback.print_exc()
        return EXIT_BAD_START
    finally:
        stop_descendants()
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
