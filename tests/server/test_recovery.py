"""Startup recovery: exact identities, stale claims, processes a dead server left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.storage import (
    ManualClock,
    NewRun,
    claim_for_launch,
    enqueue_run,
    open_database,
    record_process,
)
from pi_workflows.supervision import identity_of
from tests.conftest import Processes, wait_for_attempt, write_workflow
from tests.server.runs import wait_fifo

pytestmark = pytest.mark.timeout(90)


def _new_run(run_id: str) -> NewRun:
    return NewRun(
        run_id=run_id,
        workflow_name="example",
        project_path="/project",
        source_identity={"root": {"kind": "file", "path": "/p/x.workflow.py", "hash": "h"}},
        definition_digest="sha256:def",
        input_hash="sha256:input",
        input={},
    )


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for child in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)


def _sleeper(sleepers: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    sleepers.append(child)
    return child


def test_recovery_stops_only_processes_whose_exact_identity_matches(
    state_dir: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    exact, reused_pid, other_boot = (_sleeper(sleepers) for _ in range(3))
    state_dir.mkdir(parents=True)
    db = open_database(state_dir / "state.sqlite")
    try:
        with db.write() as tx:
            enqueue_run(tx, _new_run("run-1"))
            claim_for_launch(
                tx,
                "run-1",
                owner_id="server-dead",
                runner_epoch="epoch-1",
                launch_envelope_hash="sha256:e",
            )
            for child, ticks_delta, boot in (
                (exact, 0, None),
                (reused_pid, -1, None),  # the PID now names a process started later
                (other_boot, 0, "another-boot"),
            ):
                identity = identity_of(child.pid)
                assert identity is not None
                record_process(
                    tx,
                    "epoch-1",
                    pid=child.pid,
                    start_ticks=identity.start_ticks + ticks_delta,
                    boot_id=boot or identity.boot_id,
                    role="registered",
                )
    finally:
        db.close()
    with WorkflowServer(state_dir, execute_runs=False, idle_exit_s=None) as server:
        assert server.recovery is not None
        assert server.recovery.processes_stopped == 1
        assert server.recovery.runner_epochs_orphaned == 1
        assert server.recovery.runs_requeued == 1
    assert exact.wait(10) == -signal.SIGKILL, "the exact identity was stopped"
    assert reused_pid.poll() is None, "a PID whose start time differs is never signalled"
    assert other_boot.poll() is None, "a PID from another boot is never signalled"
    database = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        assert database.execute("SELECT count(*) FROM runner_processes").fetchone() == (0,)
        assert database.execute(
            "SELECT status FROM runner_epochs WHERE runner_epoch = 'epoch-1'"
        ).fetchone() == ("orphaned",)
        assert database.execute(
            "SELECT state FROM run_queue WHERE run_id = 'run-1'"
        ).fetchone() == ("queued",)
    finally:
        database.close()


def test_an_expired_running_row_is_cancelled_through_a_control_claim_but_a_live_one_is_not(
    state_dir: Path,
) -> None:
    clock = ManualClock()
    state_dir.mkdir(parents=True)
    db = open_database(state_dir / "state.sqlite", clock=clock)
    try:
        with db.write() as tx:
            enqueue_run(tx, _new_run("run-1"))
            held = claim_for_launch(
                tx,
                "run-1",
                owner_id="session-1",
                owner_type="session",  # not a server: recovery cannot prove it gone
                runner_epoch="epoch-1",
                launch_envelope_hash="sha256:e",
                ttl_ms=1_000,
            )
    finally:
        db.close()
    with (
        WorkflowServer(state_dir, execute_runs=False, idle_exit_s=None, clock=clock) as server,
        WorkflowClient(server.state_dir, autostart=False) as client,
    ):
        assert server.recovery is not None and server.recovery.runs_requeued == 0
        live = client.request("run.cancel", {}, run_id="run-1", idempotency_key="cancel-live")
        assert live["outcome"] == "claimLost"  # not stored: the same key may succeed later
        assert live["error"]["code"] == "claimHeld"
        clock.advance(1_001)  # the session's lease is now expired
        expired = client.request("run.cancel", {}, run_id="run-1", idempotency_key="cancel-late")
        assert expired["outcome"] == "accepted", expired
        view = client.call("run.get", {}, run_id="run-1")["receipt"]
    assert view["status"] == "cancelled"
    assert view["generation"] > held.claim.generation, "the control claim fenced the old holder"


SHELL_WORKFLOW = """
from pi_workflows import define_workflow, shell

workflow = define_workflow(
    name="longshell",
    start_at="build",
    nodes={{
        "build": shell(
            lambda ctx: ["sh", "-c", "echo ran >> {log}; echo $$ > {pidfile}; "
                         "echo go > {fifo}; exec sleep 300"],
            timeout=600,
        ),
    }},
)
"""

BLOCKING_COMPUTE = """
import os, time
from pathlib import Path
from pi_workflows import compute, define_workflow

def block_once(ctx):
    marker = Path({marker!r})
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        with open({fifo!r}, "w") as pipe:
            pipe.write("blocked")
        time.sleep(300)
    return {{"ok": True}}

