"""No process a node starts outlives its supervision, even one that called `setsid`.

Issue 11 item 4, through a real server, zygote, runner and commands. A compute node
starts two escapees (`setsid sleep 600`, and a Python double fork whose grandchild calls
`setsid`), a shell node runs `sh -c "setsid sleep 600 & ..."`, and each case checks that
the escapees are gone after the node finishes, after `run cancel`, after a node timeout,
after the runner is SIGKILLed (the zygote, a subreaper, adopts and stops them), after
`server stop` and after the server is SIGKILLed. Every escapee PID is written to a file
by the workflow and killed by the test at teardown whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.conftest import Processes, write_workflow
from tests.server.runs import TERMINAL, start_run, wait_fifo, wait_for

pytestmark = pytest.mark.timeout(120)

# `pids` gets "runner escapee escapee"; then the node returns (`hold` "no"), or stays,
# announcing itself on the FIFO first ("fifo") or not ("sleep"). A second runner of the
# same run (after a crash) finds the file and returns at once, so the test's PIDs are
# the first runner's.
COMPUTE = """
import os, subprocess, time
from pathlib import Path
from pi_workflows import compute, define_workflow

PIDS = Path({pids!r})

def escape(ctx):
    if PIDS.exists():
        return {{"again": True}}
    direct = subprocess.Popen(["setsid", "sleep", "600"]).pid
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # double fork: the grandchild leads its own session and has no parent
        os.setsid()
        if os.fork() == 0:
            os.write(w, f"{{os.getpid()}}\\n".encode())
            time.sleep(600)
        os._exit(0)
    os.waitpid(child, 0)
    orphan = int(os.read(r, 64))
    PIDS.write_text(f"{{os.getpid()}} {{direct}} {{orphan}}")
    if {hold!r} == "fifo":
        with open({fifo!r}, "w") as pipe:
            pipe.write("ready")
    if {hold!r} != "no":
        time.sleep(600)
    return {{"escaped": 2}}

workflow = define_workflow(
    name="escape", start_at="escape", nodes={{"escape": compute(escape, timeout={timeout})}}
)
"""

# The shell's `$!` is the escapee itself: `setsid` execs `sleep` in place.
SHELL = """
from pi_workflows import define_workflow, shell

def argv(ctx):  # the same after a crash: the interrupted command is then ambiguous
    then = {{"no": "sleep 1", "fifo": "echo ready > {fifo}; sleep 600", "sleep": "sleep 600"}}
    script = 'setsid sleep 600 & echo "$PPID $!" > {pids}; ' + then[{hold!r}]
    return ["sh", "-c", script]

workflow = define_workflow(
    name="escape", start_at="run", nodes={{"run": shell(argv, timeout={timeout})}}
)
"""


@pytest.fixture
def escapees(short_tmp: Path) -> Iterator[Path]:
    """The file the workflow writes its PIDs to; every PID in it is killed at teardown."""
    pids = short_tmp / "pids"
    try:
        yield pids
    finally:
        for pid in _read_pids(pids)[1:]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _read_pids(path: Path) -> list[int]:
    with contextlib.suppress(OSError, ValueError):
        return [int(word) for word in path.read_text().split()]
    return []


def _project(short_tmp: Path, kind: str, pids: Path, *, hold: str, timeout: float) -> Path:
    project = short_tmp / "project"
    fifo = short_tmp / "ready.fifo"
    if hold == "fifo":
        os.mkfifo(fifo)
    source = COMPUTE if kind == "compute" else SHELL
    write_workflow(
        project,
        "escape",
        source.format(pids=str(pids), fifo=str(fifo), hold=hold, timeout=timeout),
    )
    return project


def _await_pids(path: Path, count: int, timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while len(found := _read_pids(path)) < count:
        assert time.monotonic() < deadline, "the workflow never wrote its PIDs"
        pause.wait(0.02)
    return found


def assert_gone(pids: list[int], timeout: float = 20.0) -> None:
    """Each PID has exited (its pidfd turns readable) and has been reaped."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            left = max(0.0, deadline - time.monotonic())
            assert select.select([pidfd], [], [], left)[0], f"process {pid} is still running"
        finally:
            os.close(pidfd)
        while psutil.pid_exists(pid):  # exited; now reaped by whoever adopted it
            assert time.monotonic() < deadline, f"process {pid} was never reaped"
            pause.wait(0.02)


def _escapees(pids: Path, count: int) -> tuple[int, list[int]]:
    runner, *escaped = _await_pids(pids, count)
    for pid in escaped:
        with contextlib.suppress(ProcessLookupError):  # a finished node's are gone already
            assert os.getsid(pid) != os.getsid(runner), "the escapee left the runner's session"
    return runner, escaped


def test_escapees_of_a_compute_node_are_gone_when_it_finishes(
    running_server: WorkflowServer, short_tmp: Path, escapees: Path
) -> None:
    project = _project(short_tmp, "compute", escapees, hold="no", timeout=60)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "escape", {})
        view = wait_for(client, run_id, TERMINAL)
    assert view["display"]["status"] == "completed"
    _, escaped = _escapees(escapees, 3)
    assert_gone(escaped)


