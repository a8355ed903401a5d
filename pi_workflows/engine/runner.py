"""The runner process (`python -m pi_workflows.engine.runner`): one run generation.

Implements workflow-server.md § Runner lifecycle, runner side: no database handle; every
change is a message that waits for the server's reply. The work is in `_channel`,
`_execution`, `_nodes`, `_agent_step`, `_effects`, `_shell` and `_values`."""

from __future__ import annotations

import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Final, NoReturn

from pi_workflows.engine._channel import Channel, ClaimLost, Refused
from pi_workflows.engine._errors import SourceChangedError
from pi_workflows.engine._execution import Execution
from pi_workflows.engine._failures import short_text
from pi_workflows.engine._limits import (
    MEMORY_ENV,
    PROCESSES_ENV,
    Limits,
    NodeGuard,
    default_limits,
)
from pi_workflows.engine._loader import load_verified
from pi_workflows.engine._shell import (
    AGENT_DIR_ENV,
    EFFECT_KEY_ENV,
    LAUNCH_ENV,
    RUN_ID_ENV,
    RUNNER_FD_ENV,
    STATE_DIR_ENV,
)
from pi_workflows.supervision import (
    become_subreaper,
    crash_point,
    set_process_name,
    stop_descendants,
)
from pi_workflows.wire.protocol import decode_launch_envelope
from pi_workflows.wire.runner import (
    DEFAULT_MAX_VALUE_BYTES,
    MAX_VALUE_ENV,
    RunnerAddress,
    RunnerReady,
    RunParked,
    max_value_bytes,
)

__all__ = [
    "AGENT_DIR_ENV",
    "EFFECT_KEY_ENV",
    "LAUNCH_ENV",
    "RUNNER_FD_ENV",
    "RUNNER_PROCESS_NAME",
    "RUN_ID_ENV",
    "STATE_DIR_ENV",
    "main",
]

RUNNER_PROCESS_NAME: Final = "piw-runner"
EXIT_CLAIM_LOST: Final = 3
EXIT_PROTOCOL: Final = 4


def main() -> int:
    """Run one generation; the exit code is for logs only (the server decides outcomes)."""
    sys.stdout = sys.stderr  # workflow prints must never reach a protocol stream
    set_process_name(RUNNER_PROCESS_NAME)
    # Whatever a node starts stays below this process, even after `setsid`, until the
    # node's end stops it (and the zygote, a subreaper too, if this process dies first).
    become_subreaper()
    defaults = _server_default_limits()
    NodeGuard.before_load(defaults)
    # Taken out of the environment once read: workflow code, and any process it starts,
    # never sees the launch envelope, the channel's descriptor or the agent folder.
    envelope = decode_launch_envelope(os.environ.pop(LAUNCH_ENV).encode("utf-8"))
    sock = socket.socket(fileno=int(os.environ.pop(RUNNER_FD_ENV)))
    sock.setblocking(True)
    address = RunnerAddress(envelope["runId"], envelope["generation"], envelope["runnerEpoch"])
    channel = Channel(sock, address, _value_cap())
    project = Path(envelope["projectPath"]) if envelope["projectPath"] else None
    agent_value = os.environ.pop(AGENT_DIR_ENV, "")
    agent_dir = Path(agent_value) if agent_value else None
    state_value = os.environ.pop(STATE_DIR_ENV, "")
    state_dir = Path(state_value) if state_value else None
    try:
        try:
            loaded = load_verified(envelope["workflowSource"], project=project, agent_dir=agent_dir)
        except SourceChangedError as exc:
            channel.send(RunParked(reason="workflowSourceChanged", detail=short_text(exc)))
            return 0
        if loaded.digest != envelope["definitionDigest"]:
            detail = "the definition digest changed"
            channel.send(RunParked(reason="workflowSourceChanged", detail=detail))
            return 0
        crash_point("runner.ready.before_send")
        channel.send(RunnerReady(protocol_version=1, definition_digest=loaded.digest))
        command, state = channel.wait_command()
        parent = command.payload.parent_attempt_id
        answered = parent if isinstance(parent, str) else None
        if answered is None and command.command == "continue" and state.finished:
            answered = state.finished[-1].attempt_id  # the answered checkpoint comes last
        guard = NodeGuard((node.limits for node in loaded.compiled.nodes.values()), defaults)
        Execution(
            channel,
            loaded.compiled,
            address.run_id,
            state,
            answered_checkpoint=answered,
            guard=guard,
            state_dir=state_dir,
            pi_agent_dir=agent_dir,
        ).run()
        return 0
    except ClaimLost:
        return EXIT_CLAIM_LOST
    except Refused:
        traceback.print_exc()
        return EXIT_PROTOCOL
    finally:
        stop_descendants()  # nothing a node started outlives its runner


def _server_default_limits() -> Limits:
    """The server's default limits, taken out of the environment like the launch's."""
    try:
        limits = default_limits()
    except ValueError:  # the server checked them at start; a hand-made launch may not
        limits = Limits()
    for name in (MEMORY_ENV, PROCESSES_ENV):
        os.environ.pop(name, None)
    return limits


def _value_cap() -> int:
    """The value cap the server enforces (it passed its own environment, checked)."""
    try:
        cap = max_value_bytes()
    except ValueError:  # the server checked it at start; a hand-made launch may not
        cap = DEFAULT_MAX_VALUE_BYTES
    os.environ.pop(MAX_VALUE_ENV, None)
    return cap


def _exit(code: int) -> NoReturn:
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
