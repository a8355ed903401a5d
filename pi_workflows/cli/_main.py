"""The `pi-workflows` command group and the `piw` viewer entry point.

Commands parse their arguments, call `WorkflowClient`, render the result and map
errors to exit codes; none opens SQLite. Read commands take `--json` and print one
JSON document on stdout; errors go to stderr as one sentence that says what to do.
The module imports the wire client only: the server, actors, storage and engine load
inside the commands that need them (tests/cli/test_light_imports.py pins it).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import importlib
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, MutableMapping
from functools import wraps
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from pi_workflows._paths import AGENT_DIR_ENV, ensure_private_dir, workflows_dir
from pi_workflows._version import __version__
from pi_workflows.cli._advice import Advice, advice, kind_words, node_kinds, status_words
from pi_workflows.cli._chain import chain_rows, follow_chain
from pi_workflows.errors import PiWorkflowsError
from pi_workflows.wire.client import (
    HostUnavailableError,
    InvalidRequestError,
    PackageMismatchError,
    RequestFailedError,
    WorkflowClient,
    socket_path_for,
)
from pi_workflows.wire.live import DEFAULT_RECONNECT_TIMEOUT_S
from pi_workflows.wire.protocol import ResponseMessage
from pi_workflows.wire.views import is_settled

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_ALREADY_RUNNING = 4
EXIT_STATE = 5
EXIT_TIMEOUT = 6
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 20.0

# The server's defaults that `server run --help` and `server stop` show, copied here so
# that no client command loads the server to print them (test_light_imports pins each
# copy to the server's value).
DEFAULT_DRAIN_S = 30.0
DEFAULT_IDLE_EXIT_S = 600.0
DEFAULT_MAX_WORKERS = 4
IDLE_EXIT_ENV = "PI_WORKFLOWS_IDLE_EXIT_SECONDS"
MAX_WORKERS_ENV = "PI_WORKFLOWS_MAX_WORKERS"
CRASH_ENV = "PI_WORKFLOWS_CRASH"

STATUS_KEYS = (
    "state",
    "epoch",
    "pid",
    "socket",
    "activeRunners",
    "runs",
    "expiredClaims",
    "pendingInteractions",
    "ambiguousEffects",
)

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    click.echo(f"pi-workflows: {message}", err=True)
    sys.exit(code)


def _client_errors(function: F) -> F:
    """Map client errors to one sentence on stderr and an exit code."""

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except HostUnavailableError as exc:
            _fail(str(exc), EXIT_UNAVAILABLE)
        except PackageMismatchError as exc:
            _fail(str(exc), EXIT_UNAVAILABLE)
        except RequestFailedError as exc:
            _fail(f"{exc.outcome}: {exc}", EXIT_FAILED)
        except InvalidRequestError as exc:  # checked before sending: bad input
            _fail(str(exc), EXIT_USAGE)

    return wrapper  # type: ignore[return-value]


def _state_dir(ctx: click.Context) -> Path:
    return Path(ctx.obj["state_dir"])


def _client(ctx: click.Context, *, autostart: bool = True) -> WorkflowClient:
    # Connect (and start a server) at the first request, after its envelope is checked.
    return WorkflowClient(
        _state_dir(ctx),
        client_id=f"cli-{os.getuid()}-{os.getpid()}",
        autostart=autostart,
        connect_on_enter=False,
    )


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, sort_keys=True))


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")


# --- help: defaults, exit codes and environment variables -------------------------------
# Every command's --help ends with the exit codes it can give and the environment variables
# it reads (the tables below, by command path), so a command added in another module is
# documented too: the groups hand their command class to it. Options show their defaults
# through the root context's `show_default`, which every command's context inherits.

EXIT_WORDS = {
    0: "success",
    EXIT_FAILED: "the server refused the request (rejected, conflict, notFound, claimLost, "
    "unavailable)",
    EXIT_USAGE: "bad arguments or input, or an invalid request (checked before sending; "
    "nothing was sent)",
    EXIT_UNAVAILABLE: "no server could be reached or started, or it runs another version",
    EXIT_ALREADY_RUNNING: "another live server holds the lock",
    EXIT_STATE: "the database has another schema digest",
    EXIT_TIMEOUT: "--timeout passed first",
}
CLIENT_EXITS = (0, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE)
COMMAND_EXITS: dict[str, tuple[int, ...]] = {
    "": tuple(EXIT_WORDS),
    "server run": (0, EXIT_FAILED, EXIT_USAGE, EXIT_ALREADY_RUNNING, EXIT_STATE),
    "server start": (0, EXIT_FAILED, EXIT_USAGE),
    "server stop": (0, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE),
    "server status": (0, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE),
    "run start": (*CLIENT_EXITS, EXIT_TIMEOUT),
    "run wait": (*CLIENT_EXITS, EXIT_TIMEOUT),
    "run watch": (*CLIENT_EXITS, EXIT_TIMEOUT),
    "state verify": (*CLIENT_EXITS, EXIT_STATE),
    "workflows list": (0, EXIT_USAGE),
    "debug crash-points": (0, EXIT_USAGE),
    "completion": (0, EXIT_USAGE),
    "pi-extension path": (0, EXIT_USAGE),
    "pi-extension install": (0, EXIT_FAILED, EXIT_USAGE),
    "piw": (0, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_TIMEOUT),
}
"""Exit codes by command path; any other command gives `CLIENT_EXITS`."""
VIEWER_EXITS: dict[str, tuple[int, ...]] = {
    "piw view": (0, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_TIMEOUT),  # `piw RUN_ID`
    "piw serve": (0, EXIT_FAILED, EXIT_USAGE),
}
"""Exit codes of `piw`'s subcommands (the `piw` program is not under `pi-workflows`)."""
EXIT_WORDS_FOR: dict[tuple[str, int], str] = {
    ("server run", EXIT_FAILED): "the server could not start",
    ("server start", 0): "the server is ready, or was already running",
    ("server start", EXIT_FAILED): "the server did not become ready in time, or exited",
    ("server stop", 0): "the server stopped, or none was running",
    ("server stop", EXIT_FAILED): "the server refused, or did not exit in time",
    ("server stop", EXIT_UNAVAILABLE): "the server runs another version, refused the "
    "connection (at its limit), or was lost before it answered (this command never starts "
    "a server)",
    ("server status", 0): "the server is running",
    ("server status", EXIT_FAILED): "the server refused the request (it is stopping)",
    ("server status", EXIT_UNAVAILABLE): "the server is stopped (no server answers), or it "
    "runs another version",
    ("run start", 0): "the run was started (with --wait: it completed)",
    ("run start", EXIT_FAILED): "the server refused the start (rejected: no such workflow, "
    "invalid input, ...), or with --wait the run settled otherwise (failed, cancelled, "
    "waiting, paused, parked, ambiguous)",
    ("run start", EXIT_TIMEOUT): "with --wait: --timeout passed first (the run goes on)",
    ("run wait", 0): "the run completed",
    ("run wait", EXIT_FAILED): "the run settled otherwise (failed, cancelled, waiting, "
    "paused, parked, ambiguous), there is no such run, or the server refused",
    ("run wait", EXIT_UNAVAILABLE): "no server could be reached or started, it runs another "
    "version, or it stayed unreachable past --reconnect-timeout",
    ("run watch", 0): "the run completed",
    ("run watch", EXIT_FAILED): "the run settled otherwise (failed, cancelled, waiting, "
    "paused, parked, ambiguous), there is no such run, or the server refused",
    ("run watch", EXIT_UNAVAILABLE): "no server could be reached or started, it runs "
    "another version, or it stayed unreachable past --reconnect-timeout",
    ("run show", EXIT_FAILED): "no such run, the server refused, content failed "
    "verification, or the run kept changing between pages",
    ("channel reload", EXIT_FAILED): "the server refused the request, or refused "
    "channels.json (readable by others, or not valid): no profile is served",
    ("resource-manager apply", EXIT_FAILED): "the server refused: no such manager, a "
    "manager that does not load, an invalid spec, or a conflict (its file changed since it "
    "was resolved: apply again; an idempotency key reused with another spec)",
    ("resource-manager get", EXIT_FAILED): "no such resource, or the server refused",
    ("resource-manager reconcile", EXIT_FAILED): "no such resource, or the server refused",
    ("resource-manager delete", EXIT_FAILED): "no such resource, or the server refused",
    ("state verify", 0): "consistent",
    ("state verify", EXIT_STATE): "inconsistencies were found",
    ("piw", 0): "the viewer was quit",
    ("piw", EXIT_FAILED): "the server refused or broke the protocol",
    ("piw", EXIT_USAGE): "a bad option: an unknown theme, --once without a RUN_ID, a bad URL",
    ("piw", EXIT_UNAVAILABLE): "no server could be reached or started, or it runs another version",
    ("piw view", 0): "the viewer was quit; with --once: the frame was printed",
    ("piw view", EXIT_FAILED): "there is no such run, or the server refused or broke the protocol",
    ("piw view", EXIT_USAGE): "a bad option: an unknown theme, a bad URL",
    ("piw view", EXIT_UNAVAILABLE): "no server could be reached or started, or it runs "
    "another version",
    ("piw view", EXIT_TIMEOUT): "with --once: no view within --timeout",
    ("piw serve", 0): "stopped by SIGTERM or Ctrl-C",
    ("piw serve", EXIT_FAILED): "the address could not be bound (in use, or not available)",
    ("piw serve", EXIT_USAGE): "--bind is not a loopback HOST:PORT",
    ("pi-extension install", 0): "linked, or already linked",
    ("pi-extension install", EXIT_FAILED): "another file has the link's name",
}


