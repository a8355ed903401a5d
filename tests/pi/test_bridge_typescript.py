"""The bridge extension's TypeScript, from `make test`: strict type check, then node's
test runner over tests/node/ (the wire fixture corpus through the TypeScript canonical
JSON codec and client.v1 decoder, and the `workflow` tool's logic).

pi loads the bridge with jiti and no build step; the tests run under the same loader
(`node --import jiti/register`), since node 20 cannot run TypeScript by itself.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.wire.client import socket_path_for
from tests.conftest import write_workflow
from tests.pi.conftest import REPO, require_node_tools
from tests.server.runs import start_run, wait_fifo

NODE_TESTS = sorted((REPO / "tests" / "node").glob("*.test.ts"))


def test_the_bridge_type_checks_strictly() -> None:
    require_node_tools()
    result = subprocess.run(
        [str(REPO / "node_modules" / ".bin" / "tsc"), "-p", str(REPO / "tsconfig.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_node_test_runner_passes_the_fixture_corpus_and_the_tool_tests() -> None:
    require_node_tools()
    assert len(NODE_TESTS) >= 2
    result = subprocess.run(
        ["node", "--import", "jiti/register", "--test", *map(str, NODE_TESTS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    summary = dict(re.findall(r"^# (pass|fail|cancelled|todo|skipped) (\d+)$", result.stdout, re.M))
    failed = [line for line in result.stdout.splitlines() if line.startswith("not ok")]
    assert result.returncode == 0 and not failed, "\n".join(failed) or result.stderr[-2000:]
    corpus = len(list((REPO / "tests" / "fixtures" / "wire").glob("*/*.json")))
    assert int(summary["pass"]) > corpus, "every fixture file ran as its own test"
    assert summary["fail"] == summary["cancelled"] == summary["skipped"] == "0"


# --- the socket transport against the real server ---------------------------------------

TRANSPORT_TEST = REPO / "tests" / "node" / "transport_live.ts"

PENDING_AGENT = """
import time

from pi_workflows import agent, define_workflow


def slow(output, ctx):
    time.sleep(1.5)  # the bridge's abort lands while the response is held


workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={
        "ask": agent(
            prompt="Summarise",
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            validate=slow,
            timeout=110,
        ),
    },
    edges=[],
)
"""


@pytest.fixture
def server_with_a_pending_request(
    state_dir: Path, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[WorkflowServer, Path]]:
    # A "pi" that announces itself and never answers: the runner spawns it after the
    # request committed, so the step's request stays pending while the test submits.
    fifo = short_tmp / "pi-started"
    os.mkfifo(fifo)
    fake_pi = short_tmp / "fake-pi"
    release = short_tmp / "release"
    # It exits once the test is done (the runner then fails the step), so the server
    # stops at once instead of waiting out pi's ready timeout.
    fake_pi.write_text(
        f"#!/bin/sh\necho started > {fifo}\nwhile [ ! -e {release} ]; do sleep 0.05; done\n"
    )
    fake_pi.chmod(0o700)
    monkeypatch.setenv("PI_WORKFLOWS_PI", str(fake_pi))
    instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    instance.start()
    try:
        yield instance, fifo
    finally:
        release.touch()
        instance.stop("test teardown")


@pytest.mark.timeout(120)
def test_the_socket_transport_speaks_to_the_real_server(
    server_with_a_pending_request: tuple[WorkflowServer, Path], short_tmp: Path
) -> None:
    """hello and a round trip; a held submit rejected by the validation child with its
    error; an abort ends the wait for a held response; a connection lost after the commit
    retried with a new request ID and the same key, adopting the acceptance; exactly one
    accepted submission stored."""
    require_node_tools()
    server, fifo = server_with_a_pending_request
    project = short_tmp / "project"
    write_workflow(project, "ask", PENDING_AGENT)
    with WorkflowClient(server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        assert wait_fifo(fifo) == "started\n"
    (database,) = Path(server.state_dir).rglob("*.sqlite")
    with sqlite3.connect(database) as conn:
        request_id, attempt_id, node_path = conn.execute(
            "SELECT r.request_id, r.attempt_id, a.node_path FROM interactive_requests r"
            " JOIN node_attempts a ON a.attempt_id = r.attempt_id WHERE r.run_id = ?",
            (run_id,),
        ).fetchone()
    env = {
        **os.environ,
        "PIW_SOCKET": str(socket_path_for(Path(server.state_dir))),
        "PIW_RUN_ID": run_id,
        "PIW_INTERACTION_ID": request_id,
        "PIW_STEP": node_path,
        "PIW_ATTEMPT": attempt_id,
    }
    result = subprocess.run(
        ["node", "--import", "jiti/register", "--test", str(TRANSPORT_TEST)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    failed = [line for line in result.stdout.splitlines() if line.startswith("not ok")]
    assert result.returncode == 0 and not failed, result.stdout[-4000:] + result.stderr[-2000:]
    summary = dict(re.findall(r"^# (pass|fail) (\d+)$", result.stdout, re.M))
    assert summary == {"pass": "5", "fail": "0"}, result.stdout[-2000:]
    with sqlite3.connect(database) as conn:
        outcomes = conn.execute(
            "SELECT outcome FROM interactive_submissions WHERE request_id = ?"
            " ORDER BY submitted_at",
            (request_id,),
        ).fetchall()
        status = conn.execute(
            "SELECT status FROM interactive_requests WHERE request_id = ?", (request_id,)
        ).fetchone()
    assert outcomes == [("rejected",), ("accepted",)], outcomes
    assert status == ("settled",)
