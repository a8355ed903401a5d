"""Driving and checking the crash matrix: real servers, real runners, one lab per test.

A `Lab` owns one short temporary folder with a state folder, a project holding the
workflows below, an event FIFO the workflows announce themselves on, and the files the
workflows count their executions and effect applications in. It starts each server as
`pi-workflows server run --idle-exit 0` in a session of its own, armed (or not) with
`PI_WORKFLOWS_CRASH` and a `PI_WORKFLOWS_CRASH_ONCE` marker, and tags every server with
`PI_WORKFLOWS_CRASH_LAB`, an environment variable its zygote, runners and shell commands
inherit, so teardown can find and kill every process the lab caused, by PID.

Commands go through one `WorkflowClient` identity with an idempotency key per command,
and every command is recorded: a command whose response a crash swallowed is re-sent with
its key after the restart (it must adopt its receipt or execute exactly once), and at the
end every answered command is re-sent once more and must come back `adopted` with the
very receipt it got first. `Lab.finish` then checks what every scenario must leave:
each run in the state the design requires and no other run, no runner left, no expired
claim, `state.verify` clean, a graceful stop, no process of the lab alive, SQLite
`integrity_check` and `foreign_key_check` clean, no live runner generation and no
recorded process left, and no effect applied twice unless it is ambiguous.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from pi_workflows import WorkflowClient
from pi_workflows.supervision import CRASH_ENV, CRASH_ONCE_ENV
from pi_workflows.wire.client import HostUnavailableError
from tests.conftest import Processes, write_workflow

__all__ = [
    "LAB_ENV",
    "TERMINAL",
    "Command",
    "Lab",
    "Server",
    "live_generations",
    "runner_rows",
]

LAB_ENV = "PI_WORKFLOWS_CRASH_LAB"
"""Tags every process a lab's servers start (they inherit it): teardown kills by it."""
PIW = [sys.executable, "-m", "pi_workflows.cli"]
TERMINAL = frozenset({"completed", "failed", "timed_out", "cancelled"})
SETTLE_S = 60.0
"""The longest any run may take to reach the state a scenario waits for."""
DEATH_S = 30.0
"""The longest an armed process may take to reach its point and die."""

# --- The workflows ---------------------------------------------------------------------
# Every workflow counts the executions of its compute nodes in `counts/<run>.<node>` and
# appends `<run> <key>` to `effects.ledger` for every application of its effect. On the
# first execution only, a node named by the input's "block" announces itself on the event
# FIFO and then blocks (a compute node, an effect's apply or a shell command), and the
# node named by "spin" ignores SIGTERM and spins.

PRELUDE = """
import os
import signal
import time
from pathlib import Path

from pi_workflows import (
    action, checkpoint, compute, define_workflow, human_decision, notify, shell,
)
from pi_workflows.engine import NOT_APPLIED

LAB = Path(__LAB__)
EVENTS = __EVENTS__


def announce(*parts):
    # The lab holds the FIFO open for reading, so this never blocks.
    try:
        fd = os.open(EVENTS, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        os.write(fd, (" ".join(str(part) for part in parts) + "\\n").encode())
    finally:
        os.close(fd)


def step(ctx, node):
    counter = LAB / "counts" / f"{ctx.run_id}.{node}"
    with counter.open("a") as out:
        out.write("x")
    count = len(counter.read_text())
    if count == 1 and ctx.input.get("block") == node:
        announce(ctx.run_id, node, os.getpid())
        time.sleep(600)
    if count == 1 and ctx.input.get("spin") == node:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        announce(ctx.run_id, node, os.getpid())
        while True:
            pass
    return {"node": node, "count": count}


def apply(key, request):
    ledger = LAB / "effects.ledger"
    with ledger.open("a") as out:
        out.write(f"{request['run']} {key}\\n")
    if request["block"] and ledger.read_text().split().count(key) == 1:
        announce(request["run"], "applying", os.getpid())
        time.sleep(600)
    return {"charged": request["amount"]}


def read_back(key, request):
    ledger = LAB / "effects.ledger"
    if ledger.exists() and key in ledger.read_text().split():
        return {"charged": request["amount"], "proof": "read-back"}
    return NOT_APPLIED


def charge(ctx):
    request = {"run": ctx.run_id, "amount": 5, "block": ctx.input.get("block") == "charge"}
    proof = read_back if ctx.input.get("readBack", True) else None
    return ctx.effect("ledger.charge", request, apply=apply, read_back=proof)


def build(ctx):
    script = f"echo {ctx.run_id} >> {LAB / 'shell.ledger'}"
    if ctx.input.get("block") == "build":
        script += f'; echo "{ctx.run_id} build $$" > {EVENTS}; exec sleep 600'
    return ["sh", "-c", script]


def boom(ctx):
    step(ctx, "boom")
    raise RuntimeError("boom")


BIG = 3 * 1024 * 1024


def big(ctx):
    # 3 MiB of output: sent in 512 KiB content.write parts, then named by reference.
    return {**step(ctx, "big"), "text": "b" * BIG}


def slow_build(ctx):
    # Announces itself, then takes a moment: long enough for a graceful stop to begin.
    script = f"echo {ctx.run_id} >> {LAB / 'shell.ledger'}; "
    script += f'echo "{ctx.run_id} build $$" > {EVENTS}; sleep 1'
    return ["sh", "-c", script]
"""