@functools.cache
def env_words() -> dict[str, str]:
    """The environment variables the server reads, and what each means.

    Their names live in the floors that read them, so this loads those modules: it runs
    only to print help.
    """
    from pi_workflows.actors import VALIDATE_TIMEOUT_ENV  # noqa: PLC0415 (help only)
    from pi_workflows.domain import RETENTION_DAYS_ENV  # noqa: PLC0415
    from pi_workflows.engine import MEMORY_ENV, PROCESSES_ENV  # noqa: PLC0415
    from pi_workflows.pi import PI_BINARY_ENV  # noqa: PLC0415
    from pi_workflows.server import BLOB_GRACE_ENV, ZYGOTE_ENV  # noqa: PLC0415
    from pi_workflows.wire import FIRST_FRAME_ENV, MAX_CONNECTIONS_ENV  # noqa: PLC0415
    from pi_workflows.wire.runner import MAX_VALUE_ENV  # noqa: PLC0415

    return {
        AGENT_DIR_ENV: LIGHT_ENV_WORDS[AGENT_DIR_ENV],
        IDLE_EXIT_ENV: f"seconds idle before the server exits (default {DEFAULT_IDLE_EXIT_S:.0f}; "
        "0: never)",
        MAX_WORKERS_ENV: f"runs executing at once (default {DEFAULT_MAX_WORKERS})",
        MAX_CONNECTIONS_ENV: "open client connections (default 512)",
        FIRST_FRAME_ENV: "seconds a new connection has to send its first frame (default 10)",
        PI_BINARY_ENV: "the pi binary for agent steps (default: pi on PATH)",
        VALIDATE_TIMEOUT_ENV: "seconds a submission's validation child may take",
        BLOB_GRACE_ENV: "seconds an unnamed blob is kept before state prune --apply collects it "
        "(default 86400)",
        RETENTION_DAYS_ENV: "days terminal run trees are kept after they finish (default 30; "
        "0: no automatic cleanup)",
        MEMORY_ENV: "default memory limit of a node's processes, in MiB",
        PROCESSES_ENV: "default process limit of a node",
        MAX_VALUE_ENV: "largest value a runner may send (an output, an error), in bytes "
        "(default 67108864: 64 MiB)",
        ZYGOTE_ENV: "0 starts every runner as a cold interpreter",
        CRASH_ENV: LIGHT_ENV_WORDS[CRASH_ENV],
    }


LIGHT_ENV_WORDS = {
    AGENT_DIR_ENV: "Pi's agent directory; the state folder is its workflows/ (default: "
    "~/.pi/agent)",
    CRASH_ENV: "<point>[@<n>] arms one crash point (fault-injection tests)",
    "PIW_CONFIG_PATH": "piw's settings file (default: ~/.config/piw/config.toml)",
    "PIW_THEME": "piw's theme, over the settings file (see --list-themes)",
}
"""The variables that client commands and `piw` read: their help loads no server part."""
SERVER_ENV = ("",)
"""Stands for every variable in `env_words()` (they load only to print help)."""
COMMAND_ENV: dict[str, tuple[str, ...]] = {
    "": SERVER_ENV,
    "server run": SERVER_ENV,
    "server start": SERVER_ENV,
    "debug crash-points": (CRASH_ENV,),
    "piw": ("PIW_CONFIG_PATH", "PIW_THEME", AGENT_DIR_ENV),
    "piw view": ("PIW_CONFIG_PATH", "PIW_THEME", AGENT_DIR_ENV),
    "piw serve": (AGENT_DIR_ENV,),
}
"""Environment variables by command path; any other command reads the agent directory."""
STARTS_NO_SERVER = frozenset(
    {
        "",
        "server run",
        "server start",
        "server stop",
        "server status",
        "piw",
        "workflows list",
        "debug crash-points",
        "completion",
        "pi-extension path",
        "pi-extension install",
    }
)
"""Commands that never start a server on demand (the rest may)."""


