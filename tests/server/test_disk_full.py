"""A full disk: client commands get `diskFull`, and accepted runs wait for space, then go on.

Two ways to fill the disk for real:

- `PRAGMA max_page_count` on the server's own connection (an embedded server with real
  runner processes): SQLite then answers SQLITE_FULL exactly as for a full disk, without
  root. Raising the limit again is "space returns".
- A small real tmpfs as the agent folder (database, logs and runner logs on it), filled
  with a file until ENOSPC, under a real `server run` process. It needs `mount` (root);
  without it the test is skipped.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.storage import DISK_FULL_MESSAGE, Database
from pi_workflows.testing import CallUnit, perform_with_calls
from tests.conftest import Processes, wait_for_attempt, write_workflow

pytestmark = pytest.mark.timeout(180)

OUTPUT_BYTES = 600_000
"""A node output this large needs new database pages (and new WAL space) to store."""

GATE_WORKFLOW = """
import time
from pathlib import Path

from pi_workflows import compute, define_workflow


def wait_then_write(ctx):
    gate = Path(ctx.input["gate"])
    while not gate.exists():  # the test fills the disk first, then opens the gate
        time.sleep(0.05)
    return {"big": "x" * ctx.input["size"]}


workflow = define_workflow(
    name="fill",
    start_at="wait",
    nodes={
        "wait": compute(wait_then_write, timeout=120),
        "after": compute(lambda ctx: {"done": True}),
    },
    edges=[{"from": "wait", "to": "after"}],
)
"""


def _start_request(project: Path, workflow: str, workflow_input: Any) -> dict[str, Any]:
    return {"workflow": workflow, "input": workflow_input, "projectPath": str(project)}


def _log_lines(state_dir: Path) -> list[dict[str, Any]]:
    """The server log's JSON lines (a line a full disk cut short is skipped)."""
    lines = []
    for text in (state_dir / "logs" / "server.log").read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            lines.append(json.loads(text))
    return lines


def _wait_for_log(state_dir: Path, action: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        found = [line for line in _log_lines(state_dir) if line.get("action") == action]
        if found:
            return found[-1]
        assert time.monotonic() < deadline, f"no {action} line in the server log"
        pause.wait(0.05)


def _runner_epochs(state_dir: Path, run_id: str) -> list[str]:
    database = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        rows = database.execute(
            "SELECT status FROM runner_epochs WHERE run_id = ? ORDER BY started_at", (run_id,)
        ).fetchall()
    finally:
        database.close()
    return [row[0] for row in rows]


def _settled_runner_epochs(state_dir: Path, run_id: str, timeout_s: float = 30) -> list[str]:
    """The run's runner epochs once none is live: a runner's exit is recorded after the
    run's last commit (its channel's end of file), so a finished run can show it `ready`."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while True:
        statuses = _runner_epochs(state_dir, run_id)
        if not {"starting", "ready"} & set(statuses) or time.monotonic() >= deadline:
            return statuses
        pause.wait(0.05)


def _assert_disk_full_refusal(answer: Mapping[str, Any], state_dir: Path) -> None:
    assert answer["outcome"] == "unavailable"
    assert answer["error"] == {"code": "diskFull", "message": DISK_FULL_MESSAGE}
    assert str(state_dir) not in json.dumps(answer)


def _wait_completed(client: WorkflowClient, run_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        receipt = dict(client.call("run.get", run_id=run_id)["receipt"])
        if receipt["display"]["status"] not in ("queued", "running"):
            return receipt
        assert "reason" not in receipt["display"], receipt["display"]  # parked: a failure
        assert time.monotonic() < deadline, "the run did not finish once space returned"
        pause.wait(0.1)


# --- SQLITE_FULL through max_page_count --------------------------------------------------


def _set_max_pages(server: WorkflowServer, pages: int | None) -> int:
    """Cap the server's database at its current size (None: lift the cap); the cap."""

    def cap(db: Database) -> int:
        limit = pages if pages is not None else 4_294_967_294
        if pages == 0:
            limit = int(db.connection.execute("PRAGMA page_count").fetchone()[0])
        return int(db.connection.execute(f"PRAGMA max_page_count = {limit}").fetchone()[0])

    return int(server.call_database(CallUnit(cap)))


def test_sqlite_full_refuses_commands_with_disk_full_and_the_run_waits_for_space(
    state_dir: Path, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "fill", GATE_WORKFLOW)
    write_workflow(project, "echo")
    gate = short_tmp / "gate-open"
    with (
        WorkflowServer(
            state_dir, idle_exit_s=None, tick_s=0.05, units=perform_with_calls
        ) as server,
        WorkflowClient(state_dir, autostart=False, timeout=30) as client,
    ):
        run_id = client.call(
            "run.start",
            _start_request(project, "fill", {"gate": str(gate), "size": OUTPUT_BYTES}),
        )["receipt"]["runId"]
        wait_for_attempt(state_dir, run_id)  # its runner is inside the node

        _set_max_pages(server, 0)  # the disk is full from here on
        big_input = {"text": "y" * OUTPUT_BYTES}
        refused = client.request(
            "run.start", _start_request(project, "echo", big_input), idempotency_key="echo-1"
        )
        _assert_disk_full_refusal(refused, state_dir)
        gate.touch()  # the runner's node.finished now needs space the disk does not have
        _wait_for_log(state_dir, "db.disk_full")
        display = client.call("run.get", run_id=run_id)["receipt"]["display"]
        assert (display["status"], display["currentNode"]) == ("running", "wait"), display
        assert "reason" not in display, "accepted work waits for space: not parked, not failed"

        _set_max_pages(server, None)  # space returns
        done = _wait_completed(client, run_id)
        assert done["display"]["status"] == "completed"
        assert done["generation"] == 1 and _settled_runner_epochs(state_dir, run_id) == [
            "exited"
        ], "one runner did it all: nothing crashed, nothing was resumed"
        returned = _wait_for_log(state_dir, "db.disk_space_returned")
        assert returned["reason"] == "diskFull"
        again = client.request(
            "run.start", _start_request(project, "echo", big_input), idempotency_key="echo-1"
        )
        assert again["outcome"] == "accepted", "the refused command is accepted when sent again"
        verified = client.call("state.verify")["receipt"]
        assert verified["consistent"], verified["findings"]
    lines = _log_lines(state_dir)
    assert not [line for line in lines if line.get("action") == "db.commit_failed"]
    assert not [line for line in lines if line.get("action") == "operation.error"]


# --- ENOSPC on a real tmpfs --------------------------------------------------------------


def _mount_tmpfs(folder: Path, size: str) -> bool:
    folder.mkdir(parents=True)
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)],
            capture_output=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return mounted.returncode == 0


