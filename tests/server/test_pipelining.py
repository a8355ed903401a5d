"""Pipelined pure nodes: a runner does not wait between compute nodes, and that is safe.

Issue 10 item 5: a runner sends a compute node's start and finish and goes on; it waits
for every answer before an effect, a wait, an interaction or the end of the run. A
fenced runner's pipelined messages are all refused and nothing external happens; a
runner SIGKILLed after pipelined messages leaves every node committed or rerun, no
effect applied twice, and `state verify` clean. Real servers, runners and commands.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.supervision import CRASH_ENV, CRASH_ONCE_ENV
from tests.conftest import write_workflow
from tests.server.runs import TERMINAL, start_run, wait_fifo, wait_for

pytestmark = pytest.mark.timeout(120)

PIPELINE = """
import os
import signal
import time
from pathlib import Path
from pi_workflows import compute, define_workflow, shell

ROOT = Path({root!r})

def count(node):
    with (ROOT / f"{{node}}.count").open("a") as out:
        out.write("x")
    return len((ROOT / f"{{node}}.count").read_text())

def c1(ctx):
    if count("c1") == 1 and {hold!r}:
        # Outlive the fence's SIGTERM, then go on once the test says so: the messages
        # this runner pipelines next are sent after its claim was released.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(ROOT / "c1.fifo", "w") as pipe:
            pipe.write("holding")
        while not (ROOT / "go").exists():
            time.sleep(0.01)
    return {{"c1": True}}

workflow = define_workflow(
    name="pipeline",
    start_at="c1",
    nodes={{
        "c1": compute(c1),
        "c2": compute(lambda ctx: {{"c2": count("c2")}}),
        "c3": compute(lambda ctx: {{"c3": count("c3")}}),
        "deploy": shell(lambda ctx: ["sh", "-c", f"echo run >> {{ROOT / 'deploy.log'}}"]),
        "c4": compute(lambda ctx: {{"c4": count("c4")}}),
    }},
    edges=[
        {{"from": "c1", "to": "c2"}},
        {{"from": "c2", "to": "c3"}},
        {{"from": "c3", "to": "deploy"}},
        {{"from": "deploy", "to": "c4"}},
    ],
)
"""


def _rows(state_dir: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    connection = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()


def _attempts(state_dir: Path, run_id: str) -> list[tuple[str, int, str]]:
    return [
        (str(path), int(generation), str(status))
        for path, generation, status in _rows(
            state_dir,
            "SELECT node_path, generation, status FROM node_attempts WHERE run_id = ? "
            "ORDER BY rowid",
            run_id,
        )
    ]


@pytest.fixture
def slow_grace_server(state_dir: Path) -> Iterator[WorkflowServer]:
    """Ticks of 0.25 s: a fenced runner's SIGKILL comes 10 s after its SIGTERM."""
    server = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.25, execute_runs=True)
    server.start()
    try:
        yield server
    finally:
        server.stop("test teardown", drain_s=0)


def test_a_fenced_runners_pipelined_messages_are_refused_and_nothing_external_happens(
    slow_grace_server: WorkflowServer, short_tmp: Path
) -> None:
    state_dir = slow_grace_server.state_dir
    project, root = short_tmp / "project", short_tmp
    os.mkfifo(root / "c1.fifo")
    write_workflow(project, "pipeline", PIPELINE.format(root=str(root), hold=True))
    with WorkflowClient(state_dir, autostart=False) as client:
        run_id = start_run(client, project, "pipeline", {})
        wait_fifo(root / "c1.fifo")
        client.call("run.pause", run_id=run_id)  # commits, then fences the runner
        (root / "go").touch()  # the fenced runner goes on: c1 finishes, c2 and c3 run
        wait_for(client, run_id, {"paused"})
        _wait_runner_gone(client)
        exits = _rows(
            state_dir, "SELECT status, exit_code FROM runner_epochs WHERE run_id = ?", run_id
        )
        assert exits == [("cancelled", 3)], "it ran on, was refused (claim lost), and exited"
        assert not (root / "deploy.log").exists(), "nothing external happened after the fence"
        assert [a for a in _attempts(state_dir, run_id) if a[0] != "c1"] == [], (
            "every message after the fence was refused"
        )
        client.call("run.resume", run_id=run_id)
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        assert view["display"]["status"] == "completed", view
        assert client.call("state.verify")["receipt"]["consistent"]
    assert (root / "deploy.log").read_text().splitlines() == ["run"]
    assert (root / "c1.count").read_text() == "xx", "the interrupted pure node ran again"


def _wait_runner_gone(client: WorkflowClient) -> None:
    """No event marks a runner's reaping: a bounded poll of `server.status`."""
    deadline = time.monotonic() + 60
    pause = threading.Event()
    while client.call("server.status")["receipt"]["activeRunners"]:
        assert time.monotonic() < deadline, "the fenced runner was never reaped"
        pause.wait(0.02)


def test_a_runner_killed_after_pipelined_messages_leaves_them_committed_or_rerun(
    state_dir: Path, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, root = short_tmp / "project", short_tmp
    write_workflow(project, "pipeline", PIPELINE.format(root=str(root), hold=False))
    # The first runner dies right after it wrote c2's finish, pipelined, unanswered.
    monkeypatch.setenv(CRASH_ENV, "runner.message.node_finished.after_send@2")
    monkeypatch.setenv(CRASH_ONCE_ENV, str(root / "crashed"))
    server = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    server.start()
    try:
        with WorkflowClient(state_dir, autostart=False) as client:
            run_id = start_run(client, project, "pipeline", {})
            view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
            assert view["display"]["status"] == "completed", view
            assert client.call("state.verify")["receipt"]["consistent"]
    finally:
        server.stop("test teardown", drain_s=0)
    assert (root / "crashed").exists(), "the crash point was reached"
    attempts = _attempts(state_dir, run_id)
    # Everything the runner wrote before it died was applied: c1 and c2 committed in
    # generation 1 and never ran again; the next runner went on from c3.
    assert attempts[:2] == [("c1", 1, "completed"), ("c2", 1, "completed")]
    assert [path for path, _, _ in attempts] == ["c1", "c2", "c3", "deploy", "c4"]
    assert (root / "c1.count").read_text() == "x" and (root / "c2.count").read_text() == "x"
    assert (root / "deploy.log").read_text().splitlines() == ["run"], "no effect ran twice"