WORKFLOWS = {
    # a -> b: pure compute only.
    "pure": """
workflow = define_workflow(
    name="pure",
    start_at="a",
    nodes={"a": compute(lambda ctx: step(ctx, "a")), "b": compute(lambda ctx: step(ctx, "b"))},
    edges=[{"from": "a", "to": "b"}],
)
""",
    # a -> charge (a managed effect; read_back unless input readBack is false) -> z.
    "charge": """
workflow = define_workflow(
    name="charge",
    start_at="a",
    nodes={
        "a": compute(lambda ctx: step(ctx, "a")),
        "charge": action(charge),
        "z": compute(lambda ctx: step(ctx, "z")),
    },
    edges=[{"from": "a", "to": "charge"}, {"from": "charge", "to": "z"}],
)
""",
    # a -> charge (read_back) -> approve (checkpoint) -> z in the continuation run.
    "approve": """
workflow = define_workflow(
    name="approve",
    start_at="a",
    nodes={
        "a": compute(lambda ctx: step(ctx, "a")),
        "charge": action(charge),
        "approve": checkpoint(summary="Ship it?"),
        "z": compute(lambda ctx: step(ctx, "z")),
    },
    edges=[
        {"from": "a", "to": "charge"},
        {"from": "charge", "to": "approve"},
        {"from": "approve", "to": "z"},
    ],
)
""",
    # a -> boom (raises; no edge for failed): the run fails.
    "fails": """
workflow = define_workflow(
    name="fails",
    start_at="a",
    nodes={"a": compute(lambda ctx: step(ctx, "a")), "boom": compute(boom)},
    edges=[{"from": "a", "to": "boom"}],
)
""",
    # late (0.3 s deadline; input block "late" makes it overrun; no edge): timed out.
    "late": """
workflow = define_workflow(
    name="late",
    start_at="late",
    nodes={"late": compute(lambda ctx: step(ctx, "late"), timeout=0.3)},
)
""",
    # a -> note (a notify node) -> z.
    "note": """
workflow = define_workflow(
    name="note",
    start_at="a",
    nodes={
        "a": compute(lambda ctx: step(ctx, "a")),
        "note": notify("built"),
        "z": compute(lambda ctx: step(ctx, "z")),
    },
    edges=[{"from": "a", "to": "note"}, {"from": "note", "to": "z"}],
)
""",
    # build (a shell command that takes a second) -> z.
    "slowbuild": """
workflow = define_workflow(
    name="slowbuild",
    start_at="build",
    nodes={"build": shell(slow_build), "z": compute(lambda ctx: step(ctx, "z"))},
    edges=[{"from": "build", "to": "z"}],
)
""",
    # ask: an agent step of an origin-session run, with a 1 s node timeout and no edge.
    "timedask": """
from pi_workflows import agent

workflow = define_workflow(
    name="timedask",
    start_at="ask",
    nodes={"ask": agent(prompt="Summarise", output_schema={"type": "object"}, timeout=1)},
)
""",
    # decide: a protected decision whose default (reject) wins after 1 s -> z.
    "decide": """
workflow = define_workflow(
    name="decide",
    start_at="decide",
    nodes={
        "decide": human_decision(
            "Ship?", choices={"approve": "Approve", "reject": "Reject"},
            on_timeout=(1, {"choice": "reject"}),
        ),
        "z": compute(lambda ctx: step(ctx, "z")),
    },
    edges=[{"from": "decide", "switch": {"on": "$.choice", "cases": {"reject": "z"}}}],
)
""",
    # ask: a protected decision with no timeout (delivered to Telegram in channel cases).
    "ask": """
workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={"ask": human_decision("Ship?", choices={"approve": "Approve"})},
    edges=[],
)
""",
    # a -> big (a 3 MiB output, sent by reference) -> z.
    "large": """
workflow = define_workflow(
    name="large",
    start_at="a",
    nodes={
        "a": compute(lambda ctx: step(ctx, "a")),
        "big": compute(big),
        "z": compute(lambda ctx: step(ctx, "z")),
    },
    edges=[{"from": "a", "to": "big"}, {"from": "big", "to": "z"}],
)
""",
    # build (a shell command: a managed effect without read-back) -> z.
    "build": """
workflow = define_workflow(
    name="build",
    start_at="build",
    nodes={"build": shell(build), "z": compute(lambda ctx: step(ctx, "z"))},
    edges=[{"from": "build", "to": "z"}],
)
""",
}


