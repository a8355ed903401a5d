"""Shell nodes, runner side: one command in its own registered group, its output captured.

Implements workflow-server.md § Shell nodes: the command waits at a gate until its group
is registered with the server, its stdout and stderr are read as they come and capped,
its exit (not its pipes) ends the wait, and its result always fits what can carry it.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Final

from pi_workflows.engine._channel import Channel
from pi_workflows.supervision import (
    CRASH_ENV,
    CRASH_ONCE_ENV,
    identity_of,
    open_pidfd,
    signal_popen_group,
)
from pi_workflows.supervision.zygote import CONTROL_FD_ENV
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.runner import (
    DEFAULT_MAX_VALUE_BYTES,
    MAX_VALUE_ENV,
    ProcessRegister,
    ProcessUnregister,
)

__all__ = [
    "AGENT_DIR_ENV",
    "EFFECT_KEY_ENV",
    "LAUNCH_ENV",
    "RUNNER_FD_ENV",
    "RUNNER_PRIVATE_ENV",
    "RUN_ID_ENV",
    "SHELL_EFFECT_TYPE",
    "SHELL_OUTPUT_BUDGET",
    "STATE_DIR_ENV",
    "fit_shell_output",
    "register_process",
    "run_shell",
    "shell_budget",
    "shell_environment",
    "unregister_process",
]

LAUNCH_ENV: Final = "PI_WORKFLOWS_LAUNCH"
RUNNER_FD_ENV: Final = "PI_WORKFLOWS_RUNNER_FD"
AGENT_DIR_ENV: Final = "PI_WORKFLOWS_AGENT_DIR"
STATE_DIR_ENV: Final = "PI_WORKFLOWS_STATE_DIR"
EFFECT_KEY_ENV: Final = "PI_WORKFLOWS_EFFECT_KEY"
"""The environment variable that gives a shell command its effect's idempotency key."""
RUN_ID_ENV: Final = "PI_WORKFLOWS_RUN_ID"
"""The environment variable that gives a shell command the ID of its run."""
SHELL_EFFECT_TYPE: Final = "shell"
SHELL_GRACE_S: Final = 5.0


