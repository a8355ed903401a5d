"""One headless `pi --mode rpc` child: which binary, its argv and environment, RPC, stop.

Implements the engine-independent part of issue 12 § Headless Pi children, following
pi-rpc.md (tested against `@mariozechner/pi-coding-agent` 0.73.1). Nothing here logs:
prompts, tool arguments and provider errors pass through, and no exception names them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import psutil

from pi_workflows._paths import agent_dir as default_agent_dir
from pi_workflows.errors import PiWorkflowsError
from pi_workflows.pi import PI_BINARY_ENV
from pi_workflows.supervision import (
    Descendant,
    ProcessIdentity,
    end_descendants,
    identity_of,
    is_alive,
    keeper_argv,
    snapshot_descendants,
    terminate_then_kill,
)

__all__ = [
    "ABORT_GRACE_S",
    "EOF_GRACE_S",
    "PI_BINARY_ENV",
    "TERM_GRACE_S",
    "PiChild",
    "PiExited",
    "PiLaunch",
    "PiOptions",
    "PiRpcError",
    "PiTimeout",
    "PiUnavailable",
    "StopReport",
    "ToolExecution",
    "TurnOutcome",
    "pi_argv",
    "pi_environment",
    "resolve_pi_binary",
    "tool_texts",
]


ABORT_GRACE_S = 3.0
"""How long a busy pi gets to answer `abort` (the snapshot's RPC abort grace)."""

EOF_GRACE_S = 3.0
"""How long an idle pi gets to exit after stdin closes (0.1-0.2 s measured, unloaded)."""

TERM_GRACE_S = 3.0
"""How long pi and its tools get after SIGTERM before SIGKILL (pi-rpc.md § 7)."""

MAX_ERROR_TEXT = 2000
"""Provider error messages are kept, bounded, for the run view; never logged."""

_CHILD_FIXED_ENV = {
    "PI_OFFLINE": "1",  # no version check, no package resolution, no tool downloads
    "PI_SKIP_VERSION_CHECK": "1",
    "PI_TELEMETRY": "0",
    "NO_COLOR": "1",
}

_ISOLATION_FLAGS = (
    "--mode",
    "rpc",
    "--no-session",
    "--offline",
    "--no-extensions",  # explicit -e paths still load
    "--no-skills",
    "--no-prompt-templates",
    "--no-themes",
    "--no-context-files",
)

WORKFLOW_TOOL = "workflow"
"""The tool the bridge extension registers."""


class PiUnavailable(PiWorkflowsError):  # noqa: N818 - the failure code, piUnavailable
    """No usable `pi` binary: `PI_WORKFLOWS_PI` names none, and none is on PATH."""

    code = "piUnavailable"


class PiExited(PiWorkflowsError):  # noqa: N818 - what happened, as the runner reports it
    """pi ended (its stdout closed) while the caller still expected an answer."""

    code = "piExited"

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


class PiRpcError(PiWorkflowsError):
    """pi answered a command with `success: false` (its bounded error text is kept)."""

    code = "piRpcError"


class PiTimeout(PiWorkflowsError, TimeoutError):  # noqa: N818 - beside PiExited
    """pi did not reach the awaited point within the caller's time."""

    code = "piTimeout"


# ---------------------------------------------------------------------------
# Which binary, which argv, which environment


def resolve_pi_binary(environ: Mapping[str, str]) -> Path:
    """Return the absolute path of the `pi` binary to run.

    `PI_WORKFLOWS_PI` is either a path (absolute, or relative to the current folder) or
    a bare name looked up on `PATH`; when it is unset or empty, `pi` is looked up on
    `PATH`. The npm-installed binary is `node_modules/.bin/pi`: point the variable at it.

    Raises:
        PiUnavailable: nothing executable is found; the message names both ways to fix it.
    """
    configured = environ.get(PI_BINARY_ENV, "").strip()
    search_path = environ.get("PATH", "")
    if configured:
        if os.sep in configured:
            candidate = Path(configured).expanduser().absolute()
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        else:
            found = shutil.which(configured, path=search_path)
            if found:
                return Path(found).absolute()
        raise PiUnavailable(
            f"pi is unavailable: {PI_BINARY_ENV} is set but names no executable file; "
            f"point {PI_BINARY_ENV} at the pi binary (e.g. node_modules/.bin/pi), "
            "or unset it and put pi on PATH"
        )
    found = shutil.which("pi", path=search_path)
    if found:
        return Path(found).absolute()
    raise PiUnavailable(
        f"pi is unavailable: {PI_BINARY_ENV} is not set and no pi is on PATH; install "
        "@mariozechner/pi-coding-agent (npm) and set "
        f"{PI_BINARY_ENV} to its bin/pi, or put pi on PATH"
    )


def _needs_node(binary: Path) -> bool:
    """True if the binary is a script run by `node` (npm's bin/pi is `#!/usr/bin/env node`)."""
    try:
        with binary.open("rb") as handle:
            first = handle.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"node" in first


@dataclass(frozen=True, slots=True)
class PiOptions:
    """What an agent node chooses about its model and tools (None: pi's own settings)."""

    provider: str | None = None
    model: str | None = None
    thinking: str | None = None
    """off, minimal, low, medium, high or xhigh."""
    tools: tuple[str, ...] | None = None
    """Allow-list of pi tools (`read`, `bash`, ...); `workflow` is always added. None:
    pi's default built-in tools plus `workflow`; empty: only `workflow`."""


def pi_argv(binary: Path, bridge: Path, options: PiOptions = PiOptions()) -> list[str]:
    """The argv of a headless, isolated pi child that loads only the bridge extension."""
    argv = [str(binary), *_ISOLATION_FLAGS, "-e", str(bridge)]
    if options.provider:
        argv += ["--provider", options.provider]
    if options.model:
        argv += ["--model", options.model]
    if options.thinking:
        argv += ["--thinking", options.thinking]
    if options.tools is not None:
        if options.tools:
            allowed = [*dict.fromkeys([*options.tools, WORKFLOW_TOOL])]
            argv += ["--tools", ",".join(allowed)]
        else:
            argv.append("--no-builtin-tools")
    return argv


def pi_environment(
    environ: Mapping[str, str],
    *,
    agent_dir: Path | None = None,
    tmpdir: Path | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The pi child's environment, built from scratch (nothing else is inherited).

    Args:
        environ: The runner's environment; only `PATH` and `HOME` are read from it.
        agent_dir: Pi's agent dir (`models.json`, `auth.json`, `settings.json`);
            by default `$PI_CODING_AGENT_DIR` of `environ`, else `~/.pi/agent`.
        tmpdir: `TMPDIR` for pi (jiti's compiled-extension cache, bash overflow logs);
            a private folder of the caller's. Unset when None.
        extra: Variables the bridge extension reads (`PI_WORKFLOWS_BRIDGE_CONFIG`).

    No proxy variable is passed: pi routes even loopback requests through one.
    """
    env = {
        "PATH": environ.get("PATH", os.defpath),
        "HOME": environ.get("HOME") or str(Path.home()),
        "PI_CODING_AGENT_DIR": str(agent_dir or default_agent_dir(environ)),
        **_CHILD_FIXED_ENV,
    }
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    for name, value in (extra or {}).items():
        if name in env:
            raise ValueError(f"the pi child's {name} is fixed; it cannot be overridden")
        env[name] = value
    return env


@dataclass(frozen=True, slots=True)
class PiLaunch:
    """Everything needed to start one pi child (immutable; holds no credential)."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)
    cwd: Path
    stderr_path: Path | None = field(default=None, repr=False)
    """pi's stderr (and the bridge's console output) goes here, created 0600; it
    belongs in the user-only state folder. None: discarded."""

    @classmethod
    def build(
        cls,
        *,
        environ: Mapping[str, str],
        bridge: Path,
        cwd: Path,
        options: PiOptions = PiOptions(),
        agent_dir: Path | None = None,
        tmpdir: Path | None = None,
        extra_env: Mapping[str, str] | None = None,
        stderr_path: Path | None = None,
    ) -> PiLaunch:
        """Resolve the binary and assemble argv and environment.

        Raises:
            PiUnavailable: no pi binary, or it is a node script and no node is on PATH.
        """
        binary = resolve_pi_binary(environ)
        env = pi_environment(environ, agent_dir=agent_dir, tmpdir=tmpdir, extra=extra_env)
        if _needs_node(binary) and shutil.which("node", path=env["PATH"]) is None:
            raise PiUnavailable(
                "pi is unavailable: it runs on Node.js and no node is on PATH; "
                "install Node.js >= 20.6"
            )
        return cls(tuple(pi_argv(binary, bridge, options)), env, cwd, stderr_path)


# ---------------------------------------------------------------------------
# What a run of pi produced


@dataclass(frozen=True, slots=True)
class ToolExecution:
    """One tool call pi executed during a run (from `tool_execution_start`/`_end`)."""

    tool_call_id: str
    tool_name: str
    args: Any
    is_error: bool | None = None
    """None while the call had not finished when the run ended."""
    result: Any = None
    """The tool's result (`content`, `details`), as pi reported it."""


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    """How one prompt's run ended (`agent_end`)."""

    stop_reason: str
    """The last assistant message's `stopReason`: stop, toolUse, length, error, aborted."""
    error_message: str | None
    """Its `errorMessage` (bounded), for `error` and `aborted`."""
    tool_executions: tuple[ToolExecution, ...]
    assistant_messages: int

    @property
    def provider_error(self) -> bool:
        return self.stop_reason == "error"

    def workflow_calls(self) -> tuple[ToolExecution, ...]:
        """The calls of the bridge's `workflow` tool, in order."""
        return tuple(t for t in self.tool_executions if t.tool_name == WORKFLOW_TOOL)


@dataclass(frozen=True, slots=True)
class StopReport:
    """How `PiChild.stop` ended the child."""

    how: str
    """`exited` (already gone), `eof`, `sigterm` or `sigkill`."""
    returncode: int
    aborted: bool
    """An `abort` was sent because pi was busy."""
    leftovers: int
    """Tool processes still alive after pi and that had to be ended separately."""
    survivors: tuple[Descendant, ...] = ()
    """Processes that outlived even SIGKILL (normally none)."""


# ---------------------------------------------------------------------------
# The child and its RPC client

_EOF = object()


class PiChild:
    """A running `pi --mode rpc` child and a synchronous client for its RPC stream.

    The protocol is one JSON object per `\\n`-terminated line each way; responses carry
    the command's `id`, events never do. A run is done at `agent_end`, and a provider
    failure still gets `success: true` for the prompt, then `stopReason: "error"`.
    A reader thread parses stdout: responses are filed by command id, events queue up
    for `next_event` / `run_turn`, and `agent_start`/`agent_end` track whether pi is
    busy. `stop` may be called from another thread while `run_turn` waits.

    Lifecycle for an agent step: `spawn` → register the direct child (`pid`,
    `identity`) with the server → `wait_ready` → `run_turn` (again for reminders) →
    `stop` → unregister.
    """

    def __init__(self, launch: PiLaunch, popen: subprocess.Popen[bytes]) -> None:
        self.launch = launch
        self._popen = popen
        assert popen.stdin is not None and popen.stdout is not None
        self._stdin: IO[bytes] = popen.stdin
        self._stdout: IO[bytes] = popen.stdout
        self.identity: ProcessIdentity = identity_of(popen.pid) or ProcessIdentity(popen.pid, 0, "")
        self._ids = itertools.count(1)
        self._write_lock = threading.Lock()
        self._state = threading.Condition()
        self._responses: dict[str, dict[str, Any]] = {}
        self._events: queue.Queue[Any] = queue.Queue()
        self._busy = False
        self._eof = False
        self._stop_lock = threading.Lock()
        self._stopped: StopReport | None = None
        self._reader = threading.Thread(target=self._read, name="pi-rpc-reader", daemon=True)
        self._reader.start()

    @classmethod
    def spawn(cls, launch: PiLaunch) -> PiChild:
        """Start pi in a new session (its own process group); it waits for commands.

        The process started (`pid`, `identity`, what is registered) is pi's keeper
        (`pi_workflows.supervision._pi_keeper`), a child subreaper in the same group
        whose only child is pi: a tool process that daemonised stays below it, and
        everything below it is ended when pi ends, even if the runner died first.

        pi writes nothing until it answers a command and runs no model turn before a
        prompt, so registering it with the server after this returns loses nothing: if
        the runner dies first, pi reads EOF on stdin and exits while still idle.

        Raises:
            PiUnavailable: the binary vanished or is not executable.
        """
        binary = launch.argv[0]
        if not (Path(binary).is_file() and os.access(binary, os.X_OK)):
            raise PiUnavailable(
                f"pi is unavailable: the binary could not be started; check {PI_BINARY_ENV} "
                "or the pi on PATH"
            )
        stderr: int = subprocess.DEVNULL
        fd = -1
        if launch.stderr_path is not None:
            fd = os.open(launch.stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            stderr = fd
        try:
            # pi runs under its keeper, a child subreaper: whatever its tools leave
            # behind stays below the registered process, and is ended when pi ends.
            popen = subprocess.Popen(
                keeper_argv(list(launch.argv)),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=launch.cwd,
                env=dict(launch.env),
                start_new_session=True,
                close_fds=True,
            )
        except (FileNotFoundError, PermissionError):
            raise PiUnavailable(
                f"pi is unavailable: the binary could not be started; check {PI_BINARY_ENV} "
                "or the pi on PATH"
            ) from None
        finally:
            if fd >= 0:
                os.close(fd)
        return cls(launch, popen)

    # -- state -----------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The direct child's PID, which is also its process group ID."""
        return self._popen.pid

    @property
    def pi_pid(self) -> int | None:
        """pi's own PID (the keeper's one child), None once it is gone; for measuring pi
        (its RSS), never for signalling: `pid` is what is registered and stopped."""
        try:
            children = psutil.Process(self.pid).children()
        except psutil.Error:
            return None
        return children[0].pid if children else None

    @property
    def busy(self) -> bool:
        """True between `agent_start` and `agent_end`."""
        with self._state:
            return self._busy

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    # -- the reader thread -------------------------------------------------------------

    def _read(self) -> None:
        try:
            # Split on b"\n" only: payload strings may hold a raw U+2028, and lines
            # carrying whole messages can be megabytes long.
            for line in self._stdout:
                self._dispatch(line)
        except (OSError, ValueError):
            pass  # stdout closed under us by stop()
        finally:
            with self._state:
                self._eof = True
                self._busy = False
                self._state.notify_all()
            self._events.put(_EOF)

    def _dispatch(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            return  # pi guards stdout; a stray line is not ours to interpret
        if not isinstance(message, dict):
            return
        kind = message.get("type")
        if kind == "response" and isinstance(message.get("id"), str):
            with self._state:
                self._responses[message["id"]] = message
                self._state.notify_all()
            return
        if kind in ("agent_start", "agent_end"):
            with self._state:
                self._busy = kind == "agent_start"
                self._state.notify_all()
        self._events.put(message)

    # -- commands ----------------------------------------------------------------------

    def send(self, command: Mapping[str, Any]) -> str:
        """Write one command (an `id` is added) and return its id without waiting.

        Raises:
            PiExited: pi's stdin is closed.
        """
        command_id = f"piw-{next(self._ids)}"
        line = json.dumps({**command, "id": command_id}, ensure_ascii=False) + "\n"
        with self._write_lock:
            try:
                self._stdin.write(line.encode("utf-8"))
                self._stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                raise PiExited("pi exited before it read the command", self.returncode) from None
        return command_id

    def answer_ui(self, request_id: str, answer: Mapping[str, Any]) -> None:
        """Answer an extension's dialog (`extension_ui_request` `select`, `confirm`,
        `input`, `editor`) with `{"confirmed": true}` and the like (pi-rpc.md § Extension
        UI protocol): its `id` is the request's, not a new command's.

        Raises:
            PiExited: pi's stdin is closed.
        """
        response = {**answer, "type": "extension_ui_response", "id": request_id}
        line = json.dumps(response, ensure_ascii=False) + "\n"
        with self._write_lock:
            try:
                self._stdin.write(line.encode("utf-8"))
                self._stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                raise PiExited("pi exited before it read the answer", self.returncode) from None

    def wait_response(self, command_id: str, timeout: float) -> dict[str, Any]:
        """Wait for the response to one command.

        Raises:
            PiExited: pi ended first. PiTimeout: no response within `timeout`.
        """
        deadline = time.monotonic() + timeout
        with self._state:
            while command_id not in self._responses and not self._eof:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PiTimeout("pi did not answer in time")
                self._state.wait(left)
            response = self._responses.pop(command_id, None)
        if response is None:  # the exit code is awaited outside the lock
            raise PiExited("pi exited before it answered", self._wait_code())
        return response

    def command(self, command: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """Send a command and return its response's `data` (or {}).

        Raises:
            PiRpcError: `success: false`. PiExited, PiTimeout: as `wait_response`.
        """
        response = self.wait_response(self.send(command), timeout)
        if not response.get("success"):
            error = str(response.get("error") or "unknown error")[:MAX_ERROR_TEXT]
            raise PiRpcError(f"pi refused {command.get('type')}: {error}")
        data = response.get("data")
        return data if isinstance(data, dict) else {}

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Wait until pi answers `get_state` (it has loaded the bridge); return the state.

        pi buffers commands sent before it is ready, so this is the readiness probe.
        A bridge that fails to load makes pi exit with code 1 first (`PiExited`).
        """
        return self.command({"type": "get_state"}, timeout)

    def abort(self) -> str:
        """Ask pi to abort its run (it kills a running bash tool's group); don't wait."""
        return self.send({"type": "abort"})

    def next_event(self, timeout: float) -> dict[str, Any]:
        """The next event from pi's stream.

        Raises:
            PiExited: the stream ended. PiTimeout: nothing within `timeout`.
        """
        try:
            item = self._events.get(timeout=max(0.0, timeout))
        except queue.Empty:
            raise PiTimeout("pi sent nothing in time") from None
        if item is _EOF:
            self._events.put(_EOF)  # every later reader sees the end too
            raise PiExited("pi exited during the run", self._wait_code())
        event: dict[str, Any] = item
        return event

    def run_turn(
        self,
        message: str,
        timeout: float,
        *,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> TurnOutcome:
        """Prompt pi and wait for that run's `agent_end`; return how it ended.

        Tool calls are collected from `tool_execution_start`/`_end`. A run that
        ends with a provider error still returns (`stop_reason == "error"`): the caller
        counts it as an unproductive turn.

        Raises:
            PiRpcError: pi refused the prompt (e.g. no model is configured).
            PiTimeout: no `agent_end` within `timeout` (pi is still running: stop it).
            PiExited: pi ended during the run.
        """
        deadline = time.monotonic() + timeout
        self.command({"type": "prompt", "message": message}, timeout)
        return self._collect_run(deadline, on_event)

    def _collect_run(
        self, deadline: float, on_event: Callable[[dict[str, Any]], None] | None
    ) -> TurnOutcome:
        started: dict[str, ToolExecution] = {}
        order: list[str] = []
        while True:
            event = self.next_event(deadline - time.monotonic())
            if on_event is not None:
                on_event(event)
            kind = event.get("type")
            if kind == "tool_execution_start":
                call_id = str(event.get("toolCallId"))
                started[call_id] = ToolExecution(
                    call_id, str(event.get("toolName")), event.get("args")
                )
                order.append(call_id)
            elif kind == "tool_execution_end":
                call_id = str(event.get("toolCallId"))
                begun = started.get(call_id) or ToolExecution(
                    call_id, str(event.get("toolName")), None
                )
                if call_id not in started:
                    order.append(call_id)
                started[call_id] = ToolExecution(
                    begun.tool_call_id,
                    begun.tool_name,
                    begun.args,
                    bool(event.get("isError")),
                    event.get("result"),
                )
            elif kind == "agent_end":
                return _outcome(event, tuple(started[c] for c in order))

    # -- stopping ----------------------------------------------------------------------

    def stop(
        self,
        *,
        abort_grace_s: float = ABORT_GRACE_S,
        eof_grace_s: float = EOF_GRACE_S,
        term_grace_s: float = TERM_GRACE_S,
    ) -> StopReport:
        """Stop pi and every tool process it started; reap pi. Safe to call twice.

        1. Snapshot pi's descendants and their groups (tools run in sessions of their own).
        2. If pi is busy: `abort` (pi kills a running bash tool's group), wait for the
           run to settle.
        3. Close stdin: an idle pi exits 0.
        4. Still running: SIGTERM the group (pi kills the tool groups it tracks), wait,
           then SIGKILL the group.
        5. SIGTERM, then SIGKILL, every snapshotted descendant still alive.
        """
        with self._stop_lock:  # a second caller waits for, and gets, the same report
            if self._stopped is None:
                self._stopped = self._stop(abort_grace_s, eof_grace_s, term_grace_s)
            return self._stopped

    def _stop(self, abort_grace_s: float, eof_grace_s: float, term_grace_s: float) -> StopReport:
        descendants = snapshot_descendants(self.pid)
        aborted = False
        if self.busy and self.returncode is None:
            aborted = self._abort_and_settle(abort_grace_s)
        how = "exited" if self.returncode is not None else "eof"
        self._close_stdin()
        try:
            self._popen.wait(eof_grace_s)
        except subprocess.TimeoutExpired:
            how, late = terminate_then_kill(self._popen, term_grace_s)
            descendants = (*descendants, *late)
        leftovers = sum(1 for d in descendants if is_alive(d.identity))
        survivors = end_descendants(descendants, term_grace_s)
        # A tool that daemonised (`cmd &` whose bash exited, `setsid cmd &`) was
        # re-parented to the keeper, so the snapshot saw it, and the keeper ended it
        # anyway as pi exited. The runner's own `stop_descendants` stays the backstop.
        self._reader.join(timeout=term_grace_s)
        self._stdout.close()
        return StopReport(how, self._popen.returncode, aborted, leftovers, survivors)

    def _abort_and_settle(self, grace_s: float) -> bool:
        deadline = time.monotonic() + grace_s
        try:
            command_id = self.abort()
        except PiExited:
            return False
        with self._state:
            # pi ends the run (agent_end), then answers the abort.
            while command_id not in self._responses and not self._eof:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._state.wait(left)
            self._responses.pop(command_id, None)
        return True

    def _close_stdin(self) -> None:
        # A broken pipe only means pi is already gone.
        with self._write_lock, contextlib.suppress(OSError):
            self._stdin.close()

    def _wait_code(self) -> int | None:
        try:
            return self._popen.wait(EOF_GRACE_S)
        except subprocess.TimeoutExpired:
            return None

    def __enter__(self) -> PiChild:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _outcome(event: Mapping[str, Any], tools: tuple[ToolExecution, ...]) -> TurnOutcome:
    messages = event.get("messages")
    assistant = [
        m
        for m in (messages if isinstance(messages, list) else [])
        if isinstance(m, dict) and m.get("role") == "assistant"
    ]
    last = assistant[-1] if assistant else {}
    error = last.get("errorMessage")
    return TurnOutcome(
        stop_reason=str(last.get("stopReason") or "stop"),
        error_message=str(error)[:MAX_ERROR_TEXT] if error else None,
        tool_executions=tools,
        assistant_messages=len(assistant),
    )


def tool_texts(execution: ToolExecution) -> list[str]:
    """The text parts of a tool's result content (what the model saw)."""
    result = execution.result if isinstance(execution.result, dict) else {}
    content = result.get("content")
    return [
        str(part.get("text"))
        for part in (content if isinstance(content, list) else [])
        if isinstance(part, dict) and part.get("type") == "text"
    ]
