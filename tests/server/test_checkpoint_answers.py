"""Checkpoint answers are checked against the checkpoint's `answerSchema`, through the CLI.

The server reads the schema from the run's stored definition snapshot (never from
workflow code). A refused answer is `rejected` with an error that names the failing
path, and no continuation run is created; a valid answer still continues the run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.conftest import Processes, write_workflow
from tests.server.runs import TERMINAL, wait_for

pytestmark = pytest.mark.timeout(120)


APPROVAL = """
from pi_workflows import checkpoint, compute, define_workflow

SCHEMA = {
    "type": "object",
    "required": ["approved"],
    "properties": {
        "approved": {"type": "boolean"},
        "notes": {"type": "array", "items": {"type": "string"}},
    },
    "additionalProperties": False,
}

workflow = define_workflow(
    name="approval",
    start_at="ask",
    nodes={
        "ask": checkpoint(summary="Ship it?", input_schema=SCHEMA),
        "done": compute(lambda ctx: {"shipped": ctx.outputs["ask"]["approved"]}),
    },
    edges=[{"from": "ask", "to": "done"}],
)
"""


@pytest.fixture
def waiting_run(running_server: WorkflowServer, short_tmp: Path) -> Iterator[tuple[str, Path]]:
    project = short_tmp / "project"
    write_workflow(project, "approval", APPROVAL)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        answer = client.call("run.start", {"workflow": "approval", "projectPath": str(project)})
        run_id = answer["receipt"]["runId"]
        waiting = wait_for(client, run_id, {"waiting"} | TERMINAL)
        assert waiting["display"]["status"] == "waiting", waiting
    yield run_id, running_server.state_dir


def _run_ids(state_dir: Path) -> list[str]:
    with WorkflowClient(state_dir, autostart=False) as client:
        return [item["runId"] for item in client.call("run.list")["receipt"]["items"]]


@pytest.mark.parametrize(
    ("answer", "path", "says"),
    [
        ('{"approved": "yes"}', "/approved", "must be boolean"),
        ('{"approved": true, "notes": ["ok", 7]}', "/notes/1", "must be string"),
        ("{}", "/approved", "is required"),
        (
            '{"approved": true, "extra": 1}',
            "/ (the whole answer)",
            "has 1 property the schema does not allow (allowed: approved, notes)",
        ),
        ('"yes"', "/ (the whole answer)", "must be object"),
    ],
)
def test_an_answer_that_breaks_the_schema_is_rejected_and_starts_nothing(
    processes: Processes, waiting_run: tuple[str, Path], answer: str, path: str, says: str
) -> None:
    run_id, state_dir = waiting_run
    refused = processes.cli(state_dir, "run", "answer", run_id, "--input-json", answer)
    assert refused.returncode != 0
    assert refused.stdout == ""
    message = refused.stderr.strip()
    assert "rejected: the answer does not match the checkpoint's answerSchema" in message
    assert f"at {path}: " in message
    assert says in message
    assert _run_ids(state_dir) == [run_id], "no continuation run was created"
    with WorkflowClient(state_dir, autostart=False) as client:
        direct = client.request("run.answer", {"answer": json.loads(answer)}, run_id=run_id)
        assert direct["outcome"] == "rejected"
        assert direct["error"]["code"] == "answerInvalid"
        view = client.call("run.get", run_id=run_id)["receipt"]
    assert view["display"]["status"] == "waiting", "the checkpoint still waits for an answer"


def test_a_valid_answer_after_a_refused_one_continues_the_run(
    processes: Processes, waiting_run: tuple[str, Path]
) -> None:
    run_id, state_dir = waiting_run
    refused = processes.cli(state_dir, "run", "answer", run_id, "--input-json", '{"approved": 1}')
    assert refused.returncode != 0
    accepted = processes.cli(
        state_dir, "run", "answer", run_id, "--input-json", '{"approved": true, "notes": ["go"]}'
    )
    assert accepted.returncode == 0, accepted.stderr
    continuation = accepted.stdout.strip()
    assert continuation.startswith("run-")
    assert sorted(_run_ids(state_dir)) == sorted([run_id, continuation])
    waited = processes.cli(state_dir, "run", "wait", continuation, "--timeout", "60", "--json")
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["display"]["status"] == "completed"
    with WorkflowClient(state_dir, autostart=False) as client:
        parent = client.call("run.get", run_id=run_id)["receipt"]
        late = client.request("run.answer", {"answer": {"approved": False}}, run_id=run_id)
    assert parent["display"]["status"] == "completed"
    assert late["outcome"] == "rejected", "one answer only"