def test_escapee_of_a_shell_node_is_gone_when_it_finishes(
    running_server: WorkflowServer, short_tmp: Path, escapees: Path
) -> None:
    # The command exits after 1 s while its escapee still holds stdout and stderr: its
    # end is its process's exit (issue 11's output part), then the escapee is stopped.
    project = _project(short_tmp, "shell", escapees, hold="no", timeout=10)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "escape", {})
        view = wait_for(client, run_id, TERMINAL)
    assert view["display"]["status"] == "completed"
    assert view["steps"][0]["status"] == "completed"
    _, escaped = _escapees(escapees, 2)
    assert_gone(escaped)


@pytest.mark.parametrize("kind", ["compute", "shell"])
def test_escapees_are_gone_after_run_cancel(
    running_server: WorkflowServer, short_tmp: Path, escapees: Path, kind: str
) -> None:
    project = _project(short_tmp, kind, escapees, hold="fifo", timeout=600)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "escape", {})
        wait_fifo(short_tmp / "ready.fifo")
        _, escaped = _escapees(escapees, 3 if kind == "compute" else 2)
        assert client.call("run.cancel", run_id=run_id)["outcome"] == "accepted"
        assert_gone(escaped)
        assert client.call("run.get", run_id=run_id)["receipt"]["display"]["status"] == (
            "cancelled"
        )


@pytest.mark.parametrize("kind", ["compute", "shell"])
def test_escapees_are_gone_after_a_node_timeout(
    running_server: WorkflowServer, short_tmp: Path, escapees: Path, kind: str
) -> None:
    project = _project(short_tmp, kind, escapees, hold="sleep", timeout=5)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "escape", {})
        _, escaped = _escapees(escapees, 3 if kind == "compute" else 2)
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        assert_gone(escaped)
    if kind == "compute":
        assert view["display"]["status"] == "timed_out"
    # A shell node's own timeout (SIGTERM to its group) races the node's deadline: the
    # command may end first and the node complete with `timedOut`. Either way: gone.


@pytest.mark.parametrize("kind", ["compute", "shell"])
def test_escapees_are_gone_after_the_runner_is_sigkilled(
    running_server: WorkflowServer, short_tmp: Path, escapees: Path, kind: str
) -> None:
    """Nobody asked: the zygote, their subreaper once the runner is dead, stops them."""
    project = _project(short_tmp, kind, escapees, hold="fifo", timeout=600)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "escape", {})
        wait_fifo(short_tmp / "ready.fifo")
        runner, escaped = _escapees(escapees, 3 if kind == "compute" else 2)
        if kind == "shell":  # the file has the shell's parent: the runner
            assert psutil.Process(runner).name() == "piw-runner"
        os.kill(runner, signal.SIGKILL)
        assert_gone([runner, *escaped])
        # The next runner finds the PIDs file and completes the run (the shell effect,
        # interrupted, is ambiguous instead: it may have applied).
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        if view["display"]["status"] == "ambiguous":
            client.call("run.cancel", run_id=run_id)
    assert view["display"]["status"] == ("completed" if kind == "compute" else "ambiguous")


def test_escapees_are_gone_after_a_cancel_without_the_zygote(
    state_dir: Path, short_tmp: Path, escapees: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold runner has no zygote to adopt its orphans: the supervisor kills its whole
    tree while the runner (their subreaper) still holds it together."""
    monkeypatch.setenv("PI_WORKFLOWS_ZYGOTE", "0")
    project = _project(short_tmp, "compute", escapees, hold="fifo", timeout=600)
    with (
        WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05) as server,
        WorkflowClient(server.state_dir, autostart=False) as client,
    ):
        run_id = start_run(client, project, "escape", {})
        wait_fifo(short_tmp / "ready.fifo")
        runner, escaped = _escapees(escapees, 3)
        assert psutil.Process(runner).ppid() == os.getpid(), "a cold runner: our child"
        client.call("run.cancel", run_id=run_id)
        assert_gone(escaped)


@pytest.mark.parametrize("kind", ["compute", "shell"])
@pytest.mark.parametrize("how", ["server stop", "SIGKILL"])
def test_escapees_are_gone_after_the_server_ends(
    processes: Processes, state_dir: Path, short_tmp: Path, escapees: Path, kind: str, how: str
) -> None:
    project = _project(short_tmp, kind, escapees, hold="fifo", timeout=600)
    started = processes.cli(state_dir, "server", "start")
    assert started.returncode == 0, started.stderr
    server = int((state_dir / "host" / "server.lock").read_text().strip())
    processes.adopt(server)  # detached: init is its parent, so its exit is seen by all
    with WorkflowClient(state_dir, autostart=False) as client:
        start_run(client, project, "escape", {})
        wait_fifo(short_tmp / "ready.fifo")
    runner, escaped = _escapees(escapees, 3 if kind == "compute" else 2)
    if how == "server stop":
        stop = processes.cli(state_dir, "server", "stop", "--drain", "1")
        assert stop.returncode == 0, stop.stderr
    else:
        os.kill(server, signal.SIGKILL)  # the zygote sees end of file and stops them all
    assert_gone([server, runner, *escaped])