def _command_key(ctx: click.Context) -> str:
    """`server status` for `pi-workflows server status`; `` for the root; `piw` and
    `piw serve` for the viewer program."""
    names: list[str] = []
    current: click.Context | None = ctx
    while current is not None and current.parent is not None:
        names.append(current.info_name or "")
        current = current.parent
    if current is not None and current.command.name == "piw":
        return " ".join(["piw", *reversed(names)])
    return " ".join(reversed(names))


def _format_exits_and_env(ctx: click.Context, formatter: click.HelpFormatter) -> None:
    key = _command_key(ctx)
    codes = COMMAND_EXITS.get(key) or VIEWER_EXITS.get(key, CLIENT_EXITS)
    with formatter.section("Exit codes"):
        formatter.write_dl(
            [(str(code), EXIT_WORDS_FOR.get((key, code), EXIT_WORDS[code])) for code in codes]
        )
    env = COMMAND_ENV.get(key, (AGENT_DIR_ENV,))
    if env == SERVER_ENV:
        env = tuple(env_words())
    if env:
        with formatter.section("Environment"):
            words = LIGHT_ENV_WORDS
            if not set(env) <= words.keys():
                words = {**env_words(), **words}
            formatter.write_dl([(name, words[name]) for name in env])
    if key not in STARTS_NO_SERVER and key not in VIEWER_EXITS:
        formatter.write_paragraph()
        formatter.write_text(
            "A server started on demand reads the variables listed by `server run --help`."
        )


class DocumentedCommand(click.Command):
    """A command whose help ends with its exit codes and environment variables."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        _format_exits_and_env(ctx, formatter)


class DocumentedGroup(click.Group):
    """A group that documents itself, its commands and its subgroups the same way.

    A command defined in another module of the command line is named in `lazy` (command
    name → module): the module is imported, and registers its commands here, when the
    command is looked up, or when every command is listed or `commands` is read. So
    `server status` does not pay for `run watch`'s imports.
    """

    command_class = DocumentedCommand
    group_class = type  # subgroups are DocumentedGroups too

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.lazy: dict[str, str] = {}
        self._adding = False
        super().__init__(*args, **kwargs)

    @property
    def commands(self) -> dict[str, click.Command]:
        if not self._adding:  # a module being loaded registers a command
            self._load(*self.lazy)
        return self._registered

    @commands.setter
    def commands(self, value: MutableMapping[str, click.Command]) -> None:
        self._registered = dict(value)

    def loaded_commands(self) -> dict[str, click.Command]:
        """The commands registered so far (loads no module)."""
        return self._registered

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        self._adding = True
        try:
            super().add_command(cmd, name)
        finally:
            self._adding = False

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._load(cmd_name)
        return self._registered.get(cmd_name)

    def _load(self, *names: str) -> None:
        modules = {self.lazy.pop(name) for name in names if name in self.lazy}
        for module in sorted(modules):
            importlib.import_module(module)
        if modules:
            from pi_workflows.cli._completion import install_completion  # noqa: PLC0415

            install_completion(main)  # the new commands' run IDs and workflow names

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        if ctx.parent is None:  # the root lists every code; a group points to its commands
            _format_exits_and_env(ctx, formatter)
        else:
            formatter.write_paragraph()
            formatter.write_text("Each command's --help lists its exit codes and environment.")


def lazy_commands(group: click.Group, modules: dict[str, str]) -> None:
    """Name the modules that register `group`'s commands (command name → module)."""
    assert isinstance(group, DocumentedGroup)
    group.lazy.update(modules)


@click.group(
    cls=DocumentedGroup,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
@click.version_option(__version__, prog_name="pi-workflows")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Workflow state folder (default: $PI_CODING_AGENT_DIR/workflows, else "
    "~/.pi/agent/workflows).",
)
@click.pass_context
def main(ctx: click.Context, state_dir: Path | None) -> None:
    """Durable, crash-correct workflows for the Pi coding agent.

    Example: pi-workflows server status --json
    """
    ctx.ensure_object(dict)
    ctx.obj["state_dir"] = (state_dir or workflows_dir()).absolute()


# --- server ---------------------------------------------------------------------------


@main.group()
def server() -> None:
    """Start, stop and inspect the workflow server.

    Example: pi-workflows server start
    """


@server.command("run")
@click.option(
    "--idle-exit",
    type=float,
    default=None,
    help=f"Seconds idle before exiting; 0 never (default: ${IDLE_EXIT_ENV}, else "
    f"{DEFAULT_IDLE_EXIT_S:.0f}).",
)
@click.option(
    "--max-workers",
    type=int,
    default=None,
    help=f"Runs executing at once (default: ${MAX_WORKERS_ENV}, else {DEFAULT_MAX_WORKERS}).",
)
@click.option("--ready-fd", type=int, default=None, hidden=True)
@click.option("--detached", is_flag=True, default=False, hidden=True)
@click.option(
    "--execute/--no-execute",
    default=True,
    help="Launch runners for admitted runs (--no-execute only records them, for tests).",
)
@click.pass_context
def server_run(
    ctx: click.Context,
    *,
    idle_exit: float | None,
    max_workers: int | None,
    ready_fd: int | None,
    detached: bool,
    execute: bool,
) -> None:
    """Run the server attached to this terminal until stopped.

    Example: pi-workflows server run --idle-exit 600
    """
    # The one command that hosts the server: it alone loads it.
    from pi_workflows.server import (  # noqa: PLC0415
        ServerStartError,
        WorkflowServer,
        redirect_output,
    )
    from pi_workflows.storage import SchemaMismatchError  # noqa: PLC0415
    from pi_workflows.supervision import ServerAlreadyRunningError  # noqa: PLC0415

    if detached:  # started by `server start`: stdout and stderr are logs/server.out
        redirect_output(_state_dir(ctx) / "logs" / "server.out")
    if idle_exit is None:
        raw = os.environ.get(IDLE_EXIT_ENV, "").strip()
        try:
            idle_exit = float(raw) if raw else DEFAULT_IDLE_EXIT_S
        except ValueError:
            _fail(f"{IDLE_EXIT_ENV} must be a number of seconds, not {raw!r}", EXIT_USAGE)
    try:
        instance = WorkflowServer(
            _state_dir(ctx),
            max_workers=max_workers,
            idle_exit_s=idle_exit or None,
            execute_runs=execute,
        )
        instance.start()
    except ServerAlreadyRunningError as exc:
        _fail(str(exc), EXIT_ALREADY_RUNNING)
    except SchemaMismatchError as exc:
        _fail(str(exc), EXIT_STATE)
    except (ServerStartError, PiWorkflowsError, OSError) as exc:
        _fail(f"the server could not start: {exc}", EXIT_FAILED)
    _install_signal_handlers(instance)
    if ready_fd is not None:
        os.write(ready_fd, f"ready {instance.epoch}\n".encode())
        os.close(ready_fd)
    else:
        click.echo(f"pi-workflows server running (epoch {instance.epoch}); Ctrl+C stops it")
    while not instance.wait(1.0):
        pass
    if ready_fd is None:
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            click.echo(f"pi-workflows server stopped: {instance.stop_reason}")


def _install_signal_handlers(instance: Any) -> None:
    import pykka.debug  # noqa: PLC0415 (the server's actors are loaded by now)

    def on_signal(signum: int, frame: object) -> None:
        instance.stop_async(f"signal {signal.Signals(signum).name}")

    # SIGHUP (a closed terminal, or `kill -HUP`) stops gracefully like SIGTERM: there is
    # no configuration to reload, and a hang-up must not kill runs mid-step.
    signal.signal(signal.SIGHUP, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGUSR1, pykka.debug.log_thread_tracebacks)


def _reachable(ctx: click.Context) -> bool:
    client = _client(ctx, autostart=False)
    try:
        client.connect()
    except (HostUnavailableError, PackageMismatchError, OSError):
        return False
    client.close()
    return True


@server.command("start")
@click.option(
    "--timeout",
    type=float,
    default=START_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for the ready handshake.",
)
@click.pass_context
def server_start(ctx: click.Context, timeout: float) -> None:
    """Start a detached server and return once it is ready.

    Example: pi-workflows server start
    """
    if _reachable(ctx):
        click.echo("pi-workflows server is already running")
        return
    state_dir = _state_dir(ctx)
    logs = state_dir / "logs"
    ensure_private_dir(logs)
    read_end, write_end = os.pipe()
    out_fd = _open_server_out(logs / "server.out")
    try:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pi_workflows.cli",
                "--state-dir",
                str(state_dir),
                "server",
                "run",
                "--ready-fd",
                str(write_end),
                "--detached",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out_fd,
            stderr=out_fd,
            pass_fds=(write_end,),
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(write_end)
        os.close(out_fd)
    try:
        line = _read_ready(read_end, timeout)
    finally:
        os.close(read_end)
    if line.startswith("ready"):
        click.echo(f"pi-workflows server started (epoch {line.split()[1]})")
        return
    if child.poll() is None:
        child.kill()
        _fail(f"the server did not become ready within {timeout:.0f} s; see {logs / 'server.out'}")
    if child.returncode == EXIT_ALREADY_RUNNING and _reachable(ctx):
        click.echo("pi-workflows server is already running")
        return
    _fail(f"the server exited during start: {_last_line(logs / 'server.out')}")


def _open_server_out(path: Path) -> int:
    """A fresh `server.out`; the previous server's is kept as `server.out.1`.

    The detached server bounds it while it runs (`redirect_output`), so the pair holds
    at most this start's output and the previous one's, each under OUTPUT_FILE_BYTES.
    """
    with contextlib.suppress(OSError):
        if path.stat().st_size > 0:
            path.replace(path.with_name(path.name + ".1"))
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)


