"""A pause or cancel sent right after `run.start` lands, whatever the launch's progress.

The scheduler's admission commits the run's claim before the runner host has its
launch plan; a command that reaches the runner host in that window used to present no
claim and be answered `claimLost`. It must be accepted: the runner host holds it until
the launch arrives (or a short wait passes) and then presents the launch's claim.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pi_workflows.server import WorkflowServer
from pi_workflows.wire.client import WorkflowClient
from tests.conftest import SLEEPY_WORKFLOW, write_workflow

ROUNDS = 8


@pytest.mark.parametrize("operation", ["run.pause", "run.cancel"])
def test_a_command_right_after_start_is_accepted(
    running_server: WorkflowServer, project: Path, operation: str
) -> None:
    write_workflow(project, "sleepy", SLEEPY_WORKFLOW.format(name="sleepy"))
    with WorkflowClient(running_server.state_dir, autostart=False, timeout=30) as client:
        for _ in range(ROUNDS):
            started = client.call("run.start", {"workflow": "sleepy", "projectPath": str(project)})
            run_id = started["receipt"]["runId"]
            answer = client.request(operation, {}, run_id=run_id)
            assert answer["outcome"] == "accepted", answer.get("error")
            view = client.call("run.get", run_id=run_id)["receipt"]
            expected = "paused" if operation == "run.pause" else "cancelled"
            assert view["display"]["status"] == expected
            if operation == "run.pause":
                client.call("run.cancel", run_id=run_id)