@dataclass
class Command:
    """One client command, as sent under the lab's client identity and its own key."""

    operation: str
    payload: dict[str, Any]
    run_id: str | None
    key: str
    response: dict[str, Any] | None = None
    lost: bool = False
    """The first send got no response (the server died before writing it)."""
    resent_outcome: str | None = None
    """For a lost command: the outcome of re-sending it after the restart."""

    @property
    def receipt(self) -> dict[str, Any]:
        assert self.response is not None, f"{self.operation} was never answered"
        return dict(self.response["receipt"])

    @property
    def new_run(self) -> str:
        """The run a run.start, run.restart or run.answer created."""
        receipt = self.receipt
        return str(receipt.get("continuationRunId") or receipt["runId"])


@dataclass
class Server:
    """One `server run` process of the lab."""

    popen: subprocess.Popen[str]
    crash: str | None
    marker: Path | None
    stderr: Path
    epoch: int | None = None

    @property
    def point(self) -> str:
        assert self.crash is not None
        return self.crash.partition("@")[0]

    def alive(self) -> bool:
        return self.popen.poll() is None


class Events:
    """The FIFO workflows announce on: `<run> <node> <pid>` lines, awaited with select."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path, 0o600)
        self.path = path
        self._read = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        # A writer of our own: with it, the FIFO never reports end of file between two
        # workflow writers, so select blocks instead of spinning.
        self._keep = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        self._pending = b""
        self._lines: list[list[str]] = []

    def wait(self, run_id: str, node: str, timeout: float = SETTLE_S) -> int:
        """Block until `run_id` announced `node`; return the PID it announced."""
        deadline = time.monotonic() + timeout
        while True:
            for index, parts in enumerate(self._lines):
                if parts[:2] == [run_id, node]:
                    del self._lines[index]
                    return int(parts[2])
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{run_id} never announced {node}; seen {self._lines}"
            readable, _, _ = select.select([self._read], [], [], remaining)
            if readable:
                with contextlib.suppress(BlockingIOError):
                    self._pending += os.read(self._read, 65536)
                *complete, self._pending = self._pending.split(b"\n")
                self._lines += [line.decode().split() for line in complete if line]

    def close(self) -> None:
        for fd in (self._read, self._keep):
            with contextlib.suppress(OSError):
                os.close(fd)


class Lab:
    """One crash scenario's folder, servers, client, commands and checks."""

    def __init__(self, root: Path, processes: Processes) -> None:
        self.root = root
        self.state_dir = root / "agent" / "workflows"
        self.project = root / "project"
        self.processes = processes
        self.tag = uuid.uuid4().hex
        self.client_id = f"crash-lab-{self.tag[:8]}"
        self.commands: list[Command] = []
        self.extra_env: dict[str, str] = {}
        """Added to every server's (and `cli`'s) environment (a scenario's knobs)."""
        self.servers: list[Server] = []
        self._client: WorkflowClient | None = None
        (root / "counts").mkdir()
        self.events = Events(root / "events.fifo")
        prelude = PRELUDE.replace("__LAB__", repr(str(root))).replace(
            "__EVENTS__", repr(str(self.events.path))
        )
        for name, body in WORKFLOWS.items():
            write_workflow(self.project, name, prelude + body)

    # --- processes ----------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The environment of an unarmed server of this lab."""
        env = {k: v for k, v in os.environ.items() if k not in (CRASH_ENV, CRASH_ONCE_ENV)}
        env["PI_CODING_AGENT_DIR"] = str(self.state_dir.parent)
        env[LAB_ENV] = self.tag
        env.update(self.extra_env)
        return env

    def start_server(
        self, crash: str | None = None, *, max_workers: int | None = None, ready: bool = True
    ) -> Server:
        """Start `server run`, armed with `crash` (`<point>[@<n>]`) and a once-marker.

        With `ready`, wait for its banner (it accepts clients once it printed it).
        """
        index = len(self.servers)
        env = self.env()
        marker = None
        if crash is not None:
            marker = self.root / f"crashed-{index}"
            env[CRASH_ENV] = crash
            env[CRASH_ONCE_ENV] = str(marker)
        argv = [*PIW, "--state-dir", str(self.state_dir), "server", "run", "--idle-exit", "0"]
        if max_workers is not None:
            argv += ["--max-workers", str(max_workers)]
        stderr = self.root / f"server-{index}.err"
        with stderr.open("w") as err:
            popen = subprocess.Popen(
                argv,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
            )
        self.processes.started.append(popen)
        server = Server(popen, crash, marker, stderr)
        self.servers.append(server)
        if ready:
            server.epoch = self._banner(server)
        return server

    def _banner(self, server: Server) -> int:
        stdout = server.popen.stdout
        assert stdout is not None
        readable, _, _ = select.select([stdout], [], [], DEATH_S)
        assert readable, "the server printed no banner"
        line = stdout.readline()
        if "running" not in line:
            code = server.popen.wait(10)
            raise AssertionError(
                f"the server exited ({code}) before it was ready: {server.stderr.read_text()}"
            )
        found = re.search(r"epoch (\d+)", line)
        assert found is not None, line
        return int(found.group(1))

    def expect_server_crash(self, server: Server) -> None:
        """The armed server reached its point and died by SIGKILL there."""
        try:
            code = server.popen.wait(DEATH_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{server.point} was never reached: the server lives") from None
        assert code == -signal.SIGKILL, f"the server exited {code}: {server.stderr.read_text()}"
        assert server.marker is not None and server.marker.exists()
        assert f"crash point {server.point} hit" in server.stderr.read_text()
        self._drop_client()
        with self.database() as db:  # what the crash left, before anything recovers it
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert live_generations(db) == {}, "two live runner generations of one run"

    def expect_runner_crash(self, server: Server) -> None:
        """A runner of the armed server reached its point and died there; the server lives."""
        assert server.marker is not None and server.marker.exists(), f"{server.point} not hit"
        line = f"crash point {server.point} hit"

        def logged() -> bool:  # the server's log drain copies a runner's output just after
            logs = (self.state_dir / "logs" / "runners").glob("*.log")
            return any(line in log.read_text(errors="replace") for log in logs)

        deadline = time.monotonic() + DEATH_S
        while not logged() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert logged(), f"no runner log has {line!r}"
        assert server.alive(), "a runner point must not kill the server"

    def kill_server(self, server: Server) -> None:
        """SIGKILL a server from outside (a crash at no particular point)."""
        os.kill(server.popen.pid, signal.SIGKILL)
        assert server.popen.wait(DEATH_S) == -signal.SIGKILL
        self._drop_client()
        with self.database() as db:
            assert live_generations(db) == {}, "two live runner generations of one run"

    def stop_server(self, server: Server) -> None:
        """Stop gracefully and wait for a clean exit."""
        self.client().call("server.stop")
        assert server.popen.wait(DEATH_S) == 0, server.stderr.read_text()
        self._drop_client()

    def lab_processes(self) -> list[psutil.Process]:
        """Every live process carrying this lab's tag (zygotes, runners, shell commands)."""
        found = []
        for process in psutil.process_iter():
            try:
                if process.pid != os.getpid() and process.environ().get(LAB_ENV) == self.tag:
                    found.append(process)
            except psutil.Error:
                continue  # gone, a zombie, or not ours to read
        return found

    def assert_gone(self, processes: list[psutil.Process], what: str) -> None:
        _gone, alive = psutil.wait_procs(processes, timeout=DEATH_S)
        assert not alive, f"{what} still alive: {alive}"

    def close(self) -> None:
        """Kill everything the lab started, by PID (also after a failure)."""
        self._drop_client()
        for server in self.servers:
            if server.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(server.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.popen.wait(10)
            if server.popen.stdout is not None:
                server.popen.stdout.close()
        leftovers = self.lab_processes()
        for process in leftovers:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(leftovers, timeout=10)
        self.events.close()

    # --- the client -----------------------------------------------------------------------

    def client(self) -> WorkflowClient:
        if self._client is None:
            self._client = WorkflowClient(
                self.state_dir, client_id=self.client_id, autostart=False, timeout=DEATH_S
            )
        return self._client

    def _drop_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def call(self, operation: str, payload: Mapping[str, Any] | None = None, **options: Any) -> Any:
        """A read (or a command whose receipt nobody re-sends): its receipt."""
        return self.client().call(operation, payload, **options)["receipt"]

    def get(self, run_id: str) -> dict[str, Any]:
        return dict(self.call("run.get", run_id=run_id))

    def command(
        self, operation: str, payload: Mapping[str, Any] | None = None, *, run_id: str | None = None
    ) -> Command:
        """Send a command; it must be accepted, unless the server dies before answering."""
        command = Command(operation, dict(payload or {}), run_id, f"{operation}-{uuid.uuid4().hex}")
        self.commands.append(command)
        try:
            response = self.client().request(
                operation, command.payload, run_id=run_id, idempotency_key=command.key
            )
        except HostUnavailableError:
            self._drop_client()
            command.lost = True
            return command
        assert response["outcome"] == "accepted", response
        command.response = dict(response)
        return command

    def start_run(self, workflow: str, workflow_input: Mapping[str, Any] | None = None) -> Command:
        payload = {
            "workflow": workflow,
            "input": dict(workflow_input or {}),
            "projectPath": str(self.project),
        }
        return self.command("run.start", payload)

    def resend_lost(self) -> None:
        """Re-send every command a crash left unanswered: it adopts or executes once."""
        for command in self.commands:
            if command.response is not None:
                continue
            response = self.client().request(
                command.operation,
                command.payload,
                run_id=command.run_id,
                idempotency_key=command.key,
            )
            assert response["outcome"] in ("accepted", "adopted"), response
            command.response = dict(response)
            command.resent_outcome = response["outcome"]

    def resend_acknowledged(self) -> None:
        """Every answered command, sent again with its key, returns its stored receipt."""
        for command in self.commands:
            assert command.response is not None, f"{command.operation} was never re-sent"
            again = self.client().request(
                command.operation,
                command.payload,
                run_id=command.run_id,
                idempotency_key=command.key,
            )
            assert again["outcome"] == "adopted", (command.operation, again)
            assert again["receipt"] == command.response["receipt"], (command.operation, again)

    # --- waiting --------------------------------------------------------------------------

    def wait_run(
        self, run_id: str, check: Callable[[dict[str, Any]], bool], timeout: float = SETTLE_S
    ) -> dict[str, Any]:
        """Follow the run-list subscription until `check(run.get)` holds."""
        deadline = time.monotonic() + timeout
        with WorkflowClient(self.state_dir, autostart=False, timeout=timeout) as watcher:
            watcher.call("view.subscribe", {"kind": "runList"})
            view = self.get(run_id)
            while not check(view):
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"run {run_id} did not settle: {view}"
                watcher.set_read_timeout(remaining)
                try:
                    event = watcher.read_message()
                except TimeoutError:
                    continue  # the deadline check above fails with the last view
                assert event is not None, "the server closed the subscription"
                if event["type"] == "event" and any(
                    item["runId"] == run_id for item in event["payload"].get("items", [])
                ):
                    view = self.get(run_id)
        return view

    def wait_status(self, run_id: str, *statuses: str) -> dict[str, Any]:
        return self.wait_run(run_id, lambda view: view["display"]["status"] in statuses)

    def wait_recoverable(self, run_id: str) -> dict[str, Any]:
        """Ambiguous and parked: the display offers recovery only once the run is parked
        (its status is `ambiguous` from the effect's commit, one commit earlier)."""
        return self.wait_run(run_id, lambda view: "recoverConfirm" in view["display"]["controls"])

    def wait_reason(self, run_id: str, reason: str) -> dict[str, Any]:
        return self.wait_run(run_id, lambda view: view["display"].get("reason") == reason)

    def wait_no_runners(self, timeout: float = DEATH_S) -> None:
        """No event marks a runner's reaping: a bounded poll of `server.status`."""
        deadline = time.monotonic() + timeout
        pause = threading.Event()
        while self.call("server.status")["activeRunners"]:
            assert time.monotonic() < deadline, "a runner was never reaped"
            pause.wait(0.02)

    # --- what the workflows left ------------------------------------------------------------

    def count(self, run_id: str, node: str) -> int:
        """How often `node` of `run_id` executed."""
        path = self.root / "counts" / f"{run_id}.{node}"
        return len(path.read_text()) if path.exists() else 0

    def ledger(self) -> list[tuple[str, str]]:
        """Every effect application: (run, key)."""
        path = self.root / "effects.ledger"
        if not path.exists():
            return []
        return [(run, key) for run, key in (line.split() for line in path.read_text().splitlines())]

    def applied(self, run_id: str) -> int:
        """How often the effect of `run_id` was applied."""
        return sum(1 for run, _ in self.ledger() if run == run_id)

    def shell_runs(self, run_id: str) -> int:
        """How often the shell command of `run_id` ran."""
        path = self.root / "shell.ledger"
        return path.read_text().split().count(run_id) if path.exists() else 0

    @contextlib.contextmanager
    def database(self) -> Iterator[sqlite3.Connection]:
        """The state database, read-only (used between a crash and the restart, at the end,
        and for reading a lease while a server runs: WAL readers never block it)."""
        db = sqlite3.connect(f"file:{self.state_dir / 'state.sqlite'}?mode=ro", uri=True)
        try:
            yield db
        finally:
            db.close()

    # --- the end of every scenario ------------------------------------------------------------

    def finish(self, expected: Mapping[str, str], *, ambiguous: int = 0) -> None:
        """Check the settled system, stop it, and check what it left on disk.

        `expected` maps every run of the lab to the display status the design requires;
        `ambiguous` is the number of ambiguous effects `server.status` must report.
        """
        server = next(s for s in self.servers if s.alive())
        self.resend_lost()  # a command a crash swallowed, if the scenario did not re-send it
        for run_id, status in expected.items():
            view = self.get(run_id)
            assert view["display"]["status"] == status, (run_id, view)
        runs = {item["runId"] for item in self.call("run.list")["items"]}
        assert runs == set(expected), "a command made a run twice, or a run went missing"
        self.wait_no_runners()
        status = self.call("server.status")
        assert status["expiredClaims"] == 0, status
        assert status["ambiguousEffects"] == ambiguous, status
        report = self.call("state.verify")
        assert report["consistent"], report["findings"]
        self.resend_acknowledged()
        self.stop_server(server)
        self.assert_gone(self.lab_processes(), "a process of the lab")
        with self.database() as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert db.execute("PRAGMA foreign_key_check").fetchall() == []
            assert live_generations(db) == {}, "a runner generation outlived the stop"
            assert db.execute("SELECT COUNT(*) FROM runner_processes").fetchone() == (0,)
            effects = {
                key: (effect_type, state, run_id)
                for key, effect_type, state, run_id in db.execute(
                    "SELECT idempotency_key, effect_type, state, run_id FROM effects"
                )
            }
        applications = Counter(key for _, key in self.ledger())
        for key, times in applications.items():
            assert key in effects, f"effect {key} was applied without a reservation"
            state = effects[key][1]
            assert times == 1 or state == "ambiguous", f"effect {key} applied {times}x ({state})"
        for key, (effect_type, state, run_id) in effects.items():
            if effect_type.startswith("channel."):
                continue  # a Telegram send: the scenario counts the fake's messages
            if effect_type == "shell":
                runs_of_shell = self.shell_runs(run_id)
                assert runs_of_shell <= 1, f"the shell command of {run_id} ran {runs_of_shell}x"
                assert state != "applied" or runs_of_shell == 1
            elif state == "applied":
                assert applications[key] == 1, f"effect {key} is applied but was not"
            elif state in ("pending", "cancelled", "rejected"):
                assert applications[key] == 0, f"effect {key} is {state} but was applied"


def live_generations(db: sqlite3.Connection) -> dict[str, int]:
    """Runs with more than one live runner generation (starting or ready): must be none."""
    rows = db.execute(
        "SELECT run_id, COUNT(*) FROM runner_epochs WHERE status IN ('starting', 'ready') "
        "GROUP BY run_id HAVING COUNT(*) > 1"
    ).fetchall()
    return {str(run_id): int(count) for run_id, count in rows}


def runner_rows(db: sqlite3.Connection, run_id: str) -> list[tuple[str, int | None]]:
    """(status, signal) of each runner epoch of a run, oldest first."""
    rows = db.execute(
        "SELECT status, signal FROM runner_epochs WHERE run_id = ? ORDER BY started_at, generation",
        (run_id,),
    ).fetchall()
    return [(str(status), sig) for status, sig in rows]
