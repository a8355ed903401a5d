"""Random-kill soak: load a real server, SIGKILL random parts of it, check every aftermath.

Run it (it prints its seed first, then one progress line per 50 kills, then a summary):

    .venv/bin/python -m tests.soak.soak --seed 7 --kills 20 --max-seconds 90
    nohup nice -n 10 .venv/bin/python -m tests.soak.soak --kills 1000 --max-seconds 3600 &

Exit code 0 means no violation, 1 means at least one (each is printed with the kill after
which it was seen), 2 means the soak itself could not run (bad arguments, no server).

**What runs.** One real server process (`pi-workflows server run --idle-exit 0`, in a
session of its own, with a unique marker in its environment that its zygote, runners and
shell commands inherit), and one client subprocess (`_client` mode of this module: a
`WorkflowClient` with a fixed client ID and caller-chosen idempotency keys, so every
command can be re-sent with the same key). The controller (this process) keeps about
`--active` runs going, drawn from `tests/soak/workflows.py`: compute chains, an action
whose effect appends its key to a ledger file with a read-back that proves it from the
ledger, the same without a read-back, a short shell node, a checkpoint the controller
answers, and a workflow that fails by design. It also pauses, resumes and cancels random
runs, and resumes runs parked `runnerNoProgress`, `workerCrashed`, `serverCrashLoop` or
`paused` (the operator's job).

**Kills.** After a random pause (`--min-gap`..`--max-gap` seconds of load), one SIGKILL
goes to a random target:

- `server`: the server process. It is started again at once; one server kill in five
  also kills the replacement at a random moment of its startup (during recovery, or just
  after it became ready), counted as a second kill (`server-startup`).
- `runner`: a live `piw-runner` process whose ancestor is this server (its zygote's
  child). If none lives for 3 s, the kill goes to the server instead.
- `client`: the client subprocess, 0 to 30 ms after it was handed a command (`run.start`
  or `run.cancel`), usually while the command is in flight. The next client re-sends every
  command whose answer it never saw, with the same idempotency key.

**Checks** (after every `--check-every` kills, default every kill; a check covers the
state that every kill since the previous one left behind):

1. `state verify` (the server's invariant checker) reports nothing.
2. `PRAGMA integrity_check` on a read-only (`mode=ro`) connection answers `ok`.
3. Ledger: no effect key appears twice unless its effect is `ambiguous`; every key on the
   ledger has its effect row; every `applied` ledger effect is on it exactly once; no
   `cancelled` effect is on it.
4. No run has two live runner generations (`runner_epochs` rows `starting`/`ready`), and no
   run has two live runner processes for longer than `LEAK_GRACE_S`.
5. No run is `starting`/`running` under a claim that the live server does not own.
6. No acknowledged command receipt is lost: every receipt acknowledged since the last
   check, and a sample of older ones, is re-sent with the same client ID and key, and must
   come back `adopted` with the same receipt (the same run ID for `run.start`).
7. No marked process outlives `LEAK_GRACE_S` outside the live server's process tree.

**Settling.** After the last kill, the controller stops starting runs, answers every
checkpoint, resumes what an operator would resume, and waits until every run is final.
Allowed final states: `completed`; `cancelled` only with an acknowledged `run.cancel`
receipt; `failed` (`nodeFailed`) only for `soak-doomed`; parked `effectAmbiguous` only for
the workflows that have an effect without read-back. Every acknowledged receipt is then
re-sent, the runs in the database must be exactly those the acknowledged `run.start` and
`run.answer` receipts name, and the checks above run once more, strictly.

`--max-seconds` bounds the whole soak: kills stop early so that settling keeps at least
`settle_reserve` seconds; a soak that cannot settle in time is a violation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

if __package__ in (None, ""):  # run as a script: make `tests.soak` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pi_workflows.wire.client import HostUnavailableError, WorkflowClient
from tests.soak.workflows import FAILS_BY_DESIGN, MAY_BE_AMBIGUOUS, SOURCES, WEIGHTS

MARK_ENV = "PI_WORKFLOWS_SOAK_MARK"
LEAK_GRACE_S = 20.0
"""How long a process outside the live server's tree, or a second runner of one run, may
live: the dead server's zygote stops its runners when its channel closes, recovery stops
recorded ones by identity, and a fenced runner gets up to 10 s of SIGTERM grace."""
SERVER_READY_TIMEOUT_S = 60.0
CLIENT_READY_TIMEOUT_S = 30.0
RUNNER_WAIT_S = 3.0
RESUMABLE_PARKS = frozenset(
    {"runnerNoProgress", "workerCrashed", "paused", "serverRecovered", "serverCrashLoop"}
)
TERMINAL = frozenset({"completed", "failed", "timed_out", "cancelled"})
OLD_RECEIPT_SAMPLE = 10
PROGRESS_EVERY = 50


# --- the client subprocess ----------------------------------------------------------------


def client_worker(state_dir: Path, client_id: str) -> int:
    """`_client` mode: one JSON command per stdin line, one JSON answer per stdout line."""
    client = WorkflowClient(state_dir, client_id=client_id, autostart=False, timeout=60)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        answer: dict[str, Any] = {"seq": command["seq"]}
        try:
            response = client.request(
                command["op"],
                command["payload"],
                run_id=command.get("runId"),
                idempotency_key=command["key"],
            )
        except HostUnavailableError as exc:
            answer["unavailable"] = str(exc)
        else:
            answer["outcome"] = response["outcome"]
            answer["receipt"] = response.get("receipt")
            answer["error"] = response.get("error")
        print(json.dumps(answer), flush=True)
    return 0


# --- controller records -------------------------------------------------------------------


@dataclass
class Command:
    """One client command; re-sent with the same key until its answer is seen."""

    op: str
    key: str
    payload: dict[str, Any]
    run_id: str | None = None
    seq: int = 0


@dataclass
class Ack:
    """An acknowledged (accepted or adopted) command and the receipt it got."""

    command: Command
    receipt: dict[str, Any]
    at_kill: int


@dataclass
class RunRow:
    run_id: str
    workflow: str
    status: str
    paused: bool
    queue_state: str
    park_reason: str | None
    failure_class: str | None
    continuation_of: str | None
    revision: int


@dataclass
class Stats:
    kills: Counter[str] = field(default_factory=Counter)
    client_kills_in_flight: int = 0
    commands: Counter[str] = field(default_factory=Counter)
    resent: int = 0
    unavailable: int = 0
    checks: int = 0
    receipts_rechecked: int = 0
    ambiguous_duplicates: int = 0
    check_seconds: float = 0.0


class ClientProcess:
    """The client subprocess and a thread that forwards its answers to a queue."""

    def __init__(self, state_dir: Path, client_id: str, env: dict[str, str], log: Path) -> None:
        self._stderr = log.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "_client", str(state_dir), client_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.pending: dict[int, Command] = {}
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, name="soak-client-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        # A killed client's pipe is closed by the controller while this thread may still
        # be reading it: that is the end of its answers, not an error.
        with contextlib.suppress(ValueError, OSError):
            for line in self.popen.stdout:
                with contextlib.suppress(json.JSONDecodeError):
                    message = json.loads(line)
                    if message.get("ready"):
                        self.ready.set()
                    else:
                        self.answers.put(message)
        self.answers.put(None)

    def send(self, command: Command) -> bool:
        assert self.popen.stdin is not None
        self.pending[command.seq] = command
        try:
            self.popen.stdin.write(
                json.dumps(
                    {
                        "seq": command.seq,
                        "op": command.op,
                        "key": command.key,
                        "payload": command.payload,
                        "runId": command.run_id,
                    }
                )
                + "\n"
            )
            self.popen.stdin.flush()
        except (BrokenPipeError, OSError):
            return False
        return True

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._stderr.close()


class SoakError(Exception):
    """The soak cannot go on (a server that does not start, for example)."""


# --- the soak -------------------------------------------------------------------------------


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.seed: int = args.seed
        self.rng = random.Random(self.seed)
        self.kills_wanted: int = args.kills
        self.max_seconds: float = args.max_seconds
        self.check_every: int = max(1, args.check_every)
        self.active_target: int = args.active
        self.max_workers: int = args.max_workers
        self.min_gap: float = args.min_gap
        self.max_gap: float = args.max_gap
        self.quiet: bool = args.quiet
        self.keep = args.keep or args.state_dir is not None
        if args.state_dir is not None:
            self.root = Path(args.state_dir).absolute()
            self.root.mkdir(parents=True, exist_ok=True)
            self.own_root = False
        else:
            self.root = Path(tempfile.mkdtemp(prefix="piw-soak-", dir="/tmp"))
            self.own_root = True
        self.state_dir = self.root / "agent" / "workflows"
        self.project = self.root / "project"
        self.ledger = self.project / "ledger.txt"
        self.soak_logs = self.root / "soak-logs"
        self.mark = f"soak-{self.seed}-{uuid.uuid4().hex[:10]}"
        self.client_id = f"soak-{self.seed}-{uuid.uuid4().hex[:6]}"
        base = {k: v for k, v in os.environ.items() if not k.startswith("PI_WORKFLOWS_CRASH")}
        base.pop(MARK_ENV, None)
        base["PI_CODING_AGENT_DIR"] = str(self.state_dir.parent)
        self.client_env = dict(base)
        self.server_env = dict(base, **{MARK_ENV: self.mark})
        self.server: subprocess.Popen[bytes] | None = None
        self.servers_started = 0
        self.client: ClientProcess | None = None
        self.clients_started = 0
        self.retry: list[Command] = []
        self.busy_runs: set[str] = set()
        self.acks: dict[str, Ack] = {}
        self.unchecked_keys: list[str] = []
        self.checked_keys: list[str] = []
        self.seq = 0
        self.kill_no = 0
        self.stats = Stats()
        self.violations: list[str] = []
        self._reported: set[str] = set()
        self._suspects: dict[str, float] = {}
        self._waiting_since: dict[str, float] = {}
        self.started = time.monotonic()
        self._last_runs: list[RunRow] = []
        self._last_read = 0.0
        self._checker: Any = None

    # --- setup and teardown ----------------------------------------------------------------

    def setup(self) -> None:
        folder = self.project / ".pi" / "workflows"
        folder.mkdir(parents=True, exist_ok=True)
        for name, source in SOURCES.items():
            (folder / f"{name}.workflow.py").write_text(source)
        self.ledger.touch()
        self.soak_logs.mkdir(parents=True, exist_ok=True)

    def teardown(self) -> None:
        if self._checker is not None:
            with contextlib.suppress(Exception):
                self._checker.close()
        if self.client is not None:
            self.client.kill()
        self._kill_server(graceful=True)
        self._kill_marked()

    def _kill_marked(self) -> None:
        """SIGKILL, by PID, every process that carries this soak's marker."""
        for process in self._marked_processes():
            with contextlib.suppress(psutil.Error):
                process.kill()
        for process in self._marked_processes():
            with contextlib.suppress(psutil.Error):
                process.wait(10)

    def _marked_processes(self) -> list[psutil.Process]:
        found = []
        me = os.getuid()
        for process in psutil.process_iter(["uids"]):
            try:
                uids = process.info["uids"]
                if uids is None or uids.real != me or process.pid == os.getpid():
                    continue
                if process.environ().get(MARK_ENV) == self.mark:
                    found.append(process)
            except psutil.Error:
                continue
        return found

    # --- server ---------------------------------------------------------------------------------

    def start_server(self, *, kill_after: float | None = None) -> bool:
        """Start a server; with `kill_after`, SIGKILL it that long after spawning instead.

        Returns whether it is up (always False with `kill_after`).
        """
        self.servers_started += 1
        log = (self.soak_logs / f"server-{self.servers_started}.err").open("ab")
        try:
            self.server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pi_workflows.cli",
                    "--state-dir",
                    str(self.state_dir),
                    "server",
                    "run",
                    "--idle-exit",
                    "0",
                    "--max-workers",
                    str(self.max_workers),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.server_env,
                start_new_session=True,
            )
        finally:
            log.close()
        if kill_after is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.server.wait(kill_after)  # it never exits on its own: a paced wait
            self._kill_server()
            return False
        line = _read_line(self.server.stdout, SERVER_READY_TIMEOUT_S)
        if "running" not in line:
            code = self.server.poll()
            raise SoakError(
                f"server {self.servers_started} did not start (line {line!r}, exit {code}); "
                f"see {self.soak_logs}/server-{self.servers_started}.err and "
                f"{self.state_dir}/logs/server.log"
            )
        return True

    def _kill_server(self, *, graceful: bool = False) -> None:
        server, self.server = self.server, None
        if server is None:
            return
        if server.poll() is None:
            if graceful:
                with contextlib.suppress(ProcessLookupError):
                    server.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.wait(30)
            if server.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(server.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(10)
        if server.stdout is not None:
            server.stdout.close()
        if self._checker is not None:
            with contextlib.suppress(Exception):
                self._checker.close()
            self._checker = None

    def server_pid(self) -> int | None:
        return self.server.pid if self.server is not None and self.server.poll() is None else None

    def live_runners(self) -> list[psutil.Process]:
        pid = self.server_pid()
        if pid is None:
            return []
        try:
            tree = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            return []
        runners = []
        for process in tree:
            with contextlib.suppress(psutil.Error):
                if process.name() == "piw-runner" and process.status() != psutil.STATUS_ZOMBIE:
                    runners.append(process)
        return runners

    # --- client -----------------------------------------------------------------------------

    def ensure_client(self) -> ClientProcess:
        if self.client is not None and self.client.alive():
            return self.client
        if self.client is not None:
            self._client_gone()
        self.clients_started += 1
        self.client = ClientProcess(
            self.state_dir,
            self.client_id,
            self.client_env,
            self.soak_logs / f"client-{self.clients_started}.err",
        )
        if not self.client.ready.wait(CLIENT_READY_TIMEOUT_S):
            raise SoakError("the client subprocess did not become ready")
        return self.client

    def _client_gone(self) -> None:
        """The client died: everything it had in flight is re-sent with its key."""
        client, self.client = self.client, None
        if client is None:
            return
        self._drain(client)
        client.kill()
        self.retry.extend(client.pending.values())
        client.pending.clear()

    def issue(self, command: Command) -> None:
        if not command.seq:
            self.stats.commands[command.op] += 1
        self.seq += 1
        command.seq = self.seq
        if command.run_id is not None:
            self.busy_runs.add(command.run_id)
        client = self.ensure_client()
        if not client.send(command):
            self._client_gone()

    def _drain(self, client: ClientProcess) -> None:
        while True:
            try:
                answer = client.answers.get_nowait()
            except queue.Empty:
                return
            if answer is None:
                return
            command = client.pending.pop(answer["seq"], None)
            if command is not None:
                self._settle(command, answer)

    def _settle(self, command: Command, answer: dict[str, Any]) -> None:
        if "unavailable" in answer:
            self.stats.unavailable += 1
            self.retry.append(command)
            return
        if command.run_id is not None:
            self.busy_runs.discard(command.run_id)
        outcome = answer["outcome"]
        if outcome in ("accepted", "adopted"):
            receipt = answer["receipt"] or {}
            if command.key not in self.acks:
                self.acks[command.key] = Ack(command, receipt, self.kill_no)
                self.unchecked_keys.append(command.key)
            elif self.acks[command.key].receipt != receipt:
                self.violate(
                    f"receipt of {command.op} key {command.key} changed: "
                    f"{self.acks[command.key].receipt} then {receipt}"
                )
        elif outcome == "conflict":
            self.violate(f"{command.op} key {command.key} answered conflict: {answer['error']}")
        elif command.op == "run.start":
            self.violate(f"run.start key {command.key} answered {outcome}: {answer['error']}")
        # Other refusals (a cancel of a run that just completed) change nothing.

    def pump(self, timeout: float) -> None:
        """Handle answers for up to `timeout` seconds, then re-send what was unanswered."""
        deadline = time.monotonic() + timeout
        while True:
            client = self.client
            if client is not None:
                remaining = deadline - time.monotonic()
                try:
                    answer = client.answers.get(timeout=max(0.0, remaining))
                except queue.Empty:
                    answer = {}
                if answer is None:
                    self._client_gone()
                elif answer:
                    command = client.pending.pop(answer["seq"], None)
                    if command is not None:
                        self._settle(command, answer)
            else:
                _pause(max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline:
                break
        if self.retry and self.server_pid() is not None:
            again, self.retry = self.retry, []
            for command in again:
                self.stats.resent += 1
                self.issue(command)

    # --- load ----------------------------------------------------------------------------------

    def read_runs(self) -> list[RunRow]:
        with _readonly(self.state_dir) as db:
            rows = db.execute(
                "SELECT r.run_id, r.workflow_name, r.status, r.paused, q.state, q.park_reason, "
                "r.failure_class, r.continuation_of, r.revision "
                "FROM runs r JOIN run_queue q USING (run_id)"
            ).fetchall()
        return [RunRow(row[0], row[1], row[2], bool(row[3]), *row[4:]) for row in rows]

    def nonterminal_runs(self) -> list[RunRow]:
        with _readonly(self.state_dir) as db:
            rows = db.execute(
                "SELECT r.run_id, r.workflow_name, r.status, r.paused, q.state, q.park_reason, "
                "r.failure_class, r.continuation_of, r.revision "
                "FROM runs r JOIN run_queue q USING (run_id) "
                "WHERE r.status IN ('queued', 'running', 'waiting')"
            ).fetchall()
        return [RunRow(row[0], row[1], row[2], bool(row[3]), *row[4:]) for row in rows]

    def drive(self, *, start_new: bool) -> list[RunRow]:
        """One round of operator and user behaviour; returns the nonterminal runs."""
        if self.server_pid() is None:
            return []
        runs = self.nonterminal_runs()
        now = time.monotonic()
        pending_starts = sum(
            1
            for command in self._in_flight()
            if command.op == "run.start" and command.key not in self.acks
        )
        active = [r for r in runs if r.status in ("queued", "running") and not r.park_reason]
        if start_new:
            for _ in range(max(0, self.active_target - len(active) - pending_starts)):
                self.start_run()
        for run in runs:
            if run.run_id in self.busy_runs:
                continue
            if run.paused:
                if not start_new or self.rng.random() < 0.3:
                    self.issue(
                        Command("run.resume", f"resume-{run.run_id}-{run.revision}", {}, run.run_id)
                    )
                continue
            if run.status == "waiting":
                since = self._waiting_since.setdefault(run.run_id, now)
                if not start_new or now - since > self.rng.uniform(0.2, 2.0):
                    self.issue(
                        Command(
                            "run.answer",
                            f"answer-{run.run_id}",
                            {"answer": {"go": True}},
                            run.run_id,
                        )
                    )
                continue
            if run.queue_state == "parked" and run.park_reason in RESUMABLE_PARKS:
                self.issue(
                    Command("run.resume", f"resume-{run.run_id}-{run.revision}", {}, run.run_id)
                )
                continue
            if start_new and run.queue_state in ("queued", "starting", "running"):
                roll = self.rng.random()
                if roll < 0.004:
                    self.issue(Command("run.cancel", f"cancel-{run.run_id}", {}, run.run_id))
                elif roll < 0.008:
                    self.issue(
                        Command("run.pause", f"pause-{run.run_id}-{run.revision}", {}, run.run_id)
                    )
        return runs

    def start_run(self) -> Command:
        names = list(WEIGHTS)
        workflow = self.rng.choices(names, weights=[WEIGHTS[n] for n in names])[0]
        command = Command(
            "run.start",
            f"start-{self.seq + 1}-{uuid.uuid4().hex[:8]}",
            {
                "workflow": workflow,
                "input": {
                    "ledger": str(self.ledger),
                    "nap": round(self.rng.uniform(0.05, 0.25), 3),
                    "n": self.seq,
                },
                "projectPath": str(self.project),
            },
        )
        self.issue(command)
        return command

    def _in_flight(self) -> list[Command]:
        pending = list(self.client.pending.values()) if self.client is not None else []
        return pending + self.retry

    # --- kills ---------------------------------------------------------------------------------

    def kill_one(self) -> str:
        target = self.rng.choice(("server", "runner", "client"))
        if target == "runner":
            deadline = time.monotonic() + RUNNER_WAIT_S
            runners = self.live_runners()
            while not runners and time.monotonic() < deadline:
                self.pump(0.05)
                self.drive(start_new=True)
                runners = self.live_runners()
            if not runners:
                target = "server"
            else:
                victim = self.rng.choice(runners)
                with contextlib.suppress(psutil.Error):
                    victim.send_signal(signal.SIGKILL)
                self.count_kill("runner")
                return "runner"
        if target == "client":
            self.kill_client()
            return "client"
        self.kill_server()
        return "server"

    def count_kill(self, target: str) -> None:
        self.kill_no += 1
        self.stats.kills[target] += 1

    def kill_server(self) -> None:
        server = self.server
        assert server is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.pid, signal.SIGKILL)
        self.count_kill("server")
        self._kill_server()
        if self.kill_no < self.kills_wanted and self.rng.random() < 0.2:
            self.start_server(kill_after=self.rng.uniform(0.0, 0.6))
            self.count_kill("server-startup")
        self.start_server()

    def kill_client(self) -> None:
        client = self.ensure_client()
        runs = [
            r for r in self._last_runs if r.status != "waiting" and r.run_id not in self.busy_runs
        ]
        if runs and self.rng.random() < 0.35:
            run = self.rng.choice(runs)
            self.issue(Command("run.cancel", f"cancel-{run.run_id}", {}, run.run_id))
        else:
            self.start_run()
        seq = self.seq
        _pause(self.rng.uniform(0.0, 0.03))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(client.popen.pid, signal.SIGKILL)
        client.popen.wait(10)
        self.count_kill("client")
        self._drain(client)
        if seq in client.pending:
            self.stats.client_kills_in_flight += 1
        self._client_gone()

    # --- checks ---------------------------------------------------------------------------------

    def violate(self, text: str) -> None:
        line = f"kill {self.kill_no}: {text}"
        if text in self._reported:
            return
        self._reported.add(text)
        self.violations.append(line)
        print(f"VIOLATION {line}", flush=True)

    def check(self, *, final: bool = False) -> None:
        began = time.monotonic()
        try:
            self._check(final=final)
        finally:
            self.stats.check_seconds += time.monotonic() - began

    def _check(self, *, final: bool) -> None:
        self.stats.checks += 1
        self.check_verify()
        self.check_database(final=final)
        self.check_receipts(everything=final)
        self.check_processes()

    def _checker_client(self) -> Any:
        if self._checker is None:
            self._checker = WorkflowClient(
                self.state_dir, client_id=self.client_id, autostart=False, timeout=120
            )
        return self._checker

    def check_verify(self) -> None:
        report = self._checker_client().call("state.verify")["receipt"]
        if not report["consistent"]:
            self.violate(f"state verify: {report['findingCount']} findings: {report['findings']}")

    def check_database(self, *, final: bool) -> None:
        lines_before = _ledger_counts(self.ledger)
        with _readonly(self.state_dir) as db:
            db.execute("BEGIN")
            integrity = [row[0] for row in db.execute("PRAGMA integrity_check").fetchall()]
            effects = {
                key: (state, run_id)
                for key, state, run_id in db.execute(
                    "SELECT idempotency_key, state, run_id FROM effects "
                    "WHERE effect_type = 'ledger.append'"
                )
            }
            doubles = db.execute(
                "SELECT run_id, COUNT(*) FROM runner_epochs WHERE status IN ('starting', 'ready') "
                "GROUP BY run_id HAVING COUNT(*) > 1"
            ).fetchall()
            lease = db.execute("SELECT owner_id, pid FROM server_lease").fetchone()
            foreign = db.execute(
                "SELECT q.run_id, q.state, l.owner_id FROM run_queue q "
                "LEFT JOIN leases l ON l.resource = q.run_id "
                "WHERE q.state IN ('starting', 'running') "
                "AND (l.owner_id IS NULL OR l.owner_id != :owner)",
                {"owner": lease[0] if lease else ""},
            ).fetchall()
            db.execute("COMMIT")
        lines_after = _ledger_counts(self.ledger)
        if integrity != ["ok"]:
            self.violate(f"integrity_check: {integrity[:5]}")
        for run_id, count in doubles:
            self.violate(f"run {run_id} has {count} live runner generations")
        if lease is not None and lease[1] != self.server_pid():
            self.violate(
                f"server lease names pid {lease[1]}, the live server is {self.server_pid()}"
            )
        for run_id, state, owner in foreign:
            self.violate(f"run {run_id} is {state} under a claim the live server lacks ({owner})")
        for key in lines_before:
            if key not in effects:
                self.violate(f"ledger key {key[:16]} has no effect row")
        for key, count in lines_after.items():
            state, run_id = effects.get(key, ("?", "?"))
            if count > 1 and state == "ambiguous":
                self._note_ambiguous_double(key)
            elif count > 1 and (state != "applying" or final):
                self.violate(f"ledger key {key[:16]} of run {run_id} applied {count}x ({state})")
        for key, (state, run_id) in effects.items():
            count = lines_after.get(key, 0)
            if state == "applied" and count != 1:
                self.violate(f"applied effect {key[:16]} of run {run_id} is on the ledger {count}x")
            if state == "cancelled" and count:
                self.violate(f"cancelled effect {key[:16]} of run {run_id} is on the ledger")
            if final and state in ("pending", "applying"):
                self.violate(f"effect {key[:16]} of run {run_id} left {state}")

    def _note_ambiguous_double(self, key: str) -> None:
        marker = f"ambiguous-double {key}"
        if marker not in self._reported:
            self._reported.add(marker)
            self.stats.ambiguous_duplicates += 1

    def check_receipts(self, *, everything: bool) -> None:
        keys = list(self.unchecked_keys)
        if everything:
            keys += self.checked_keys
        elif self.checked_keys:
            keys += self.rng.sample(
                self.checked_keys, min(OLD_RECEIPT_SAMPLE, len(self.checked_keys))
            )
        client = self._checker_client()
        for key in keys:
            ack = self.acks[key]
            command = ack.command
            response = client.request(
                command.op, command.payload, run_id=command.run_id, idempotency_key=command.key
            )
            self.stats.receipts_rechecked += 1
            if response["outcome"] != "adopted" or response.get("receipt") != ack.receipt:
                self.violate(
                    f"receipt of {command.op} key {key} (acknowledged after kill {ack.at_kill}) "
                    f"lost: re-send answered {response['outcome']} {response.get('receipt')} "
                    f"{response.get('error')}, first receipt {ack.receipt}"
                )
        self.checked_keys.extend(self.unchecked_keys)
        self.unchecked_keys = []

    def check_processes(self) -> None:
        """Marked processes outside the live server's tree, and two runners of one run."""
        server = self.server_pid()
        tree: set[int] = set()
        if server is not None:
            with contextlib.suppress(psutil.Error):
                tree = {server} | {p.pid for p in psutil.Process(server).children(recursive=True)}
        now = time.monotonic()
        seen: set[str] = set()
        for process in self._marked_processes():
            with contextlib.suppress(psutil.Error):
                if process.status() == psutil.STATUS_ZOMBIE or process.pid in tree:
                    continue
                label = f"leak {process.pid}/{process.create_time()} {process.name()}"
                seen.add(label)
        seen |= self._double_runners()
        for label in list(self._suspects):
            if label not in seen:
                del self._suspects[label]
        for label in seen:
            first = self._suspects.setdefault(label, now)
            if now - first > LEAK_GRACE_S:
                self.violate(f"{label} outlived {LEAK_GRACE_S:.0f} s")

    def _double_runners(self) -> set[str]:
        runners = {p.pid for p in self.live_runners()}
        if len(runners) < 2:
            return set()
        marks = ",".join("?" * len(runners))
        with _readonly(self.state_dir) as db:
            rows = db.execute(
                f"SELECT pid, run_id FROM runner_epochs WHERE pid IN ({marks}) ORDER BY started_at",
                sorted(runners),
            ).fetchall()
        owner = {pid: run_id for pid, run_id in rows}  # the newest row of a reused PID wins
        per_run: dict[str, list[int]] = {}
        for pid, run_id in owner.items():
            per_run.setdefault(run_id, []).append(pid)
        return {
            f"run {run_id} has live runner processes {sorted(pids)}"
            for run_id, pids in per_run.items()
            if len(pids) > 1
        }

    # --- phases -----------------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def settle_reserve(self) -> float:
        return min(90.0, max(20.0, self.max_seconds * 0.25))

    def run(self) -> int:
        self.setup()
        self.start_server()
        self.ensure_client()
        next_kill = time.monotonic() + self.rng.uniform(self.min_gap, self.max_gap)
        kill_budget = self.max_seconds - self.settle_reserve()
        since_check = 0
        while self.kill_no < self.kills_wanted and self.elapsed() < kill_budget:
            self.pump(0.05)
            if time.monotonic() - self._last_read > 0.2:
                self._last_runs = self.drive(start_new=True)
                self._last_read = time.monotonic()
            if time.monotonic() < next_kill:
                continue
            before = self.kill_no
            self.kill_one()
            since_check += self.kill_no - before
            self.pump(0.0)
            if since_check >= self.check_every:
                self.check()
                since_check = 0
            if self.kill_no // PROGRESS_EVERY != before // PROGRESS_EVERY and not self.quiet:
                self.progress()
            next_kill = time.monotonic() + self.rng.uniform(self.min_gap, self.max_gap)
        if since_check:
            self.check()
        settled = self.settle()
        self.check(final=True)
        if settled:
            self.final_checks()
        return 1 if self.violations else 0

    def progress(self) -> None:
        runs = self.read_runs()
        statuses = Counter(r.status for r in runs)
        print(
            f"[{self.elapsed():7.1f} s] kills {self.kill_no} {dict(self.stats.kills)} "
            f"runs {len(runs)} {dict(statuses)} violations {len(self.violations)}",
            flush=True,
        )

    def settle(self) -> bool:
        deadline = self.started + self.max_seconds
        while time.monotonic() < deadline:
            self.pump(0.1)
            runs = self.drive(start_new=False)
            if self._in_flight() or self.server_pid() is None:
                continue
            if all(not self._unsettled(run) for run in runs):
                return True
        unsettled = [r for r in self.nonterminal_runs() if self._unsettled(r)]
        self.violate(
            f"{len(unsettled)} runs did not settle within --max-seconds "
            f"({self.max_seconds:.0f} s): "
            + ", ".join(
                f"{r.run_id} {r.status}/{r.queue_state}/{r.park_reason}" for r in unsettled[:10]
            )
        )
        return False

    @staticmethod
    def _is_ambiguous(run: RunRow) -> bool:
        return run.status not in TERMINAL and run.park_reason == "effectAmbiguous"

    @staticmethod
    def _unsettled(run: RunRow) -> bool:
        if run.status in TERMINAL:
            return False
        return not (run.queue_state == "parked" and run.park_reason == "effectAmbiguous")

    def final_checks(self) -> None:
        runs = self.read_runs()
        cancelled = {a.command.run_id for a in self.acks.values() if a.command.op == "run.cancel"}
        for run in runs:
            where = f"run {run.run_id} ({run.workflow})"
            if run.status == "completed":
                continue
            if run.status == "cancelled":
                if run.run_id not in cancelled:
                    self.violate(f"{where} is cancelled without an acknowledged run.cancel")
            elif run.status == "failed":
                if run.workflow not in FAILS_BY_DESIGN or run.failure_class != "nodeFailed":
                    self.violate(f"{where} failed ({run.failure_class})")
            elif run.park_reason == "effectAmbiguous" and run.queue_state == "parked":
                if run.workflow not in MAY_BE_AMBIGUOUS:
                    self.violate(f"{where} is ambiguous, but its effects have a read-back")
            else:
                self.violate(f"{where} ended {run.status}/{run.queue_state}/{run.park_reason}")
        roots = {r.run_id for r in runs if r.continuation_of is None}
        continuations = {r.run_id for r in runs if r.continuation_of is not None}
        started = {
            str(a.receipt.get("runId")) for a in self.acks.values() if a.command.op == "run.start"
        }
        answered = {
            str(a.receipt.get("continuationRunId"))
            for a in self.acks.values()
            if a.command.op == "run.answer"
        }
        if roots != started:
            self.violate(
                f"runs without a start receipt {sorted(roots - started)[:5]}, "
                f"start receipts without a run {sorted(started - roots)[:5]}"
            )
        if continuations != answered:
            self.violate(
                f"continuations without an answer receipt {sorted(continuations - answered)[:5]}, "
                f"answer receipts without a run {sorted(answered - continuations)[:5]}"
            )
        self._await_no_leaks()

    def _await_no_leaks(self) -> None:
        """At the end every suspect must be gone within the grace, or it is reported."""
        deadline = time.monotonic() + LEAK_GRACE_S + 1.0
        self.check_processes()
        while self._suspects and time.monotonic() < deadline:
            _pause(0.2)
            self.check_processes()

    def summary(self, code: int) -> None:
        try:
            runs = self.read_runs()
        except sqlite3.Error:
            runs = []
        statuses = Counter(
            "ambiguous"
            if r.park_reason == "effectAmbiguous" and r.status not in TERMINAL
            else r.status
            for r in runs
        )
        ambiguous_effects = 0
        with contextlib.suppress(sqlite3.Error), _readonly(self.state_dir) as db:
            ambiguous_effects = db.execute(
                "SELECT COUNT(*) FROM effects WHERE state = 'ambiguous'"
            ).fetchone()[0]
        ledger = _ledger_counts(self.ledger)
        print("=== soak summary ===")
        print(f"seed: {self.seed}")
        print(
            f"kills: {self.kill_no} {dict(sorted(self.stats.kills.items()))} "
            f"(client kills with the command still unanswered: {self.stats.client_kills_in_flight})"
        )
        print(f"servers started: {self.servers_started}, clients started: {self.clients_started}")
        print(f"runs: {len(runs)} {dict(sorted(statuses.items()))}")
        print(
            f"ambiguous: {statuses.get('ambiguous', 0)} runs, {ambiguous_effects} effects "
            f"(ledger keys written twice under an ambiguous effect: "
            f"{self.stats.ambiguous_duplicates})"
        )
        print(f"ledger keys: {len(ledger)}, lines: {sum(ledger.values())}")
        print(
            f"commands: {dict(sorted(self.stats.commands.items()))}, re-sent after a lost answer: "
            f"{self.stats.resent}, server unavailable: {self.stats.unavailable}"
        )
        print(
            f"checks: {self.stats.checks} ({self.stats.check_seconds:.1f} s), "
            f"receipts re-sent to check: {self.stats.receipts_rechecked}"
        )
        print(f"violations: {len(self.violations)}")
        for line in self.violations:
            print(f"  {line}")
        print(f"wall time: {self.elapsed():.1f} s")
        print(f"exit: {code}", flush=True)


# --- helpers ------------------------------------------------------------------------------------


def _pause(seconds: float) -> None:
    """Let the load run for a while (the soak's pacing, not a wait for a condition)."""
    threading.Event().wait(seconds)


def _read_line(stream: IO[bytes] | None, timeout: float) -> str:
    assert stream is not None
    fd = stream.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace")


@contextlib.contextmanager
def _readonly(state_dir: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to the live database (safe beside the server's WAL writer)."""
    db = sqlite3.connect(
        f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True, timeout=30, isolation_level=None
    )
    try:
        yield db
    finally:
        db.close()


def _ledger_counts(path: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    with contextlib.suppress(FileNotFoundError), path.open(encoding="utf-8") as ledger:
        for line in ledger:
            if line.strip():
                counts[line.split(" ", 1)[0]] += 1
    return counts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs to deliver")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="bound on the wall time")
    parser.add_argument("--state-dir", default=None, help="folder to work in (kept afterwards)")
    parser.add_argument("--check-every", type=int, default=1, help="kills between checks")
    parser.add_argument("--active", type=int, default=6, help="runs to keep going")
    parser.add_argument("--max-workers", type=int, default=4, help="server execution capacity")
    parser.add_argument("--min-gap", type=float, default=0.1, help="least load between kills (s)")
    parser.add_argument("--max-gap", type=float, default=1.2, help="most load between kills (s)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**32)
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the soak; returns the exit code (0: no violation)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_client"]:
        return client_worker(Path(argv[1]), argv[2])
    args = parse_args(argv)
    print(f"soak seed {args.seed}", flush=True)
    soak = Soak(args)
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_on_sigterm)
    code = 2
    try:
        code = soak.run()
    except SoakError as exc:
        soak.violate(f"soak could not go on: {exc}")
        code = 2
    finally:
        soak.teardown()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
        soak.summary(code)
        if soak.violations or soak.keep:
            print(f"state kept in {soak.root}", flush=True)
        elif soak.own_root:
            shutil.rmtree(soak.root, ignore_errors=True)
    return code


def _raise_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