def _read_ready(fd: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            break
        chunk = os.read(fd, 256)
        if not chunk:
            break
        data += chunk
    return data.decode("ascii", "replace").strip()


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text("utf-8", "replace").strip().splitlines()
    except OSError:
        return "no output"
    return (lines[-1] if lines else "no output")[:300]


@server.command("stop")
@click.option(
    "--drain",
    "drain_s",
    type=click.FloatRange(0, 3600),
    default=DEFAULT_DRAIN_S,
    show_default=True,
    help="Seconds an applying effect or running shell command may take to settle.",
)
@click.option(
    "--timeout",
    type=float,
    default=None,
    help=f"Seconds to wait for the exit (default: --drain plus {STOP_TIMEOUT_S:.0f}).",
)
@click.pass_context
@_client_errors
def server_stop(ctx: click.Context, drain_s: float, timeout: float | None) -> None:
    """Stop the server gracefully.

    It stops admitting work, lets each run reach its next durable boundary (an
    applying effect or running shell command may settle within --drain seconds), hands
    the runs back for the next server, and exits after in-flight commands have their
    receipts. Only an effect still applying when the drain ends becomes ambiguous.

    Example: pi-workflows server stop --drain 60
    """
    pid = _server_pid(_state_dir(ctx))
    client = _client(ctx, autostart=False)
    try:
        client.connect()
    except HostUnavailableError as exc:
        if exc.server_answered:  # a live server refused this connection (at its cap)
            raise
        click.echo("pi-workflows server is not running")
        return
    with client:
        client.call("server.stop", {"drainSeconds": drain_s})
    if pid is not None:
        import psutil  # noqa: PLC0415 (only to wait for the exit)

        limit = timeout if timeout is not None else drain_s + STOP_TIMEOUT_S
        try:
            psutil.Process(pid).wait(limit)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:
            _fail(f"the server did not stop within {limit:.0f} s")
    click.echo("pi-workflows server stopped")


def _server_pid(state_dir: Path) -> int | None:
    try:
        text = (state_dir / "host" / "server.lock").read_text("ascii").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


@server.command("status")
@json_option
@click.pass_context
@_client_errors
def server_status(ctx: click.Context, as_json: bool) -> None:
    """Show whether the server runs: its state, epoch, PID and safe counts (no IDs, paths
    or payloads).

    When no server answers it says the server is stopped (`{"running": false, ...}` with
    --json) and exits 3; it never starts one.

    Example: pi-workflows server status --json
    """
    client = _client(ctx, autostart=False)
    try:
        with client:
            status = client.call("server.status")["receipt"]
    except HostUnavailableError as exc:
        if exc.server_answered:  # a live server refused this connection (at its cap)
            raise
        _echo_stopped(as_json)
        sys.exit(EXIT_UNAVAILABLE)
    status = {"running": True, **{key: status[key] for key in STATUS_KEYS}}
    if as_json:
        _print_json(status)
        return
    runs = status["runs"]
    click.echo(
        f"state: {status['state']}  epoch: {status['epoch']}  pid: {status['pid']}  "
        f"socket: {status['socket']}"
    )
    click.echo(
        f"runs: {runs['queued']} queued, {runs['running']} running, "
        f"{runs['parked']} parked, {runs['waiting']} waiting; "
        f"active runners: {status['activeRunners']}"
    )
    click.echo(
        f"expired claims: {status['expiredClaims']}  pending interactions: "
        f"{status['pendingInteractions']}  ambiguous effects: {status['ambiguousEffects']}"
    )


def _echo_stopped(as_json: bool) -> None:
    """No server answers: say so (counts would be a guess; only the server reads SQLite)."""
    if as_json:
        _print_json({"running": False, "state": "stopped"})
        return
    click.echo(
        "pi-workflows server is stopped; `pi-workflows server start` starts it "
        "(commands that need it start it on demand)"
    )


# --- runs -----------------------------------------------------------------------------


@main.group()
def run() -> None:
    """Start and control workflow runs.

    Example: pi-workflows run list
    """


@run.command("start")
@click.argument("name")
@click.option("--input-json", default="{}", help="The run input as a JSON object.")
@click.option(
    "--project",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Project folder whose .pi/workflows/ is searched first (default: the current one).",
)
@click.option(
    "--wait",
    is_flag=True,
    help="Then wait until the run settles, as `run wait` does (its output and exit codes).",
)
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="With --wait: give up waiting after this many seconds (default: never).",
)
@click.option(
    "--reconnect-timeout",
    type=float,
    default=None,
    help="With --wait: seconds the server may stay unreachable (a restart) before exit 3 "
    f"(default: {DEFAULT_RECONNECT_TIMEOUT_S:g}).",
)
@json_option
@click.pass_context
@_client_errors
def run_start(
    ctx: click.Context,
    *,
    name: str,
    input_json: str,
    project: Path | None,
    wait: bool,
    timeout: float | None,
    reconnect_timeout: float | None,
    as_json: bool,
) -> None:
    """Start a run of workflow NAME; print its run ID (--json: the receipt).

    With --wait it then waits as `run wait` does: the run ID is the first line, the
    settled run's line follows (--json: only the settled run view, whose
    lineage.rootRunId is the started run), and the exit code is `run wait`'s.

    Example: pi-workflows run start release --input-json '{"version": "1.2.0"}' --wait
    """
    if not wait and (timeout is not None or reconnect_timeout is not None):
        _fail("--timeout and --reconnect-timeout are for --wait", EXIT_USAGE)
    try:
        workflow_input = json.loads(input_json)
    except json.JSONDecodeError:
        _fail("--input-json is not valid JSON; pass an object such as '{\"n\": 1}'", EXIT_USAGE)
    payload = {
        "workflow": name,
        "input": workflow_input,
        "projectPath": str((project or Path.cwd()).resolve()),
    }
    with _client(ctx) as client:
        try:
            receipt = client.call("run.start", payload)["receipt"]
        except RequestFailedError as exc:
            if exc.code != "workflowNotFound":
                raise
            # The server never echoes the name (its receipt is stored); the user typed
            # it, so their own terminal may show it beside the names that exist.
            _fail(f"{exc.outcome}: workflow {name!r}: {exc}")
    if not wait:
        if as_json:
            _print_json(receipt)
        else:
            click.echo(receipt["runId"])
        return
    if not as_json:
        click.echo(receipt["runId"])  # at once: the run is known while it is waited for
    # Lazily: cli/_run_watch.py registers its commands on this module's groups.
    from pi_workflows.cli._run_watch import wait_and_report  # noqa: PLC0415

    reconnect = DEFAULT_RECONNECT_TIMEOUT_S if reconnect_timeout is None else reconnect_timeout
    wait_and_report(ctx, receipt["runId"], timeout, reconnect, as_json)


