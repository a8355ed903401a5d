"""Run state larger than one runner frame, end to end: a real server, real runners.

Two nodes commit outputs of about 800 KB each, so the state a resumed runner or a
continuation run starts from (about 1.6 MB) cannot travel in one 1 MiB frame. The server
stores it as a blob and sends a reference; the runner reads it back in verified parts.
A single output over the value cap (`PI_WORKFLOWS_MAX_VALUE_BYTES`, set to 1 MiB here)
fails its node with `outputTooLarge`.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.wire.framing import MAX_FRAME_BYTES
from pi_workflows.wire.runner import MAX_VALUE_ENV
from tests.conftest import write_workflow
from tests.server.runs import TERMINAL, start_run, wait_fifo, wait_for

pytestmark = pytest.mark.timeout(120)

SIZE = 800_000

BIG_STATE = """
import os, time
from pathlib import Path
from pi_workflows import checkpoint, compute, define_workflow

SIZE = {size}
COUNTER = Path({counter!r})

def slow(ctx):
    count = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1
    COUNTER.write_text(str(count))
    if count == 1:
        with open({fifo!r}, "w") as pipe:
            pipe.write(str(os.getpid()))  # this node runs in the runner process
        time.sleep(300)
    return {{"a": len(ctx.outputs["a"]["text"]), "b": len(ctx.outputs["b"]["text"])}}

def done(ctx):
    return {{
        "a": ctx.outputs["a"]["text"] == "a" * SIZE,
        "b": ctx.outputs["b"]["text"] == "b" * SIZE,
        "slow": ctx.outputs["slow"],
        "ok": ctx.outputs["approve"]["ok"],
    }}

workflow = define_workflow(
    name="bigstate",
    start_at="a",
    nodes={{
        "a": compute(lambda ctx: {{"text": "a" * SIZE}}),
        "b": compute(lambda ctx: {{"text": "b" * SIZE}}),
        "slow": compute(slow, timeout=600),
        "approve": checkpoint(summary="Go on?"),
        "done": compute(done),
    }},
    edges=[
        {{"from": "a", "to": "b"}}, {{"from": "b", "to": "slow"}},
        {{"from": "slow", "to": "approve"}}, {{"from": "approve", "to": "done"}},
    ],
)
"""

TOO_BIG = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="toobig",
    start_at="big",
    nodes={{
        "big": compute(lambda ctx: {{"text": "x" * {size}}}),
        "recover": compute(lambda ctx: {{"recovered": ctx.results["big"]["outcome"]}}),
    }},
    edges={edges},
)
"""
ROUTE_FAILURE = (
    '[{"from": "big", "switch": {"on": "$result.outcome", '
    '"cases": {"failed": "recover"}, "default": "recover"}}]'
)


def _query(server: WorkflowServer, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    database = sqlite3.connect(f"file:{server.state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        return database.execute(sql, params).fetchall()
    finally:
        database.close()


def test_state_over_the_frame_limit_reaches_a_resumed_runner_and_a_continuation(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    fifo, counter = short_tmp / "slow.fifo", short_tmp / "counter"
    os.mkfifo(fifo)
    source = BIG_STATE.format(size=SIZE, counter=str(counter), fifo=str(fifo))
    write_workflow(project, "bigstate", source)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "bigstate")
        runner_pid = int(wait_fifo(fifo))
        os.kill(runner_pid, signal.SIGKILL)  # after `a` and `b` committed their outputs
        waiting = wait_for(client, run_id, {"waiting"} | TERMINAL)
        assert waiting["display"]["status"] == "waiting", waiting
        assert waiting["generation"] == 2, "the resumed runner read the large state"
        answered = client.call("run.answer", {"answer": {"ok": True}}, run_id=run_id)
        continuation = answered["receipt"]["continuationRunId"]
        done = wait_for(client, continuation, TERMINAL)
    assert done["display"]["status"] == "completed", done
    assert counter.read_text() == "2"
    ((output,),) = _query(
        running_server,
        "SELECT b.content FROM node_attempts AS a JOIN blobs AS b ON b.digest = a.output_hash "
        "WHERE a.run_id = ? AND a.node_path = 'done'",
        continuation,
    )
    assert json.loads(output) == {"a": True, "b": True, "slow": {"a": SIZE, "b": SIZE}, "ok": True}
    # Both the resume command and the continuation command referenced a stored state.
    states = _query(
        running_server, "SELECT count(*) FROM blobs WHERE byte_length > ?", MAX_FRAME_BYTES
    )
    assert states[0][0] >= 2
    workers = _query(
        running_server, "SELECT status FROM runner_epochs WHERE run_id = ? ORDER BY rowid", run_id
    )
    assert [status for (status,) in workers] == ["crashed", "exited"]


CAP = 1024 * 1024


@pytest.fixture
def capped_server(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkflowServer]:
    """A server (and its runners: they get its environment) with a 1 MiB value cap."""
    monkeypatch.setenv(MAX_VALUE_ENV, str(CAP))
    instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown")


@pytest.mark.parametrize("routed", [False, True], ids=["unrouted", "routed"])
def test_an_output_over_the_value_cap_fails_its_node_not_the_runner(
    capped_server: WorkflowServer, short_tmp: Path, routed: bool
) -> None:
    running_server = capped_server
    project = short_tmp / "project"
    source = TOO_BIG.format(size=MAX_FRAME_BYTES, edges=ROUTE_FAILURE)
    if not routed:  # the same node alone, with no edge for its failure
        recover = '"recover": compute(lambda ctx: {"recovered": ctx.results["big"]["outcome"]}),'
        source = source.replace(f"        {recover}\n", "").replace(ROUTE_FAILURE, "[]")
    write_workflow(project, "toobig", source)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "toobig")
        view = wait_for(client, run_id, TERMINAL)
    assert view["generation"] == 1, "no runner crashed on the way"
    ((error,),) = _query(
        running_server,
        "SELECT error FROM node_attempts WHERE run_id = ? AND node_path = 'big'",
        run_id,
    )
    assert error.startswith("outputTooLarge: ")
    assert f"at most {CAP} bytes" in error and MAX_VALUE_ENV in error, "it names the cap"
    if routed:
        assert view["display"]["status"] == "completed"
        assert [step["node"] for step in view["steps"]] == ["big", "recover"]
    else:
        assert view["display"]["status"] == "failed"
        assert "big: outputTooLarge: " in view["failureReason"], "the node and its failure code"
