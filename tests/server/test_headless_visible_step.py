"""A headless run cannot use a visible assistant-message step (issue 12, item 1).

workflow-server.md § Interactive Pi execution: a visible assistant-message step has no
tool completion action and needs the origin Pi session, so a run started without one
(CLI, library: `headless`) must be refused at `run.start` with a clear error. The first
tests take a real resolver answer for an agent workflow and mark its step (kind
`assistant`, or `visible: true` as `assistant_message` does), then drive `run.start`'s
commit (`start_run`) on a real database; the last starts an `assistant_message` workflow
through a real server and the CLI (issue 29).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient
from pi_workflows.domain._operations import (
    OperationContext,
    StartRequest,
    origin_session_steps,
    start_run,
)
from pi_workflows.storage import Database
from pi_workflows.wire.canonical import dumps, sha256_digest
from tests.conftest import Processes, write_workflow

pytestmark = pytest.mark.timeout(60)

ASK = """
from pi_workflows import agent, compute, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="prep",
    nodes={
        "prep": compute(lambda ctx: {}),
        "ask": agent(prompt="Say hi", output_schema={"type": "object"}),
    },
    edges=[{"from": "prep", "to": "ask"}],
)
"""


def _resolved(project: Path, agent_dir: Path) -> dict[str, Any]:
    """What the resolver child answers for `ask` (run as the server runs it: a child)."""
    request = {"workflow": "ask", "projectPath": str(project), "agentDir": str(agent_dir)}
    answer = subprocess.run(
        [sys.executable, "-m", "pi_workflows.engine.resolve"],
        input=dumps({**request, "input": {}}),
        capture_output=True,
        timeout=30,
        check=True,
    )
    resolved: dict[str, Any] = json.loads(answer.stdout)
    assert resolved["ok"], resolved
    return resolved


def _with_visible_step(resolved: dict[str, Any], **node: Any) -> dict[str, Any]:
    """The same answer with step `ask` changed as a snapshot with such a step would say."""
    changed = copy.deepcopy(resolved)
    changed["definition"]["nodes"]["ask"].update(node)
    changed["definitionDigest"] = sha256_digest(changed["definition"])
    return changed


def _start(db: Database, tmp: Path, resolved: dict[str, Any], key: str) -> dict[str, Any]:
    request: Any = {
        "type": "request",
        "requestId": f"req-{uuid.uuid4().hex}",
        "clientId": "cli-test",
        "operation": "run.start",
        "idempotencyKey": key,
        "payload": {"workflow": "ask", "input": {}, "projectPath": str(tmp / "project")},
    }
    ctx = OperationContext(epoch=1, owner_id="server-1", agent_dir=tmp)
    start = StartRequest("ask", str(tmp / "project"), {})
    return start_run(db, request, ctx, start, resolved)


@pytest.fixture
def resolved(tmp_path: Path) -> dict[str, Any]:
    write_workflow(tmp_path / "project", "ask", ASK)
    return _resolved(tmp_path / "project", tmp_path)


@pytest.mark.parametrize("marking", [{"kind": "assistant"}, {"visible": True}])
def test_run_start_refuses_a_visible_assistant_step_and_commits_no_run(
    db: Database, tmp_path: Path, resolved: dict[str, Any], marking: dict[str, Any]
) -> None:
    visible = _with_visible_step(resolved, **marking)
    answer = _start(db, tmp_path, visible, "start-1")
    assert answer["outcome"] == "rejected", answer
    error = answer["error"]
    assert error["code"] == "headlessVisibleStep"
    assert "headless run cannot use a visible assistant-message step (ask)" in error["message"]
    assert "origin Pi session" in error["message"]
    assert db.fetch_value("SELECT count(*) FROM runs", {}) == 0
    again = _start(db, tmp_path, visible, "start-1")
    assert again["outcome"] == "rejected" and again["error"] == error, "the stored rejection"


def test_an_agent_step_without_one_starts_headless(
    db: Database, tmp_path: Path, resolved: dict[str, Any]
) -> None:
    assert origin_session_steps(resolved["definition"]) == []
    answer = _start(db, tmp_path, resolved, "start-2")
    assert answer["outcome"] == "accepted", answer
    run_id = answer["receipt"]["runId"]
    mode = db.fetch_value(
        "SELECT execution_mode FROM run_bindings WHERE run_id = :run_id", {"run_id": run_id}
    )
    assert mode == "headless"


def test_origin_session_steps_names_every_marked_node(resolved: dict[str, Any]) -> None:
    definition = copy.deepcopy(resolved["definition"])
    definition["nodes"]["prep"]["kind"] = "assistant"
    definition["nodes"]["ask"]["visible"] = True
    assert origin_session_steps(definition) == ["ask", "prep"]


PLAN = """
from pi_workflows import assistant_message, compute, define_workflow

workflow = define_workflow(
    name="plan",
    start_at="prep",
    nodes={
        "prep": compute(lambda ctx: {}),
        "propose": assistant_message("Propose a plan", max_chars=500),
    },
    edges=[{"from": "prep", "to": "propose"}],
)
"""


def test_cli_run_start_of_an_assistant_message_workflow_is_refused_naming_the_node(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    """Through a real server: the CLI's (headless) start is refused, and no run exists."""
    project = short_tmp / "project"
    write_workflow(project, "plan", PLAN)
    started = processes.cli(state_dir, "run", "start", "plan", "--project", str(project))
    lock = state_dir / "host" / "server.lock"
    if lock.exists() and lock.read_text().strip():
        processes.adopt(int(lock.read_text().strip()))
    assert started.returncode != 0, started.stdout
    assert "visible assistant-message step (propose)" in started.stderr, started.stderr
    with WorkflowClient(state_dir, autostart=False) as client:
        answer = client.request(
            "run.start", {"workflow": "plan", "input": {}, "projectPath": str(project)}
        )
        assert answer["outcome"] == "rejected", answer
        assert answer["error"]["code"] == "headlessVisibleStep"
        assert "(propose)" in answer["error"]["message"]
        assert client.call("run.list")["receipt"]["items"] == []
    processes.cli(state_dir, "server", "stop")
