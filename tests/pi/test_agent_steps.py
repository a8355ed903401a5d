"""Agent steps through a real server and runner (issue 12, the slice built so far).

With `PI_WORKFLOWS_PI` naming a missing file, the step fails `piUnavailable` before any
request exists, the run view says why, and `$result.outcome` routes the failure.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.conftest import write_workflow
from tests.server.runs import TERMINAL, start_run, wait_for

pytestmark = pytest.mark.timeout(120)

ONE_AGENT = """
from pi_workflows import agent, compute, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={
        "ask": agent(prompt="Say hi", output_schema={"type": "object"}),
        "fallback": compute(lambda ctx: {"routed": "failed"}),
    },
    edges=[{"from": "ask", "switch": {"on": "$result.outcome",
                                      "cases": {"failed": "fallback"}}}],
)
"""


@pytest.fixture
def server_without_pi(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[WorkflowServer]:
    # Set before the server (and its zygote) start: runners inherit the environment.
    monkeypatch.setenv("PI_WORKFLOWS_PI", str(tmp_path / "no-such-pi"))
    instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown")


def test_a_missing_pi_fails_the_step_with_pi_unavailable_and_routes_it(
    server_without_pi: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "ask", ONE_AGENT)
    with WorkflowClient(server_without_pi.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
    assert view["display"]["status"] == "completed", view
    (database,) = Path(server_without_pi.state_dir).rglob("*.sqlite")
    with sqlite3.connect(database) as conn:
        rows = conn.execute(
            "SELECT status, error FROM node_attempts WHERE run_id = ? AND node_path = 'ask'",
            (run_id,),
        ).fetchall()
        requests = conn.execute("SELECT count(*) FROM interactive_requests").fetchone()[0]
    assert [status for status, _ in rows] == ["failed"]
    assert "PI_WORKFLOWS_PI" in rows[0][1], rows
    assert requests == 0, "pi is resolved before any request is proposed"


@pytest.fixture
def server_with_a_pi_that_exists(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[WorkflowServer]:
    # A file that exists: the step gets past `piUnavailable` and proposes its request.
    monkeypatch.setenv("PI_WORKFLOWS_PI", "/bin/true")
    instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown")


def test_a_proposed_request_is_committed_and_the_server_stays_up(
    server_with_a_pi_that_exists: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "ask", ONE_AGENT)
    with WorkflowClient(server_with_a_pi_that_exists.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        status = client.call("server.status")
    assert view["display"]["status"] == "completed", view  # the failure routed to fallback
    assert status["outcome"] == "accepted", "the commit of interaction.requested kept it up"
    (database,) = Path(server_with_a_pi_that_exists.state_dir).rglob("*.sqlite")
    with sqlite3.connect(database) as conn:
        requests = conn.execute(
            "SELECT count(*) FROM interactive_requests WHERE run_id = ?", (run_id,)
        ).fetchone()[0]
    assert requests == 1