@pytest.fixture
def small_disk(short_tmp: Path, processes: Processes) -> Iterator[Path]:
    """A 24 MiB tmpfs as the agent folder (skipped where tmpfs cannot be mounted)."""
    agent = short_tmp / "agent"
    if not _mount_tmpfs(agent, "24m"):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    try:
        yield agent
    finally:
        processes.cleanup()  # nothing may hold the folder open when it is unmounted
        subprocess.run(["umount", "-l", str(agent)], check=False, timeout=30)


def _fill(folder: Path) -> Path:
    """Write a file until the filesystem refuses with ENOSPC; return it."""
    filler = folder / "filler"
    chunk = b"\0" * (256 * 1024)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        with contextlib.suppress(OSError):  # the last bytes, smaller than a chunk
            while os.write(fd, b"\0" * 4096):
                pass
    finally:
        os.close(fd)
    return filler


def test_a_full_tmpfs_refuses_commands_with_disk_full_and_the_run_continues_once_space_returns(
    processes: Processes, small_disk: Path, short_tmp: Path
) -> None:
    state_dir = small_disk / "workflows"
    project = short_tmp / "project"
    write_workflow(project, "fill", GATE_WORKFLOW)
    write_workflow(project, "echo")
    gate = short_tmp / "gate-open"
    server = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0")
    assert server.stdout is not None and "running" in server.stdout.readline()
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        run_id = client.call(
            "run.start",
            _start_request(project, "fill", {"gate": str(gate), "size": OUTPUT_BYTES}),
        )["receipt"]["runId"]
        wait_for_attempt(state_dir, run_id)

        filler = _fill(small_disk)
        refused = client.request(
            "run.start",
            _start_request(project, "echo", {"text": "y" * OUTPUT_BYTES}),
            idempotency_key="echo-1",
        )
        _assert_disk_full_refusal(refused, state_dir)
        gate.touch()
        # The runner's write is held: the run stays running, it is not parked.
        pause = threading.Event()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:  # a bounded look for a wrong turn
            display = client.call("run.get", run_id=run_id)["receipt"]["display"]
            assert display.get("reason") is None and display["status"] == "running", display
            pause.wait(0.2)

        filler.unlink()  # space returns
        done = _wait_completed(client, run_id)
        assert done["display"]["status"] == "completed" and done["generation"] == 1
        assert _settled_runner_epochs(state_dir, run_id) == ["exited"]
        returned = _wait_for_log(state_dir, "db.disk_space_returned")
        assert returned["reason"] == "diskFull" and str(state_dir) not in json.dumps(returned)
        assert client.call("state.verify")["receipt"]["consistent"]
    assert server.poll() is None
