"""The server as a real process: lock, epoch takeover, CLI lifecycle, status, concurrency."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows import WorkflowClient
from pi_workflows.wire.framing import SocketFrameReader, encode_frame
from tests.conftest import SLEEPY_WORKFLOW, Processes, write_workflow

pytestmark = pytest.mark.timeout(120)


def _wait_for_ready(child: Any, state_dir: Path, timeout: float = 20) -> None:
    """Wait until the server answers a hello (it prints its banner once it accepts)."""
    line = child.stdout.readline()
    assert "running" in line, f"server did not start: {line!r} {child.stderr.read()}"


def _server_lease(state_dir: Path) -> tuple[int, int, int]:
    """(epoch, acquired_at, expires_at) of the server lease, read-only."""
    database = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        row = database.execute(
            "SELECT epoch, acquired_at, expires_at FROM server_lease WHERE singleton = 1"
        ).fetchone()
    finally:
        database.close()
    return int(row[0]), int(row[1]), int(row[2])


def _server_pid(state_dir: Path) -> int:
    return int((state_dir / "host" / "server.lock").read_text().strip())


def test_two_servers_at_once_exactly_one_serves(processes: Processes, state_dir: Path) -> None:
    first = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0", "--no-execute")
    second = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0", "--no-execute")
    exited = None
    deadline = time.monotonic() + 30
    while exited is None and time.monotonic() < deadline:
        for child in (first, second):
            try:
                child.wait(0.05)  # Popen must reap its own child to see its exit code
            except subprocess.TimeoutExpired:
                continue
            exited = child
            break
    assert exited is not None, "neither server refused"
    survivor = second if exited is first else first
    assert exited.returncode == 4
    assert exited.stderr is not None
    message = exited.stderr.read()
    assert "already running" in message
    assert str(survivor.pid) in message
    assert survivor.poll() is None
    status = processes.cli(state_dir, "server", "status", "--json")
    assert json.loads(status.stdout)["state"] == "running"


def test_sigkilled_server_is_replaced_at_once_with_a_higher_epoch(
    processes: Processes, state_dir: Path
) -> None:
    first = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0", "--no-execute")
    _wait_for_ready(first, state_dir)
    epoch_before = json.loads(processes.cli(state_dir, "server", "status", "--json").stdout)[
        "epoch"
    ]
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    assert (state_dir / "host" / "host.sock").exists()  # the stale socket stays behind
    old_expiry = _server_lease(state_dir)[2]  # the dead server's lease, still unexpired
    second = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0", "--no-execute")
    _wait_for_ready(second, state_dir)
    status = json.loads(processes.cli(state_dir, "server", "status", "--json").stdout)
    assert status["epoch"] == epoch_before + 1
    epoch, acquired_at, _ = _server_lease(state_dir)
    assert epoch == epoch_before + 1
    # Not a stopwatch on a loaded machine: the recorded times show the takeover.
    assert acquired_at < old_expiry, "a crash restart must not wait out the old 15 s lease"


def test_cli_start_status_stop(processes: Processes, state_dir: Path) -> None:
    stopped = processes.cli(state_dir, "server", "status", "--json")
    assert stopped.returncode == 3  # stopped: documented, like an LSB status "not running"
    assert json.loads(stopped.stdout) == {"running": False, "state": "stopped"}
    started = processes.cli(state_dir, "server", "start")
    assert started.returncode == 0, started.stderr
    processes.adopt(_server_pid(state_dir))
    again = processes.cli(state_dir, "server", "start")
    assert "already running" in again.stdout
    status = processes.cli(state_dir, "server", "status", "--json")
    document = json.loads(status.stdout)
    assert status.returncode == 0
    assert document["running"] is True
    assert set(document) == {
        "running",
        "state",
        "epoch",
        "pid",  # the server's process ID (an operator's fact, no user data)
        "socket",
        "activeRunners",
        "runs",
        "expiredClaims",
        "pendingInteractions",
        "ambiguousEffects",
    }
    assert document["state"] == "running"
    text = status.stdout + processes.cli(state_dir, "server", "status").stdout
    assert str(state_dir) not in text and "server-" not in text  # no paths, no owner IDs
    pid = _server_pid(state_dir)
    stop = processes.cli(state_dir, "server", "stop")
    assert stop.returncode == 0, stop.stderr
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not (state_dir / "host" / "host.sock").exists()


def test_cli_commands_start_the_server_on_demand(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "demo", SLEEPY_WORKFLOW.format(name="demo"))
    started = processes.cli(
        state_dir, "run", "start", "demo", "--project", str(project), "--input-json", '{"a": 1}'
    )
    assert started.returncode == 0, started.stderr
    processes.adopt(_server_pid(state_dir))
    run_id = started.stdout.strip()
    status = processes.cli(state_dir, "run", "status", run_id, "--json")
    assert json.loads(status.stdout)["display"]["status"] in ("queued", "running")
    listed = json.loads(processes.cli(state_dir, "run", "list", "--json").stdout)
    assert [item["runId"] for item in listed["items"]] == [run_id]
    for verb in ("pause", "resume", "cancel"):
        result = processes.cli(state_dir, "run", verb, run_id)
        assert result.returncode == 0, result.stderr
    rejected = processes.cli(state_dir, "run", "pause", run_id)
    assert rejected.returncode == 1
    assert rejected.stderr.startswith("pi-workflows: rejected")
    missing = processes.cli(state_dir, "run", "status", "run-nope")
    assert missing.returncode == 1 and "notFound" in missing.stderr
    processes.cli(state_dir, "server", "stop")


def test_fifty_clients_with_random_disconnects_each_key_has_one_receipt(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "load")
    server = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0", "--no-execute")
    _wait_for_ready(server, state_dir)
    socket_path = state_dir / "host" / "host.sock"
    rng = random.Random(20261130)
    seeds = [rng.randrange(2**32) for _ in range(50)]
    answers: dict[str, list[str]] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def one_client(index: int) -> None:
        local = random.Random(seeds[index])
        client_id = f"load-{index}"
        try:
            for command in range(6):
                key = f"{client_id}-{command}"
                payload = {
                    "workflow": "load",
                    "input": {"c": index, "k": command},
                    "projectPath": str(project),
                }
                # Lose the response on purpose: send, then hang up before reading.
                if local.random() < 0.5:
                    _send_and_hang_up(socket_path, client_id, key, payload, local)
                with WorkflowClient(
                    state_dir, client_id=client_id, autostart=False, timeout=30
                ) as client:
                    answer = client.request("run.start", payload, idempotency_key=key)
                with lock:
                    answers.setdefault(key, []).append(answer["outcome"])
                    answers[key].append(answer["receipt"]["runId"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one_client, args=(i,)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert not errors, errors[:3]
    assert len(answers) == 300
    for outcome, _run_id in (entry for entry in answers.values()):
        assert outcome in ("accepted", "adopted")
    processes.cli(state_dir, "server", "stop")
    server.wait(20)
    database = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    with database:
        per_key = database.execute(
            "SELECT client_id, idempotency_key, COUNT(*) FROM host_commands "
            "WHERE operation = 'run.start' GROUP BY client_id, idempotency_key"
        ).fetchall()
        runs = database.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    database.close()
    assert len(per_key) == 300
    assert all(count == 1 for _, _, count in per_key)
    assert runs == 300, "every key made exactly one run, retries included"
    stored_run_ids = {entry[1] for entry in answers.values()}
    assert len(stored_run_ids) == 300


def _send_and_hang_up(
    socket_path: Path, client_id: str, key: str, payload: dict[str, Any], local: random.Random
) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    try:
        sock.connect(str(socket_path))
        SocketFrameReader(sock).read_message()
        request = {
            "schema": "pi-workflows.client.v1",
            "type": "request",
            "requestId": f"{key}-lost-{local.randrange(10**9)}",
            "clientId": client_id,
            "operation": "run.start",
            "idempotencyKey": key,
            "payload": payload,
        }
        sock.sendall(encode_frame(request))
    finally:
        sock.close()