def _settled(item: dict[str, Any]) -> bool:
    """True once a run needs nothing more from the server: terminal, waiting or held."""
    return is_settled(item["display"])


@run.command("answer")
@click.argument("run_id")
@click.option("--input-json", required=True, help="The answer as JSON.")
@json_option
@click.pass_context
@_client_errors
def run_answer(ctx: click.Context, run_id: str, input_json: str, as_json: bool) -> None:
    """Answer the checkpoint a run waits at; exactly one continuation run starts.

    Prints the continuation's run ID (--json: the receipt); `run wait` of either run
    waits for the workflow's end.

    Example: pi-workflows run answer run-0123abcd --input-json '{"approved": true}'
    """
    try:
        answer = json.loads(input_json)
    except json.JSONDecodeError:
        _fail(
            "--input-json is not valid JSON; pass a value such as '{\"approved\": true}'",
            EXIT_USAGE,
        )
    with _client(ctx) as client:
        receipt = client.call("run.answer", {"answer": answer}, run_id=run_id)["receipt"]
    if as_json:
        _print_json(receipt)
    else:
        continuation = receipt["continuationRunId"]
        click.echo(f"Answered {run_id}; the workflow continues as {continuation}", err=True)
        click.echo(continuation)


@main.group()
def workflows() -> None:
    """Discover workflow files.

    Example: pi-workflows workflows list
    """


@workflows.command("list")
@click.option(
    "--project",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Project folder whose .pi/workflows/ is searched first (default: the current one).",
)
@json_option
@click.pass_context
def workflows_list(ctx: click.Context, project: Path | None, as_json: bool) -> None:
    """List discovered workflows by command name (files are listed, never imported).

    Example: pi-workflows workflows list --json
    """
    from pi_workflows.engine import discover  # noqa: PLC0415 (lists files, imports none)

    found = discover((project or Path.cwd()).resolve(), _state_dir(ctx).parent)
    rows = [
        {"name": name, "origin": str(source.origin), "path": str(source.path)}
        for name, source in sorted(found.items())
    ]
    if as_json:
        _print_json(rows)
        return
    for row in rows:
        click.echo(f"{row['name']:<24} {row['origin']:<8} {row['path']}")


