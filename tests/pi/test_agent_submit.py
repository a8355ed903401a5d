"""`interaction.submit` against an agent step that a real `pi --mode rpc` is working on.

The first test sends the submission from Python, as the bridge would, while the real pi
is in the middle of the step's model turn (the fake provider holds the stream open).
The second drives the whole path through pi's `workflow` tool and the bridge's socket
transport (branch h12-bridge): an output `validate` refuses comes back to the model as
the tool result, the corrected call is accepted, and the run completes with the
server's value. (pi itself checks the tool's parameters, the output schema, before the
bridge sees a call: a schema error is tested in tests/server/test_interaction_submit.py.)
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.testing import FakeProvider, ScriptedTurn, Stall, workflow_submit_turn
from tests.conftest import write_workflow
from tests.pi.agents import attempt_of as _attempt_of
from tests.server.runs import TERMINAL, start_run, wait_for
from tests.server.test_interaction_submit import (
    accepted_rows,
    pending_request,
    stored_value,
    submit,
)

pytestmark = pytest.mark.timeout(120)

AGENT = """
from pi_workflows import agent, compute, define_workflow


def check(output, ctx):
    if output["n"] < 0:
        raise ValueError("n must not be negative")
    return {"n": output["n"], "prep": ctx.outputs["prep"]}


workflow = define_workflow(
    name="ask",
    start_at="prep",
    nodes={
        "prep": compute(lambda ctx: {"ready": True}),
        "ask": agent(
            prompt="Give n",
            output_schema={"type": "object", "properties": {"n": {"type": "integer"}},
                           "required": ["n"]},
            validate=check,
            provider="fake",
            model="fake-model",
            timeout=120,
        ),
    },
    edges=[{"from": "prep", "to": "ask"}],
)
"""


@pytest.fixture
def server_with_pi(
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    pi_binary: Path,
    provider: FakeProvider,
    pi_slot: None,
) -> Iterator[WorkflowServer]:
    provider.write_agent_dir(state_dir.parent)
    monkeypatch.setenv("PI_WORKFLOWS_PI", str(pi_binary))
    instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown", 0)


def test_a_valid_submit_while_pi_works_on_the_step_is_accepted_and_readable(
    server_with_pi: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    state_dir = server_with_pi.state_dir
    project = short_tmp / "project"
    write_workflow(project, "ask", AGENT)
    provider.script(Stall())  # pi streams the step's turn until the test ends
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        run_id = start_run(client, project, "ask")
        request_id = pending_request(state_dir, run_id)
        provider.wait_for_requests(1, 60)  # the real pi is in the step's model turn
        answer = submit(client, run_id, request_id, {"n": 2}, "call-1")
    assert answer["outcome"] == "accepted", answer
    assert len(accepted_rows(state_dir, request_id)) == 1
    # What the step's runner reads back with `interaction.requested`.
    assert stored_value(state_dir, request_id) == {"n": 2, "prep": {"ready": True}}


def test_the_model_corrects_a_rejected_output_and_the_run_completes_with_the_servers_value(
    server_with_pi: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    state_dir = server_with_pi.state_dir
    project = short_tmp / "project"
    write_workflow(project, "ask", AGENT)
    seen: list[str] = []

    def corrected(body: Mapping[str, Any]) -> ScriptedTurn:
        seen.append(json.dumps(body.get("messages")))  # holds the rejection, as tool result
        return workflow_submit_turn("ask", _attempt_of(body), {"n": 4})

    provider.script(
        # Schema-valid (pi checks the tool's parameters itself), but `validate` refuses it.
        lambda body: workflow_submit_turn("ask", _attempt_of(body), {"n": -4}),
        corrected,
    )
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        run_id = start_run(client, project, "ask")
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
    assert view["display"]["status"] == "completed", view
    assert seen and "n must not be negative" in seen[0], "the model saw the validate error"
    (database,) = Path(state_dir).rglob("*.sqlite")
    with contextlib.closing(sqlite3.connect(database)) as conn:
        outcomes = conn.execute(
            "SELECT s.outcome FROM interactive_submissions s JOIN interactive_requests r "
            "ON r.request_id = s.request_id WHERE r.run_id = ? ORDER BY s.submitted_at",
            (run_id,),
        ).fetchall()
        (output,) = conn.execute(
            "SELECT b.content FROM node_attempts a JOIN blobs b ON b.digest = a.output_hash"
            " WHERE a.run_id = ? AND a.node_path = 'ask'",
            (run_id,),
        ).fetchone()
    assert [o for (o,) in outcomes] == ["rejected", "accepted"]
    assert json.loads(output) == {"n": 4, "prep": {"ready": True}}
