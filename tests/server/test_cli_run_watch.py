"""`run wait` and `run watch` on the run subscription, across a real server restart.

The server is the detached one `server start` launches; `server stop` stops it for
real (its drain hands the run back to the queue) and the next `server start` runs it
again from its last durable boundary. The gated node announces each attempt on a FIFO
and blocks until the test opens the release FIFO, so the test knows, without sleeping,
that the run is mid-node when the server goes away.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows import HostUnavailableError, RunNotFoundError, WatchTimeoutError, WorkflowClient
from tests.conftest import Processes, write_workflow
from tests.server.runs import start_run, wait_fifo

pytestmark = pytest.mark.timeout(240)

GATED = """
from pi_workflows import compute, define_workflow


def gate(ctx):
    with open(ctx.input["ready"], "w") as ready:  # blocks until the test listens
        ready.write("at gate")
    with open(ctx.input["release"]) as release:  # blocks until the test opens it
        release.read()
    return {"opened": True}


workflow = define_workflow(
    name="gated",
    start_at="gate",
    nodes={"gate": compute(gate, timeout=600)},
)
"""


@pytest.fixture
def gated(short_tmp: Path) -> tuple[Path, dict[str, str]]:
    """A project with the gated workflow, and its two FIFOs as the run's input."""
    project = short_tmp / "project"
    write_workflow(project, "gated", GATED)
    fifos = {"ready": str(short_tmp / "ready.fifo"), "release": str(short_tmp / "release.fifo")}
    for path in fifos.values():
        os.mkfifo(path)
    return project, fifos


def _start_server(processes: Processes, state_dir: Path) -> int:
    started = processes.cli(state_dir, "server", "start")
    assert started.returncode == 0, started.stderr
    pid = int((state_dir / "host" / "server.lock").read_text().strip())
    processes.adopt(pid)
    return pid


def _release(fifos: dict[str, str]) -> None:
    with open(fifos["release"], "w") as release:
        release.write("go")