workflow = define_workflow(name="blockonce", start_at="a", nodes={{"a": compute(block_once)}})
"""


def _serve(processes: Processes, state_dir: Path) -> subprocess.Popen[str]:
    server = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0")
    assert server.stdout is not None
    line = server.stdout.readline()
    assert "running" in line, line
    return server


def _start(state_dir: Path, project: Path, name: str) -> str:
    with WorkflowClient(state_dir, autostart=False) as client:
        answer = client.call(
            "run.start", {"workflow": name, "input": {}, "projectPath": str(project)}
        )
    return str(answer["receipt"]["runId"])


def _wait(processes: Processes, state_dir: Path, run_id: str) -> dict[str, Any]:
    done = processes.cli(state_dir, "run", "wait", run_id, "--timeout", "60", "--json")
    view: dict[str, Any] = json.loads(done.stdout)
    return view


def _freeze_and_kill(processes: Processes, root: psutil.Process, spare: psutil.Process) -> None:
    """SIGSTOP `root` and every descendant outside `spare`'s subtree, then SIGKILL them:
    none of them can react to another's death."""
    kept = {spare.pid} | {child.pid for child in spare.children(recursive=True)}
    frozen: dict[int, psutil.Process] = {}
    for _ in range(3):  # a process forked before its parent was stopped is met next pass
        for process in [root, *root.children(recursive=True)]:
            if process.pid not in kept and process.pid not in frozen:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.suspend()
                    frozen[process.pid] = process
                    processes.adopt(process.pid)
    for process in frozen.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def test_a_shell_group_left_by_a_sigkilled_server_is_stopped_by_recovery_and_is_ambiguous(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    fifo, pidfile, log = short_tmp / "go.fifo", short_tmp / "shell.pid", short_tmp / "ran.log"
    os.mkfifo(fifo)
    write_workflow(
        project,
        "longshell",
        SHELL_WORKFLOW.format(log=str(log), pidfile=str(pidfile), fifo=str(fifo)),
    )
    first = _serve(processes, state_dir)
    run_id = _start(state_dir, project, "longshell")
    wait_fifo(fifo)
    command = psutil.Process(int(pidfile.read_text().strip()))
    processes.adopt(command.pid)
    # The whole supervising tree dies at once (a machine-wide kill, the OOM killer): a
    # zygote or runner that lived on would stop the shell itself (they are subreapers),
    # so only startup recovery is left to stop it.
    _freeze_and_kill(processes, psutil.Process(first.pid), spare=command)
    first.wait(10)
    assert command.is_running(), "a shell in its own session outlives its dead supervisors"
    _serve(processes, state_dir)
    _gone, alive = psutil.wait_procs([command], timeout=30)
    assert not alive, "recovery stopped the recorded shell group by its exact identity"
    view = _wait(processes, state_dir, run_id)
    assert view["display"]["status"] == "ambiguous", view["display"]
    assert log.read_text() == "ran\n", "an interrupted shell effect is never run again"


def test_a_cold_runner_left_by_a_sigkilled_server_is_stopped_and_the_run_resumes(
    processes: Processes,
    state_dir: Path,
    short_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PI_WORKFLOWS_ZYGOTE", "0")  # runners are plain children of the server
    project = short_tmp / "project"
    fifo, marker = short_tmp / "blocked.fifo", short_tmp / "first-runner.pid"
    os.mkfifo(fifo)
    write_workflow(
        project, "blockonce", BLOCKING_COMPUTE.format(marker=str(marker), fifo=str(fifo))
    )
    first = _serve(processes, state_dir)
    run_id = _start(state_dir, project, "blockonce")
    wait_fifo(fifo)
    wait_for_attempt(state_dir, run_id)
    runner = psutil.Process(int(marker.read_text()))
    processes.adopt(runner.pid)
    assert runner.name() == "piw-runner"
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    assert runner.is_running(), "nothing else stops a cold runner blocked in a node"
    _serve(processes, state_dir)
    _gone, alive = psutil.wait_procs([runner], timeout=30)
    assert not alive, "recovery stopped the runner recorded at spawn"
    view = _wait(processes, state_dir, run_id)
    assert view["display"]["status"] == "completed"
    assert [step["status"] for step in view["steps"]] == ["interrupted", "completed"]
    verify = processes.cli(state_dir, "state", "verify", "--json")
    assert verify.returncode == 0, verify.stdout


def test_recovery_needs_no_waiting_out_of_the_dead_servers_claims(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    fifo, marker = short_tmp / "blocked.fifo", short_tmp / "first-runner.pid"
    os.mkfifo(fifo)
    write_workflow(
        project, "blockonce", BLOCKING_COMPUTE.format(marker=str(marker), fifo=str(fifo))
    )
    first = _serve(processes, state_dir)
    run_id = _start(state_dir, project, "blockonce")
    wait_fifo(fifo)
    wait_for_attempt(state_dir, run_id)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    _serve(processes, state_dir)
    # The runner's 30 s host claim is still unexpired, but the lock proves its owner dead:
    # by the time the new server answers anyone, recovery has taken the run over.
    with WorkflowClient(state_dir, autostart=False) as client:
        first_view = client.call("run.get", {}, run_id=run_id)["receipt"]
    assert first_view["generation"] >= 2, "recovery fenced generation 1 before serving"
    assert first_view["steps"][0]["status"] == "interrupted"
    view = _wait(processes, state_dir, run_id)
    assert view["display"]["status"] == "completed"
