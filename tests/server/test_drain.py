"""A graceful stop drains: runs are handed back at their next durable boundary.

workflow-server.md § Pause and cancellation and issue 10 item 9: `server stop` stops
admitting work, lets an applying effect or running shell command settle within the drain
period, then hands runs back; only an effect still applying when the period ends becomes
ambiguous, and the log names its run. Real servers, runners and shell commands; each
command records its executions in a file.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.conftest import write_workflow
from tests.server.runs import TERMINAL, start_run, wait_fifo, wait_for

pytestmark = pytest.mark.timeout(120)

DEPLOY = """
from pi_workflows import compute, define_workflow, shell

LOG, FIFO = {log!r}, {fifo!r}
SCRIPT = 'echo run >> "$0"; echo go > "$1"; sleep {seconds}; echo deployed'

workflow = define_workflow(
    name="deploy",
    start_at="deploy",
    nodes={{
        "deploy": shell(lambda ctx: ["sh", "-c", SCRIPT, LOG, FIFO]),
        "after": compute(lambda ctx: {{"after": ctx.outputs["deploy"]["stdout"].strip()}}),
    }},
    edges=[{{"from": "deploy", "to": "after"}}],
)
"""

THINK = """
from pi_workflows import compute, define_workflow

FIFO = {fifo!r}

def think(ctx):
    with open(FIFO, "w") as pipe:
        pipe.write("thinking")
    import time
    time.sleep(600)  # a long pure node: it may run again, so nothing waits for it
    return {{}}

workflow = define_workflow(name="think", start_at="think", nodes={{"think": compute(think)}})
"""


def _deploy(project: Path, tmp: Path, seconds: int) -> tuple[Path, Path]:
    log, fifo = tmp / "deploys.log", tmp / "deploy.fifo"
    os.mkfifo(fifo)
    write_workflow(project, "deploy", DEPLOY.format(log=str(log), fifo=str(fifo), seconds=seconds))
    return log, fifo


def _rows(state_dir: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Read the state of a stopped server (no server holds the file open)."""
    connection = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()


def _server(state_dir: Path) -> WorkflowServer:
    server = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    server.start()
    return server


def _finish_on_a_new_server(state_dir: Path, run_id: str) -> dict[str, Any]:
    successor = _server(state_dir)
    try:
        with WorkflowClient(state_dir, autostart=False) as client:
            view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
            assert client.call("state.verify")["receipt"]["consistent"]
            return view
    finally:
        successor.stop("test teardown")


def test_a_stop_during_a_shell_step_lets_it_finish_and_the_next_server_goes_on(
    state_dir: Path, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    log, fifo = _deploy(project, short_tmp, seconds=3)
    server = _server(state_dir)
    with WorkflowClient(state_dir, autostart=False) as client:
        run_id = start_run(client, project, "deploy", {})
    wait_fifo(fifo)  # the command is running
    server.stop("test", drain_s=60)
    # The shell step finished and committed; the run went back to the queue before
    # its next node started.
    attempts = _rows(
        state_dir,
        "SELECT node_path, status FROM node_attempts WHERE run_id = ? ORDER BY started_at",
        run_id,
    )
    assert attempts == [("deploy", "completed")]
    assert _rows(state_dir, "SELECT state FROM effects WHERE run_id = ?", run_id) == [("applied",)]
    assert _rows(state_dir, "SELECT state FROM run_queue WHERE run_id = ?", run_id) == [("queued",)]
    view = _finish_on_a_new_server(state_dir, run_id)
    assert view["display"]["status"] == "completed", view
    assert log.read_text().splitlines() == ["run"], "the command ran exactly once"
    steps = [(step["node"], step["status"]) for step in view["steps"]]
    assert steps == [("deploy", "completed"), ("after", "completed")]


def test_an_effect_still_applying_when_the_drain_ends_is_ambiguous_and_logged(
    state_dir: Path, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    log, fifo = _deploy(project, short_tmp, seconds=300)
    server = _server(state_dir)
    with WorkflowClient(state_dir, autostart=False) as client:
        run_id = start_run(client, project, "deploy", {})
    wait_fifo(fifo)
    server.stop("test", drain_s=0.2)
    records = [
        json.loads(line)
        for line in (state_dir / "logs" / "server.log").read_text().splitlines()
        if line.strip()
    ]
    named = [r for r in records if r.get("action") == "runner.drain_timeout"]
    assert [r.get("run_id") for r in named] == [run_id]
    view = _finish_on_a_new_server(state_dir, run_id)
    assert view["display"]["status"] == "ambiguous", view
    assert log.read_text().splitlines() == ["run"], "a non-idempotent command never repeats"


def test_a_stop_does_not_wait_for_a_pure_node(state_dir: Path, short_tmp: Path) -> None:
    project = short_tmp / "project"
    fifo = short_tmp / "think.fifo"
    os.mkfifo(fifo)
    write_workflow(project, "think", THINK.format(fifo=str(fifo)))
    server = _server(state_dir)
    with WorkflowClient(state_dir, autostart=False) as client:
        run_id = start_run(client, project, "think", {})
    wait_fifo(fifo)
    # A drain longer than this test's timeout: the stop must not wait for the node.
    server.stop("test", drain_s=3600)
    assert _rows(state_dir, "SELECT state FROM run_queue WHERE run_id = ?", run_id) == [("queued",)]
    assert _rows(
        state_dir,
        "SELECT status FROM node_attempts WHERE run_id = ? AND node_path = 'think'",
        run_id,
    ) != [("completed",)]


def test_server_stop_refuses_a_bad_drain_period(running_server: WorkflowServer) -> None:
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        for bad in (-1, "soon", 10_000):
            answer = client.request("server.stop", {"drainSeconds": bad})
            assert answer["outcome"] == "rejected"
            assert answer["error"]["code"] == "drainInvalid"
        assert client.call("server.status")["receipt"]["state"] == "running"
