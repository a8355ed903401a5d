"""A run that kills its server: server deaths count against the runs in flight on it.

Real detached servers (`server start`), a real runner whose compute node SIGKILLs the
server (its PID read from `host/server.lock`), and startup recovery on every restart.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows.domain._runner_exits import MAX_RUNNER_CRASHES
from tests.conftest import Processes, write_workflow

pytestmark = pytest.mark.timeout(240)

KILLER_WORKFLOW = """
import os
import signal
import time
from pathlib import Path

from pi_workflows import compute, define_workflow


def kill_the_server(ctx):
    if Path(ctx.input["marker"]).exists():
        os.kill(int(Path(ctx.input["lock"]).read_text()), signal.SIGKILL)
        time.sleep(60)  # the zygote ends this runner together with its server
    return {"spared": True}


workflow = define_workflow(
    name="killer", start_at="kill", nodes={"kill": compute(kill_the_server, timeout=120)}
)
"""


def _server_pid(state_dir: Path) -> int:
    return int((state_dir / "host" / "server.lock").read_text().strip())


def _start_server(processes: Processes, state_dir: Path) -> int:
    started = processes.cli(state_dir, "server", "start")
    assert started.returncode == 0, started.stderr
    pid = _server_pid(state_dir)
    processes.adopt(pid)
    return pid


def _wait_gone(pid: int, timeout: float = 60) -> None:
    """Wait until the process is gone (or a zombie nobody reaped yet)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        assert time.monotonic() < deadline, "the run never killed its server"
        pause.wait(0.05)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_settled(processes: Processes, state_dir: Path, run_id: str) -> dict[str, Any]:
    waited = processes.cli(state_dir, "run", "wait", run_id, "--timeout", "90", "--json")
    assert waited.returncode in (0, 1), waited.stderr
    return dict(json.loads(waited.stdout))


def test_a_run_that_kills_every_server_parks_and_the_next_server_stays_up(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "killer", KILLER_WORKFLOW)
    marker = short_tmp / "keep-killing"
    marker.touch()
    workflow_input = {"marker": str(marker), "lock": str(state_dir / "host" / "server.lock")}

    pid = _start_server(processes, state_dir)
    started = processes.cli(
        state_dir, "run", "start", "killer", "--project", str(project),
        "--input-json", json.dumps(workflow_input),
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    _wait_gone(pid)
    for _ in range(MAX_RUNNER_CRASHES - 1):  # each restart requeues the run; it kills again
        _wait_gone(_start_server(processes, state_dir))

    # The death that reaches the limit: the next server parks the run and stays up.
    pid = _start_server(processes, state_dir)
    parked = _wait_settled(processes, state_dir, run_id)
    assert parked["display"]["reason"] == "serverCrashLoop"
    assert parked["status"] == "running"  # parked, not failed: nothing was lost
    status = json.loads(processes.cli(state_dir, "server", "status", "--json").stdout)
    assert status["state"] == "running" and status["runs"]["parked"] == 1
    assert _alive(pid)

    # `run resume` admits it once more: it kills that server, and the next one parks it
    # again at once (the count is kept until a node finishes).
    resumed = processes.cli(state_dir, "run", "resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    _wait_gone(pid)
    pid = _start_server(processes, state_dir)
    again = _wait_settled(processes, state_dir, run_id)
    assert again["display"]["reason"] == "serverCrashLoop"
    assert again["generation"] > parked["generation"]

    cancelled = processes.cli(state_dir, "run", "cancel", run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    final = _wait_settled(processes, state_dir, run_id)
    assert final["display"]["status"] == "cancelled"
    assert _alive(pid)
    processes.cli(state_dir, "server", "stop")


def test_a_resumed_run_whose_cause_is_fixed_completes(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "killer", KILLER_WORKFLOW)
    marker = short_tmp / "keep-killing"
    marker.touch()
    workflow_input = {"marker": str(marker), "lock": str(state_dir / "host" / "server.lock")}
    pid = _start_server(processes, state_dir)
    started = processes.cli(
        state_dir, "run", "start", "killer", "--project", str(project),
        "--input-json", json.dumps(workflow_input),
    )  # fmt: skip
    run_id = started.stdout.strip()
    for _ in range(MAX_RUNNER_CRASHES):
        _wait_gone(pid)
        pid = _start_server(processes, state_dir)
    assert _wait_settled(processes, state_dir, run_id)["display"]["reason"] == "serverCrashLoop"

    marker.unlink()  # the operator fixes the cause, then resumes
    assert processes.cli(state_dir, "run", "resume", run_id).returncode == 0
    done = _wait_settled(processes, state_dir, run_id)
    assert done["display"]["status"] == "completed"
    assert _alive(pid)
    processes.cli(state_dir, "server", "stop")
