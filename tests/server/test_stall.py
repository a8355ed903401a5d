"""A stalled server (SIGSTOP past its lease, then SIGCONT) carries on under the next epoch.

A real `server run` process with its lease shortened by `PI_WORKFLOWS_SERVER_LEASE_MS`,
real runners mid-node while it is stopped, and a real competitor: a second server that
took the state folder while the first was stopped (its lock file was replaced).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pi_workflows.server._server import SERVER_LEASE_ENV
from tests.conftest import Processes, wait_for_attempt, write_workflow

pytestmark = pytest.mark.timeout(180)

LEASE_MS = 1_500

GATE_WORKFLOW = """
import time
from pathlib import Path

from pi_workflows import compute, define_workflow


def wait_for_gate(ctx):
    gate = Path(ctx.input["gate"])
    while not gate.exists():  # the test opens the gate while the server is stopped
        time.sleep(0.05)
    return {"through": True}


workflow = define_workflow(
    name="gate",
    start_at="wait",
    nodes={
        "wait": compute(wait_for_gate, timeout=120),
        "after": compute(lambda ctx: {"done": True}),
    },
    edges=[{"from": "wait", "to": "after"}],
)
"""


def _lease(state_dir: Path) -> tuple[int, int]:
    """(epoch, expires_at) of the stored server lease, read-only."""
    database = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        row = database.execute(
            "SELECT epoch, expires_at FROM server_lease WHERE singleton = 1"
        ).fetchone()
    finally:
        database.close()
    return int(row[0]), int(row[1])


def _wait_past(expires_at_ms: int) -> None:
    """Wait until the wall clock is past the stored expiry (the lease has lapsed)."""
    pause = threading.Event()
    while (remaining := expires_at_ms + 300 - time.time() * 1000) > 0:
        pause.wait(remaining / 1000)


def _serve(processes: Processes, state_dir: Path) -> subprocess.Popen[str]:
    child = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0")
    assert child.stdout is not None
    line = child.stdout.readline()
    assert "running" in line, f"the server did not start: {line!r}"
    return child


def _start_gated_runs(
    processes: Processes, state_dir: Path, project: Path, gate: Path, count: int
) -> list[str]:
    run_ids = []
    for _ in range(count):
        started = processes.cli(
            state_dir, "run", "start", "gate", "--project", str(project),
            "--input-json", json.dumps({"gate": str(gate)}),
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        run_ids.append(started.stdout.strip())
    for run_id in run_ids:
        wait_for_attempt(state_dir, run_id)  # each runner is inside its first node
    return run_ids


def _wait_completed(processes: Processes, state_dir: Path, run_id: str) -> dict[str, Any]:
    waited = processes.cli(state_dir, "run", "wait", run_id, "--timeout", "60", "--json")
    document = dict(json.loads(waited.stdout))
    assert document["display"]["status"] == "completed", document
    return document


def _log_actions(state_dir: Path) -> list[dict[str, Any]]:
    lines = (state_dir / "logs" / "server.log").read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch, short_tmp: Path) -> tuple[Path, Path]:
    monkeypatch.setenv(SERVER_LEASE_ENV, str(LEASE_MS))
    project = short_tmp / "project"
    write_workflow(project, "gate", GATE_WORKFLOW)
    return project, short_tmp / "gate-open"


def test_a_server_stopped_past_its_lease_continues_and_its_runs_complete(
    processes: Processes, state_dir: Path, gated: tuple[Path, Path]
) -> None:
    project, gate = gated
    server = _serve(processes, state_dir)
    run_ids = _start_gated_runs(processes, state_dir, project, gate, 2)
    epoch, expires_at = _lease(state_dir)

    os.kill(server.pid, signal.SIGSTOP)
    try:
        _wait_past(expires_at)
        gate.touch()  # the runners go on while their server is stopped
    finally:
        os.kill(server.pid, signal.SIGCONT)

    for run_id in run_ids:
        _wait_completed(processes, state_dir, run_id)
    assert server.poll() is None, "the stalled server stopped"
    status = json.loads(processes.cli(state_dir, "server", "status", "--json").stdout)
    assert status["state"] == "running" and status["epoch"] > epoch
    actions = [line.get("action") for line in _log_actions(state_dir)]
    assert "server.epoch_renewed" in actions and "server.lease_lost" not in actions

    server.send_signal(signal.SIGTERM)  # a graceful stop releases the new epoch's lease
    assert server.wait(30) == 0
    database = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        row = database.execute("SELECT epoch, released_at FROM server_lease").fetchone()
    finally:
        database.close()
    assert row[0] == status["epoch"] and row[1] is not None


def test_a_competitor_that_took_the_folder_during_the_stall_makes_the_stalled_server_exit(
    processes: Processes, state_dir: Path, gated: tuple[Path, Path]
) -> None:
    project, gate = gated
    stalled = _serve(processes, state_dir)
    run_ids = _start_gated_runs(processes, state_dir, project, gate, 1)
    epoch, expires_at = _lease(state_dir)

    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        _wait_past(expires_at)
        # The lock file is removed under the stopped server, so a second one can start:
        # it takes the next epoch and recovers the first one's run.
        (state_dir / "host" / "server.lock").unlink()
        competitor = _serve(processes, state_dir)
        assert _lease(state_dir)[0] == epoch + 1
    finally:
        os.kill(stalled.pid, signal.SIGCONT)

    assert stalled.wait(60) is not None, "the stalled server kept running"
    lost = [line for line in _log_actions(state_dir) if line.get("action") == "server.lease_lost"]
    assert [line.get("reason") for line in lost] == ["lockReplaced"]
    gate.touch()
    done = _wait_completed(processes, state_dir, run_ids[0])
    # Generation 1 was the stalled server's launch, 2 the competitor's recovery claim and
    # 3 its launch: once awake, the stalled server claimed nothing more before it exited.
    assert done["generation"] == 3
    assert competitor.poll() is None
    status = json.loads(processes.cli(state_dir, "server", "status", "--json").stdout)
    assert status["state"] == "running" and status["epoch"] == epoch + 1, (
        "the competitor still serves on its own socket"
    )