def _connected_unix_sockets(pid: int) -> int:
    """How many connected Unix sockets the process holds (from /proc, not a guess)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    with open("/proc/net/unix") as table:
        next(table)
        rows = [line.split() for line in table]
    return sum(1 for row in rows if row[6] in inodes and row[5] == "03")  # 03: connected


def _wait_connected(child: subprocess.Popen[str]) -> None:
    """Wait until the CLI child is connected to the server (its first connection, the
    only one that may start a server, is then behind it)."""
    poll = select.poll()
    assert child.stderr is not None
    poll.register(child.stderr.fileno(), select.POLLIN | select.POLLHUP)
    for _ in range(600):  # 600 x 0.1 s, each a real wait on the child's stderr
        if child.poll() is not None:
            pytest.fail(f"the CLI exited early: {child.communicate()}")
        if _connected_unix_sockets(child.pid):
            return
        if poll.poll(100):
            pytest.fail(f"the CLI wrote to stderr: {child.communicate()}")
    pytest.fail("the CLI never connected")


def _read_line(child: subprocess.Popen[str], timeout: float = 60) -> str:
    assert child.stdout is not None
    readable, _, _ = select.select([child.stdout], [], [], timeout)
    assert readable, "no line from the CLI"
    return child.stdout.readline()


def test_run_wait_survives_a_server_restart_and_prints_the_result(
    processes: Processes, state_dir: Path, gated: tuple[Path, dict[str, str]]
) -> None:
    project, fifos = gated
    first_pid = _start_server(processes, state_dir)
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        run_id = start_run(client, project, "gated", fifos)
    assert wait_fifo(Path(fifos["ready"])) == "at gate"  # attempt 1 is mid-node
    waiter = processes.spawn_cli(state_dir, "run", "wait", run_id, "--json", "--timeout", "180")
    watcher = processes.spawn_cli(state_dir, "run", "watch", run_id, "--json")
    _wait_connected(waiter)
    first = json.loads(_read_line(watcher))  # the watch is subscribed: its first view
    assert first["runId"] == run_id and first["display"]["status"] == "running"

    stopped = processes.cli(state_dir, "server", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert waiter.poll() is None and watcher.poll() is None, "a restart is not an error"
    second_pid = _start_server(processes, state_dir)
    assert second_pid != first_pid
    assert wait_fifo(Path(fifos["ready"])) == "at gate"  # the next server runs it again
    _release(fifos)

    out, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 0, err
    settled = json.loads(out)
    assert settled["display"]["status"] == "completed"
    assert settled["result"]["output"] == {"value": {"opened": True}}
    assert settled["generation"] >= 2  # a new claim after the restart

    rest, err = watcher.communicate(timeout=120)
    assert watcher.returncode == 0, err
    views: list[dict[str, Any]] = [first, *(json.loads(line) for line in rest.splitlines())]
    assert views[-1]["display"]["status"] == "completed"
    revisions = [view["revision"] for view in views]
    assert revisions == sorted(revisions), "views never go back in revision"
    processes.cli(state_dir, "server", "stop")


def test_run_watch_prints_one_line_per_change_and_ends_when_the_run_settles(
    processes: Processes, state_dir: Path, gated: tuple[Path, dict[str, str]]
) -> None:
    project, fifos = gated
    _start_server(processes, state_dir)
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        run_id = start_run(client, project, "gated", fifos)
    assert wait_fifo(Path(fifos["ready"])) == "at gate"
    watcher = processes.spawn_cli(state_dir, "run", "watch", run_id)
    line = _read_line(watcher)
    assert "running" in line and "at gate" in line, line
    _release(fifos)
    rest, err = watcher.communicate(timeout=120)
    assert watcher.returncode == 0, err
    lines = [line, *rest.splitlines()]
    assert "completed" in lines[-1] and "gate visit 1/1 completed" in lines[-1], lines
    assert len(lines) == len(set(lines)), "a line is printed only when something changed"
    processes.cli(state_dir, "server", "stop")


def test_run_watch_and_wait_of_a_failed_run_exit_1(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(
        project,
        "boom",
        "from pi_workflows import compute, define_workflow\n"
        "def boom(ctx):\n    raise RuntimeError('no luck')\n"
        "workflow = define_workflow(name='boom', start_at='b', nodes={'b': compute(boom)})\n",
    )
    _start_server(processes, state_dir)
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        run_id = start_run(client, project, "boom")
    waited = processes.cli(state_dir, "run", "wait", run_id, "--timeout", "120")
    assert waited.returncode == 1, waited.stderr
    assert waited.stdout.startswith(f"{run_id}  failed"), waited.stdout
    watched = processes.cli(state_dir, "run", "watch", run_id, "--timeout", "120")
    assert watched.returncode == 1, watched.stderr
    assert "failed" in watched.stdout.splitlines()[-1]
    processes.cli(state_dir, "server", "stop")


def test_waiting_for_a_missing_run_says_not_found_at_once(
    processes: Processes, state_dir: Path
) -> None:
    _start_server(processes, state_dir)
    for command in ("wait", "watch"):
        done = processes.cli(state_dir, "run", command, "run-does-not-exist", timeout=60)
        assert done.returncode == 1, (command, done.stderr)
        assert "notFound" in done.stderr and done.stdout == ""
    processes.cli(state_dir, "server", "stop")


def test_run_wait_timeout_exits_6(
    processes: Processes, state_dir: Path, gated: tuple[Path, dict[str, str]]
) -> None:
    project, fifos = gated
    _start_server(processes, state_dir)
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        run_id = start_run(client, project, "gated", fifos)
    assert wait_fifo(Path(fifos["ready"])) == "at gate"
    done = processes.cli(state_dir, "run", "wait", run_id, "--timeout", "1")
    assert done.returncode == 6, done.stderr
    assert "did not settle within 1 s" in done.stderr
    _release(fifos)
    processes.cli(state_dir, "server", "stop")


def _read_pty_until(
    master: int, marker: bytes | None, seen: bytearray, timeout: float = 60
) -> None:
    """Read the terminal until `marker` is in what was seen (None: until it closes)."""
    while marker is None or marker not in seen:
        readable, _, _ = select.select([master], [], [], timeout)
        assert readable, f"the terminal stayed silent; so far: {bytes(seen)[-400:]!r}"
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal has closed it
            chunk = b""
        if not chunk:
            assert marker is None, f"closed before {marker!r}: {bytes(seen)[-400:]!r}"
            return
        seen += chunk


def test_run_watch_on_a_terminal_draws_a_live_display(
    processes: Processes, state_dir: Path, gated: tuple[Path, dict[str, str]]
) -> None:
    project, fifos = gated
    _start_server(processes, state_dir)
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        run_id = start_run(client, project, "gated", fifos)
    assert wait_fifo(Path(fifos["ready"])) == "at gate"
    master, terminal = pty.openpty()
    env = dict(os.environ, PI_CODING_AGENT_DIR=str(state_dir.parent), COLUMNS="120")
    try:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pi_workflows.cli",
                "--state-dir",
                str(state_dir),
                "run",
                "watch",
                run_id,
            ],
            stdin=subprocess.DEVNULL,
            stdout=terminal,
            stderr=terminal,
            env=env,
            start_new_session=True,
        )
        processes.adopt(child.pid)
        os.close(terminal)
        terminal = -1
        seen = bytearray()
        _read_pty_until(master, b"at node", seen)  # the live display, not a plain line
        assert b"allowed now" in seen and run_id.encode() in seen
        _release(fifos)
        _read_pty_until(master, None, seen)
        assert child.wait(60) == 0
        assert b"completed" in seen and b"\x1b[" in seen  # drawn with terminal codes
    finally:
        os.close(master)
        if terminal >= 0:
            os.close(terminal)
    processes.cli(state_dir, "server", "stop")


# --- WorkflowClient.wait: the same subscription, from Python ---------------------------


def test_workflow_client_wait_returns_the_settled_view_and_says_why_it_cannot(
    processes: Processes, state_dir: Path, short_tmp: Path, gated: tuple[Path, dict[str, str]]
) -> None:
    """A run that settles, one already settled, one that does not exist, a timeout."""
    project, fifos = gated
    write_workflow(
        project,
        "boom",
        "from pi_workflows import compute, define_workflow\n"
        "def boom(ctx):\n    raise RuntimeError('no luck')\n"
        "workflow = define_workflow(name='boom', start_at='b', nodes={'b': compute(boom)})\n",
    )
    _start_server(processes, state_dir)
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        failed = client.wait(start_run(client, project, "boom"), timeout=120)
        assert failed["display"]["status"] == "failed"
        again = client.wait(failed["runId"], timeout=5)  # already settled: at once
        assert again["display"]["status"] == "failed"
        assert again["revision"] >= failed["revision"], "its runner may still end after it"
        with pytest.raises(RunNotFoundError):
            client.wait("run-does-not-exist", timeout=30)
        gated_run = start_run(client, project, "gated", fifos)
        assert wait_fifo(Path(fifos["ready"])) == "at gate"
        with pytest.raises(WatchTimeoutError):
            client.wait(gated_run, timeout=0.5)
        _release(fifos)
        done = client.wait(gated_run, timeout=120)
        assert done["display"]["status"] == "completed"
        assert done["result"]["output"] == {"value": {"opened": True}}
    processes.cli(state_dir, "server", "stop")


def test_workflow_client_wait_with_no_server_fails_at_once(state_dir: Path) -> None:
    client = WorkflowClient(state_dir, autostart=False, timeout=5, connect_on_enter=False)
    with client, pytest.raises(HostUnavailableError, match="not running"):
        client.wait("run-any", timeout=30)


def test_run_wait_and_workflow_client_wait_survive_a_sigkilled_server(
    processes: Processes, state_dir: Path, gated: tuple[Path, dict[str, str]]
) -> None:
    """The server is SIGKILLed mid-node; `run wait` and `WorkflowClient.wait` reconnect
    to the next server, subscribe again from the revision they hold, and return the
    completed view; a `run wait` of the settled run then returns it at once."""
    project, fifos = gated
    first_pid = _start_server(processes, state_dir)
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        run_id = start_run(client, project, "gated", fifos)
    assert wait_fifo(Path(fifos["ready"])) == "at gate"
    cli_waiter = processes.spawn_cli(state_dir, "run", "wait", run_id, "--json", "--timeout", "180")
    _wait_connected(cli_waiter)
    waiter = WorkflowClient(state_dir, autostart=False, timeout=30)
    with pytest.raises(WatchTimeoutError):  # its subscription connection is open now
        waiter.wait(run_id, timeout=0.5)
    waited: dict[str, Any] = {}

    def wait() -> None:  # the waiter is this thread's alone from here on
        try:
            waited["view"] = waiter.wait(run_id, timeout=180, reconnect_timeout=120)
        except Exception as exc:
            waited["error"] = exc
        finally:
            waiter.close()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    os.kill(first_pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(first_pid)], timeout=30)
    assert not psutil.pid_exists(first_pid) or psutil.Process(first_pid).status() == "zombie"
    second_pid = _start_server(processes, state_dir)
    assert second_pid != first_pid
    assert wait_fifo(Path(fifos["ready"])) == "at gate"  # the next server runs it again
    assert thread.is_alive(), waited
    _release(fifos)
    thread.join(150)
    assert not thread.is_alive() and "error" not in waited, waited
    settled = waited["view"]
    assert settled["display"]["status"] == "completed"
    assert settled["result"]["output"] == {"value": {"opened": True}}
    assert settled["generation"] >= 2, "the view of the next server's claim"
    out, err = cli_waiter.communicate(timeout=120)
    assert cli_waiter.returncode == 0, err
    assert json.loads(out)["revision"] == settled["revision"]
    again = processes.cli(state_dir, "run", "wait", run_id, "--json", "--timeout", "30")
    assert again.returncode == 0, again.stderr
    view = json.loads(again.stdout)  # already settled: at once, the same outcome
    assert view["display"]["status"] == "completed" and view["result"] == settled["result"]
    assert view["revision"] >= settled["revision"], "its runner may still end after it"
    processes.cli(state_dir, "server", "stop")