@run.command("status")
@click.argument("run_id")
@json_option
@click.pass_context
@_client_errors
def run_status(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Show one run; for a run continued after its checkpoint, where the chain is now.

    The chain lines follow the continuations to the last run: its status, reason,
    what to do, and its output once it completed (--json: this run's view only; its
    lineage.continuedBy names the next run).

    Example: pi-workflows run status run-0123abcd
    """
    with _client(ctx) as client:
        receipt = client.call("run.get", run_id=run_id)["receipt"]
        if as_json:
            _print_json(receipt)
            return
        chain = follow_chain(receipt, lambda hop: client.call("run.get", run_id=hop)["receipt"])
    lines = status_lines(receipt, command_prefix(ctx))
    # An answered checkpoint's continuations: where the chain is now, before the revision.
    chained = [
        line
        for label, text in chain_rows(chain, prefix=command_prefix(ctx))
        for line in _labelled(label, text)
    ]
    for line in lines[:-1] + chained + lines[-1:]:
        click.echo(line)


def _labelled(label: str, text: str) -> list[str]:
    """`label: first line`, then the text's other lines indented (advised commands)."""
    first, *more = text.split("\n")
    return [f"{label}: {first}", *(f"  {line}" for line in more)]


def command_prefix(ctx: click.Context) -> str:
    """How an advised command starts: `pi-workflows`, with this invocation's
    `--state-dir` when one was given that the environment would not pick by itself (so
    the command acts on the same state, typed as printed)."""
    given = ctx.find_root().params.get("state_dir")
    if given is None or _state_dir(ctx).resolve() == workflows_dir().absolute().resolve():
        return "pi-workflows"
    return f"pi-workflows --state-dir {shlex.quote(str(_state_dir(ctx)))}"


def status_lines(view: dict[str, Any], prefix: str = "pi-workflows") -> list[str]:
    """`run status`: the run, where it is, what it asks, why it stopped and what to do
    (each advised step as the command to type), its newest steps and its effects."""
    display = view["display"]
    lines = [f"{view['runId']}  {status_words(display)}  {view['workflow']}"]
    if view.get("executionMode"):
        lines.append(f"execution mode: {view['executionMode']}")
    kinds = node_kinds(view)
    where = display.get("currentNode") or display.get("waitingOn")
    if where:
        kind = kinds.get(where)
        lines.append(f"at node: {where}" + (f" ({kind_words(kind)})" if kind else ""))
    if display.get("question"):
        lines.append(f"question: {display['question']}")
    if display.get("choices"):
        lines.append("choices: " + ", ".join(_choice_words(c) for c in display["choices"]))
    reason = display.get("reasonText") or display.get("reason") or view.get("failureReason")
    if reason:
        lines.append(f"reason: {reason}")
    lines += advice_lines(advice(view, prefix), "  ")
    for step in view.get("steps", []):
        kind = kind_words(kinds.get(step["node"], step["kind"]))
        lines.append(f"  {step['node']:<24} {kind:<14} visit {step['visit']}  {step['status']}")
    lines += ambiguous_effect_lines(view)
    lines.append(f"revision {view['revision']}, generation {view['generation']}")
    return lines


def _choice_words(choice: dict[str, Any]) -> str:
    text = f" (with {choice['input']}: text)" if choice.get("input") else ""
    return f"{choice['id']} ({choice.get('label') or choice['id']}{text})"


def advice_lines(shown: Advice, indent: str) -> list[str]:
    """What to do: the words, each advised command on its own line, what a placeholder
    means, and the other commands allowed now."""
    lines: list[str] = []
    if shown.action:
        lines.append(f"what to do: {shown.action}")
    lines += [f"{indent}{command}" for command in shown.commands]
    lines += [f"{indent}({note})" for note in shown.notes]
    if shown.also:
        lines.append("allowed now:")
        lines += [f"{indent}{command}" for command in shown.also]
    return lines


def ambiguous_effect_lines(view: dict[str, Any]) -> list[str]:
    """Name each ambiguous effect: its type, node, visit and effect attempt (an
    effect's attempts are numbered apart from its node's); the advice names the
    commands. Then each Telegram delivery not sent yet or failed."""
    return [
        f"ambiguous effect: {effect['effectType']} at node {effect['nodePath']} "
        f"(visit {effect['visit']}, effect attempt {effect['attemptNumber']}, "
        f"effect {effect['effectId']}) may have applied; nothing proves whether it did"
        for effect in view.get("ambiguousEffects") or []
    ] + [_delivery_line(view["runId"], item) for item in view.get("channelDeliveries") or []]


def _delivery_line(run_id: str, item: dict[str, Any]) -> str:
    what = "message" if item["operation"] == "deliver" else "edit"
    why = f" ({item['reason']})" if item.get("reason") else ""
    if item["state"] == "failed":
        return (
            f"{item['channel']}: the decision's {what} failed{why}: nothing was sent; "
            f"`pi-workflows channel recover {run_id} retry` sends it again"
        )
    return f"{item['channel']}: the decision's {what} is not sent yet{why}; the server tries again"


CONTROL_HELP = {
    "cancel": "Cancel a run; print its run ID (--json: the receipt).",
    "pause": "Pause a run; print its run ID (--json: the receipt).",
    "resume": "Resume a paused or parked run; print its run ID (--json: the receipt).",
    "restart": "Start a finished run again from the start, as a new run; print the new "
    "run's ID (--json: the receipt).",
}
CONTROL_DONE = {
    "cancel": "cancelled",
    "pause": "paused",
    "resume": "resumed",
    "restart": "restarted",
}


def _control_command(operation: str, verb: str) -> None:
    @run.command(
        verb,
        help=f"{CONTROL_HELP[verb]}\n\nWhat happened goes to stderr, so "
        f"R=$(pi-workflows run {verb} RUN_ID) holds the run ID alone."
        f"\n\nExample: pi-workflows run {verb} RUN_ID",
    )
    @click.argument("run_id")
    @json_option
    @click.pass_context
    @_client_errors
    def command(ctx: click.Context, run_id: str, as_json: bool) -> None:
        with _client(ctx) as client:
            answer = client.call(operation, run_id=run_id)
        if as_json:
            _print_json(answer["receipt"])
            return
        _echo_control(verb, run_id, answer)


def _echo_control(verb: str, run_id: str, answer: ResponseMessage) -> None:
    """What happened on stderr; the affected run's ID alone on stdout."""
    affected = str(answer["receipt"].get("runId", run_id))
    suffix = " (already done)" if answer["outcome"] == "adopted" else ""
    done = CONTROL_DONE[verb]
    said = f"{done} {run_id} as {affected}" if affected != run_id else f"{done} {run_id}"
    click.echo(said + suffix, err=True)
    click.echo(affected)


for _operation, _verb in (
    ("run.cancel", "cancel"),
    ("run.pause", "pause"),
    ("run.restart", "restart"),
):
    _control_command(_operation, _verb)


@run.command("resume")
@click.argument("run_id")
@click.option(
    "--headless",
    is_flag=True,
    help="Go on without the run's Pi session: its agent steps run in a headless pi child.",
)
@json_option
@click.pass_context
@_client_errors
def run_resume(ctx: click.Context, run_id: str, headless: bool, as_json: bool) -> None:
    """Resume a paused or parked run; print its run ID (--json: the receipt).

    What happened goes to stderr, so R=$(pi-workflows run resume RUN_ID) holds the run
    ID alone. A paused run goes on from its last durable boundary. With --headless, an interactive
    run whose Pi session cannot come back (Pi was closed before it saved the session)
    goes on without it: the server releases the session, and the step the run waits at
    runs in a headless pi child. Refused while a runner executes the run (pause it
    first), while the session is open in a Pi, or when a step needs a Pi session.

    Example: pi-workflows run resume RUN_ID --headless
    """
    operation = "run.resumeHeadless" if headless else "run.resume"
    with _client(ctx) as client:
        answer = client.call(operation, run_id=run_id)
    if as_json:
        _print_json(answer["receipt"])
    else:
        _echo_control("resume", run_id, answer)


# --- state ----------------------------------------------------------------------------


@main.group()
def state() -> None:
    """Check the workflow state database.

    Example: pi-workflows state verify
    """


STATE_COUNT_WORDS = {
    "runs": "runs",
    "nonterminalRuns": "not finished",
    "pendingDecisions": "pending decisions",
    "pendingInteractions": "pending interactions",
    "pendingFollowUps": "pending follow-ups",
    "pendingWorkflowMessages": "pending workflow messages",
    "activeLeases": "active claims",
    "unsettledEffects": "unsettled effects",
    "ambiguousEffects": "ambiguous effects",
    "blobs": "stored blobs",
    "viewContents": "stored view contents",
    "retainedTrees": "retained run trees",
}
"""How `state status` names each count (the receipt's keys are in `--json`)."""


@state.command("status")
@json_option
@click.pass_context
@_client_errors
def state_status(ctx: click.Context, as_json: bool) -> None:
    """Show the database's size and safe counts (no IDs, paths or payloads).

    The server reads them from its own connection (started on demand).

    Example: pi-workflows state status --json
    """
    with _client(ctx) as client:
        status = client.call("state.status")["receipt"]
    if as_json:
        _print_json(status)
        return
    click.echo(
        f"database: {_mib(status['databaseBytes'])} ({_mib(status['freeBytes'])} free for reuse)"
    )
    if "walBytes" in status:
        click.echo(
            f"write-ahead log: {_mib(status['walBytes'])}; {status['freePages']} of "
            f"{status['pageCount']} pages free ({_mib(status['reclaimableBytes'])} reclaimable)"
        )
    counts = status["counts"]
    width = max(len(words) for words in STATE_COUNT_WORDS.values())
    for key, words in STATE_COUNT_WORDS.items():
        if key in counts:
            click.echo(f"  {words:<{width}}  {counts[key]}")
    by_state = status.get("runsByState") or {}
    if by_state:
        click.echo("runs by state: " + ", ".join(f"{k} {n}" for k, n in sorted(by_state.items())))
    if status.get("retention") is not None:
        _echo_retention(status["retention"])


def _echo_retention(retention: dict[str, Any]) -> None:
    """The retention setting, the last sweep and the next one (times in UTC)."""
    if not retention["enabled"]:
        click.echo("retention: automatic cleanup off (PI_WORKFLOWS_RETENTION_DAYS=0)")
        return
    click.echo(
        f"retention: terminal run trees are kept {retention['retentionDays']} days "
        f"after they finish ({retention['state']})"
    )
    last = retention.get("lastSweep")
    if last is None:
        click.echo("  last sweep: none yet in this server process")
    else:
        click.echo(
            f"  last sweep: {_utc(last['finishedAt'])} ({last['trigger']}): "
            f"{last['treesDeleted']} trees ({last['runsDeleted']} runs) deleted, "
            f"{last['treesKeptProtected']} kept for protected state, "
            f"{last['blobsDeleted']} blobs collected" + ("; compacted" if last["vacuumed"] else "")
        )
    if retention.get("nextDueAt") is not None:
        click.echo(f"  next sweep due: {_utc(retention['nextDueAt'])}")


def _utc(epoch_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(epoch_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _mib(size: int) -> str:
    return f"{size / 1_048_576:.1f} MiB"


@state.command("verify")
@click.argument(
    "backup_argument",
    metavar="[BACKUP]",
    required=False,
    type=click.Path(dir_okay=False, path_type=Path),
)
@click.option(
    "--backup",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Verify this inactive backup file read-only, in this process (never the live database).",
)
@json_option
@click.pass_context
@_client_errors
def state_verify(
    ctx: click.Context, backup_argument: Path | None, backup: Path | None, as_json: bool
) -> None:
    """Check every storage invariant; exit 0 when consistent, 5 with findings.

    Without a backup the live database is checked by the server (started on demand),
    on its own connection. With one, the file is opened read-only here; the live
    database is refused by any path.

    Example: pi-workflows state verify --backup /tmp/state-copy.sqlite --json
    """
    if backup is not None and backup_argument is not None and backup != backup_argument:
        _fail("give the backup once: as BACKUP or as --backup", EXIT_USAGE)
    backup = backup or backup_argument
    if backup is None:
        with _client(ctx) as client:
            report = dict(client.call("state.verify")["receipt"])
        report["source"] = "server"
    else:
        from pi_workflows.cli._backup import (  # noqa: PLC0415 (storage loads for a file)
            BackupUnusableError,
            LiveDatabaseError,
            verify_inactive_backup,
        )

        try:
            findings = verify_inactive_backup(backup, _state_dir(ctx))
        except (LiveDatabaseError, BackupUnusableError) as exc:
            _fail(str(exc), EXIT_USAGE)
        report = {
            "source": "backup",
            "consistent": not findings,
            "findingCount": len(findings),
            "truncated": False,
            "findings": [
                {"code": f.code.value, "runId": f.run_id, "detail": f.detail} for f in findings
            ],
        }
    if as_json:
        _print_json(report)
    else:
        for finding in report["findings"]:
            click.echo(f"{finding['code']}  {finding['runId'] or '-'}  {finding['detail']}")
        if report["consistent"]:
            click.echo("consistent: no findings")
        else:
            shown = len(report["findings"])
            more = f" ({shown} shown)" if report["truncated"] else ""
            click.echo(f"inconsistent: {report['findingCount']} findings{more}")
    if not report["consistent"]:
        sys.exit(EXIT_STATE)


# --- debug ----------------------------------------------------------------------------


@main.group()
def debug() -> None:
    """Tools for fault-injection tests and diagnosis.

    Example: pi-workflows debug crash-points
    """


@debug.command("crash-points")
@json_option
def debug_crash_points(as_json: bool) -> None:
    """List every named crash point, its process and what a crash there interrupts.

    Works offline: no server is needed. PI_WORKFLOWS_CRASH=<point>[@<n>] arms one.

    Example: pi-workflows debug crash-points --json
    """
    from pi_workflows.supervision import CRASH_POINTS  # noqa: PLC0415

    rows = [
        {"name": point.name, "process": point.process, "interrupts": point.interrupts}
        for point in CRASH_POINTS.values()
    ]
    if as_json:
        _print_json(rows)
        return
    width = max(len(row["name"]) for row in rows)
    for row in rows:
        click.echo(f"{row['name']:<{width}}  {row['process']:<8}  {row['interrupts']}")
    click.echo(f"\n{CRASH_ENV}=<point>[@<n>] kills the process at the n-th hit (default 1).")


class ViewerGroup(DocumentedGroup):
    """`piw` and its subcommands: a first word that is not a subcommand is a run ID,
    so `piw RUN_ID` and `piw serve` share one program."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        valued = {
            name
            for param in self.params
            if isinstance(param, click.Option) and not param.is_flag
            for name in param.opts
        }  # the word after one of these is its value, not a run ID
        return super().parse_args(ctx, _run_id_last(args, set(self.commands), valued))


def _run_id_last(args: list[str], commands: set[str], valued: set[str]) -> list[str]:
    """`piw RUN_ID --once` → `piw --once view RUN_ID`: the group parses every option,
    and the hidden `view` command gets the run ID."""
    index = 0
    while index < len(args):
        word = args[index]
        if word == "--":
            return args
        if word.startswith("-"):
            index += 2 if word in valued else 1
            continue
        if word in commands:
            return args
        return [*args[:index], *args[index + 1 :], VIEW_COMMAND, word]
    return args


RELAY_BIND = "127.0.0.1:9377"
"""Where `piw serve` listens by default (loopback only)."""
VIEW_COMMAND = "view"
"""The hidden command `piw RUN_ID` runs (the viewer itself)."""


@click.group(
    "piw",
    cls=ViewerGroup,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
@click.version_option(__version__, prog_name="piw")
@click.option("--once", is_flag=True, help="Print one plain-text 120 x 40 frame, then exit.")
@click.option(
    "--connect",
    metavar="URL",
    default=None,
    help="View through a `piw serve` relay at ws://HOST:PORT/ws instead of the local server.",
)
@click.option("--theme", metavar="NAME", default=None, help="Colour theme (see --list-themes).")
@click.option("--list-themes", is_flag=True, help="Print the theme names, then exit.")
@click.option(
    "--session",
    "session_id",
    metavar="SESSION_ID",
    default=None,
    help="The Pi origin session piw was opened from (`/piw` passes it): "
    "Clear (d) stops retaining that session's finished run.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    help="With --once: seconds to wait for the server and the run's view.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Workflow state folder of the local server (default: "
    "$PI_CODING_AGENT_DIR/workflows, else ~/.pi/agent/workflows).",
)
@click.pass_context
def piw_main(  # noqa: PLR0917 (one parameter per option, as click passes them)
    ctx: click.Context,
    once: bool,
    connect: str | None,
    theme: str | None,
    list_themes: bool,
    session_id: str | None,
    timeout: float,
    state_dir: Path | None,
) -> None:
    """Terminal viewer for workflow runs, and its relay (`piw serve`).

    `piw` shows every run; `piw RUN_ID` opens one; `piw RUN_ID --once` prints one frame.
    Without a server it starts one, as `pi-workflows` does.

    Example: piw RUN_ID; piw RUN_ID --once; piw --connect ws://127.0.0.1:9377/ws
    """
    ctx.ensure_object(dict)
    ctx.obj.update(
        once=once,
        connect=connect,
        theme=theme,
        list_themes=list_themes,
        session_id=session_id,
        timeout=timeout,
        state_dir=state_dir,
    )
    if ctx.invoked_subcommand is None:
        _run_viewer(ctx.obj, None)


@piw_main.command(VIEW_COMMAND, hidden=True)
@click.argument("run_id", required=False)
@click.pass_obj
def piw_view(options: dict[str, Any], run_id: str | None) -> None:
    """Open one run in the viewer. Example: piw RUN_ID"""
    _run_viewer(options, run_id)


def _run_viewer(options: dict[str, Any], run_id: str | None) -> NoReturn:
    from pi_workflows.viewer import (  # noqa: PLC0415 (textual loads only for the viewer)
        Target,
        list_themes,
        print_once,
        run_app,
    )

    if options["list_themes"]:
        for name in list_themes():
            click.echo(name)
        sys.exit(0)
    theme = options["theme"]
    if theme is not None and theme not in list_themes():
        _fail(f"no theme {theme!r}; `piw --list-themes` lists them", EXIT_USAGE)
    url = options["connect"]
    if url is not None and not _is_ws_url(url):
        _fail("--connect takes a relay URL such as ws://127.0.0.1:9377/ws", EXIT_USAGE)
    state_dir = (options["state_dir"] or workflows_dir()).absolute()
    target = Target(state_dir, url=url, client_id=f"piw-{os.getuid()}-{os.getpid()}")
    if options["once"]:
        if run_id is None:
            _fail("--once needs a RUN_ID: piw RUN_ID --once", EXIT_USAGE)
        sys.exit(print_once(target, run_id, timeout=options["timeout"]))
    sys.exit(run_app(target, run_id, theme=theme, session_id=options["session_id"]))


def _is_ws_url(url: str) -> bool:
    return url.startswith(("ws://", "wss://")) and len(url) > len("ws://")


@piw_main.command("serve")
@click.option(
    "--bind",
    default=RELAY_BIND,
    help="Loopback HOST:PORT to listen on (127.0.0.1, ::1 or localhost; port 0: any free).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Workflow state folder whose server socket is relayed (default: "
    "$PI_CODING_AGENT_DIR/workflows, else ~/.pi/agent/workflows).",
)
def piw_serve(bind: str, state_dir: Path | None) -> None:
    """Relay WebSockets at ws://HOST:PORT/ws to the workflow server's socket.

    Each WebSocket gets its own server connection; when either closes, so does the
    other. Frames are forwarded unchanged; a binary, oversized or non-canonical frame
    closes only its WebSocket. The relay never starts a server: without one, each
    WebSocket is closed with the reason. Reach it from another machine through
    `ssh -L 9377:127.0.0.1:9377 HOST`. Stops at SIGTERM or Ctrl-C.

    Example: piw serve --bind 127.0.0.1:9377
    """
    from pi_workflows.cli import _relay  # noqa: PLC0415 (websockets loads only for the relay)

    try:
        address = _relay.parse_bind(bind)
    except _relay.NonLoopbackBindError as exc:
        _fail(str(exc), EXIT_USAGE)
    socket_path = socket_path_for((state_dir or workflows_dir()).absolute())
    try:
        _relay.run_relay(address, socket_path, _announce)
    except OSError as exc:
        _fail(f"cannot listen on {bind}: {exc.strerror or exc}", EXIT_FAILED)


def _announce(url: str) -> None:
    click.echo(f"piw serve: relaying {url} to the workflow server", nl=True)
    sys.stdout.flush()


# Commands in their own modules register on the groups above when their module is
# imported, on first use (`DocumentedGroup.lazy`); `completion` (_completion) now, and
# then every run-ID and workflow-name parameter gets its shell completion.
_CLI = "pi_workflows.cli."
lazy_commands(
    main,
    {
        "channel": _CLI + "_channel",  # and `channel recover` (_recover)
        "decision": _CLI + "_decision",
        "pi-extension": _CLI + "_pi_extension",
        "resource-manager": _CLI + "_resource_manager",
    },
)
lazy_commands(
    run,
    {
        "list": _CLI + "_run_list",
        "logs": _CLI + "_run_list",
        "show": _CLI + "_run_show",
        "wait": _CLI + "_run_watch",
        "watch": _CLI + "_run_watch",
        "recover": _CLI + "_recover",
    },
)
lazy_commands(state, {"backup": _CLI + "_state_backup", "prune": _CLI + "_state_prune"})

from pi_workflows.cli import _completion  # noqa: E402

_completion.install_completion(main)