def run_shell(
    argv: list[str],
    timeout_ms: int | None,
    max_output: int,
    channel: Channel | None = None,
    *,
    effect_key: str | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Run one command in its own group with capped output and SIGTERM→SIGKILL timeout.

    The group is registered with the server (`process.register`) while it runs, so a
    runner that is killed or cancelled cannot leave the command running behind it. The
    command's environment is `shell_environment(effect_key, run_id)`. At most
    `max_output` bytes of each of stdout and stderr are kept as they are read (the rest
    is counted, never held); the command's exit ends the wait (see `_capture`).
    """
    # The command waits at a gate until its group is registered, so no instant exists in
    # which the runner could die (or the server stop) and leave an unregistered command
    # running. `sh` holds the gate and then execs the command in place: same PID, same
    # start identity. If the runner dies first, the gate closes empty and nothing runs.
    gate_r, gate_w = os.pipe()
    try:
        child = subprocess.Popen(
            ["/bin/sh", "-c", _GATE_SCRIPT, "piw-gate", *argv],
            stdin=gate_r,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=shell_environment(effect_key, run_id),
        )
    except BaseException:
        os.close(gate_w)
        raise
    finally:
        os.close(gate_r)
    try:
        registration = register_process(channel, child.pid)
        os.write(gate_w, b"go\n")
    finally:
        os.close(gate_w)
    budget = shell_budget(channel.max_value_bytes if channel else DEFAULT_MAX_VALUE_BYTES)
    # No stream keeps more than half the budget, whatever `max_output_bytes` says: more
    # could never be reported.
    cap = max(0, min(max_output, budget // 2))
    try:
        captured = _capture(child, None if timeout_ms is None else timeout_ms / 1000, cap)
    finally:
        if child.returncode is None:  # the runner is failing: never leave the group behind
            signal_popen_group(child, signal.SIGKILL)
            child.wait()
        unregister_process(channel, registration)
    code = child.returncode
    out, err = captured.stdout, captured.stderr
    return fit_shell_output(
        {
            "exitCode": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "timedOut": captured.timed_out,
            "stdout": bytes(out.kept).decode("utf-8", "replace"),
            "stderr": bytes(err.kept).decode("utf-8", "replace"),
            "stdoutTruncatedBytes": out.dropped,
            "stderrTruncatedBytes": err.dropped,
            "truncated": out.dropped > 0 or err.dropped > 0,
        },
        budget,
    )


RUNNER_PRIVATE_ENV = frozenset(
    {
        LAUNCH_ENV,
        RUNNER_FD_ENV,
        AGENT_DIR_ENV,
        STATE_DIR_ENV,
        CONTROL_FD_ENV,
        CRASH_ENV,
        CRASH_ONCE_ENV,
        MAX_VALUE_ENV,
    }
)
"""Variables pi-workflows uses to start and test its own processes: a shell command
never sees them (the launch envelope names the run, its epoch and the project)."""


def shell_environment(effect_key: str | None, run_id: str | None) -> dict[str, str]:
    """The environment of a shell command: the runner's own, without `RUNNER_PRIVATE_ENV`,
    with `PI_WORKFLOWS_EFFECT_KEY` and `PI_WORKFLOWS_RUN_ID` when given."""
    env = {key: value for key, value in os.environ.items() if key not in RUNNER_PRIVATE_ENV}
    if effect_key is not None:
        env[EFFECT_KEY_ENV] = effect_key
    if run_id is not None:
        env[RUN_ID_ENV] = run_id
    return env


SHELL_DRAIN_S = 0.5
"""After a command exits, how long its pipes are still read. What it wrote is already in
them; a background process that keeps them open cannot hold the result any longer."""
SHELL_POLL_S = 0.05
"""How often the exit is polled where no pidfd tells it (not Linux)."""
SHELL_READ_BYTES = 256 * 1024


@dataclass
class _Stream:
    """One captured pipe: its first `cap` bytes are kept, the rest only counted."""

    cap: int
    kept: bytearray = field(default_factory=bytearray)
    total: int = 0

    def take(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += data[:room]

    @property
    def dropped(self) -> int:
        return self.total - len(self.kept)


@dataclass
class _Captured:
    stdout: _Stream
    stderr: _Stream
    timed_out: bool = False


def _capture(child: subprocess.Popen[bytes], timeout_s: float | None, cap: int) -> _Captured:
    """Read the command's stdout and stderr as they come until it has exited and its
    pipes are drained (end of file, or `SHELL_DRAIN_S` after the exit); time it out.

    The command's exit is the process's exit, not the closing of its pipes: a
    background process that keeps stdout open neither holds the result nor makes the
    command time out. Memory stays at `cap` per stream plus one read.
    """
    assert child.stdout is not None and child.stderr is not None
    captured = _Captured(_Stream(cap), _Stream(cap))
    streams = {child.stdout.fileno(): captured.stdout, child.stderr.fileno(): captured.stderr}
    selector = selectors.DefaultSelector()
    exit_fd = open_pidfd(child.pid)
    try:
        for fd in streams:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        if exit_fd is not None:
            selector.register(exit_fd, selectors.EVENT_READ)
        clock = _ShellClock(child, timeout_s, polled=exit_fd is None)
        while True:
            reading = any(fd in streams for fd in selector.get_map())
            wait = clock.advance(captured, reading=reading)
            if wait is None:
                return captured
            for key, _ in selector.select(wait):
                if key.fd == exit_fd:
                    selector.unregister(exit_fd)  # exited: the clock's `poll` reaps it
                elif not _read_into(key.fd, streams[key.fd]):
                    selector.unregister(key.fd)
    finally:
        selector.close()
        if exit_fd is not None:
            os.close(exit_fd)
        child.stdout.close()
        child.stderr.close()


def _read_into(fd: int, stream: _Stream) -> bool:
    """Read what is there into `stream`; False at end of file."""
    try:
        data = os.read(fd, SHELL_READ_BYTES)
    except BlockingIOError:
        return True
    stream.take(data)
    return bool(data)


class _ShellClock:
    """The deadlines of one command: its timeout (SIGTERM to the group, SIGKILL after
    `SHELL_GRACE_S`) and, once it exited, how long its pipes are still read."""

    def __init__(
        self, child: subprocess.Popen[bytes], timeout_s: float | None, *, polled: bool
    ) -> None:
        self._child = child
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._kill_at: float | None = None
        self._drain_until: float | None = None
        self._polled = polled

    def advance(self, captured: _Captured, *, reading: bool) -> float | None:
        """Act on what is due; the seconds to wait for the pipes, or None when done."""
        now = time.monotonic()
        if self._drain_until is None and self._child.poll() is not None:
            self._drain_until = now + SHELL_DRAIN_S
        if self._drain_until is not None and (not reading or now >= self._drain_until):
            return None
        if self._deadline is not None and now >= self._deadline:
            captured.timed_out = True
            signal_popen_group(self._child, signal.SIGTERM)
            self._deadline, self._kill_at = None, now + SHELL_GRACE_S
        if self._kill_at is not None and now >= self._kill_at:
            signal_popen_group(self._child, signal.SIGKILL)
            self._kill_at = None
        wakes = [t for t in (self._deadline, self._kill_at, self._drain_until) if t is not None]
        if self._drain_until is None and self._polled:
            wakes.append(now + SHELL_POLL_S)
        return max(0.0, min(wakes) - now) if wakes else 60.0


def shell_budget(max_value_bytes: int) -> int:
    """The largest canonical JSON a shell result may have under the value cap. A result
    larger than one runner frame travels by reference (`content.write`), so the budget
    is what the cap lets a reference hold."""
    return max_value_bytes - 64 * 1024


SHELL_OUTPUT_BUDGET: Final = shell_budget(DEFAULT_MAX_VALUE_BYTES)
"""The budget under the default value cap (64 MiB)."""


def fit_shell_output(result: dict[str, Any], budget: int = SHELL_OUTPUT_BUDGET) -> dict[str, Any]:
    """Shorten stdout and stderr (the longer first) until the result's JSON fits `budget`.

    A command that finished has a known result; output that escapes to more JSON than
    a reference holds (NUL bytes become six characters each) is cut, never the result
    itself, so the effect settles instead of failing or becoming ambiguous. The bytes
    cut are added to the stream's `…TruncatedBytes`. The JSON is measured in bounded
    pieces, never built whole here.
    """
    size = _result_json_len(result)
    while size > budget:
        lengths = {name: _json_len(result[name]) for name in ("stdout", "stderr")}
        name = "stdout" if lengths["stdout"] >= lengths["stderr"] else "stderr"
        text = result[name]
        # Cut as many characters as the excess is worth at this text's JSON bytes per
        # character (escapes make it up to six), plus one: a round or two.
        per_char = lengths[name] / max(1, len(text))
        keep = max(0, len(text) - int((size - budget) / per_char) - 1)
        cut = len(text[keep:].encode("utf-8", "replace"))
        dropped = f"{name}TruncatedBytes"
        result = {
            **result,
            name: text[:keep],
            dropped: int(result.get(dropped, 0)) + cut,
            "truncated": True,
        }
        size = _result_json_len(result)
    return result


_MEASURE_CHARS = 1024 * 1024


def _json_len(text: str) -> int:
    """`len(dumps(text))`, measured a megabyte of characters at a time (an escape never
    spans two characters, so the pieces add up)."""
    pieces = range(0, len(text), _MEASURE_CHARS)
    return 2 + sum(len(dumps(text[i : i + _MEASURE_CHARS])) - 2 for i in pieces)


def _result_json_len(result: dict[str, Any]) -> int:
    """`len(dumps(result))`: its other fields, plus each stream's string."""
    rest = len(dumps({**result, "stdout": "", "stderr": ""}))
    return rest + _json_len(result["stdout"]) - 2 + _json_len(result["stderr"]) - 2


_GATE_SCRIPT = 'read -r _ || exit 127; exec "$@" </dev/null'
"""Wait for the runner's go on stdin (sent once the group is registered), then become the
command, its stdin /dev/null. (The gate is stdin, not a numbered descriptor: `dash`
takes only one digit in a redirection.)"""


def register_process(channel: Channel | None, pid: int) -> ProcessRegister | None:
    """Register the group `pid` leads with the server (it is stopped with the run)."""
    identity = identity_of(pid)
    if channel is None or identity is None:
        return None
    registration = ProcessRegister(
        pid=pid,
        process_group_id=pid,
        start_identity=f"{identity.start_ticks}:{identity.boot_id or 'none'}",
    )
    channel.send(registration)
    return registration


def unregister_process(channel: Channel | None, registration: ProcessRegister | None) -> None:
    """Tell the server a registered group ended."""
    if channel is None or registration is None:
        return
    channel.send(
        ProcessUnregister(
            pid=registration.pid,
            process_group_id=registration.process_group_id,
            start_identity=registration.start_identity,
        )
    )
