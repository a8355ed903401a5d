"""What a workflow's code and its shell commands find in their environment (issue 11, 13a).

Through a real server and runner: the runner reads its launch envelope, channel
descriptor and agent folder from its environment and takes them out, so neither compute
code nor a shell command sees them; a shell command gets `PI_WORKFLOWS_EFFECT_KEY` and
`PI_WORKFLOWS_RUN_ID`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.conftest import write_workflow
from tests.server.runs import TERMINAL, start_run, wait_for

pytestmark = pytest.mark.timeout(120)

ENVIRONMENTS = """
import json
import os
from pathlib import Path

from pi_workflows import compute, define_workflow, shell


def look(ctx):
    Path(ctx.input["compute"]).write_text(json.dumps(dict(os.environ)))
    return {}


workflow = define_workflow(
    name="environments",
    start_at="look",
    nodes={
        "look": compute(look),
        "cmd": shell(lambda ctx: ["sh", "-c", f"env > {ctx.input['shell']}"]),
    },
    edges=[{"from": "look", "to": "cmd"}],
)
"""

PRIVATE = {
    "PI_WORKFLOWS_LAUNCH",
    "PI_WORKFLOWS_RUNNER_FD",
    "PI_WORKFLOWS_AGENT_DIR",
    "PI_WORKFLOWS_ZYGOTE_FD",
}


def test_neither_compute_code_nor_a_command_sees_the_launch_envelope(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "environments", ENVIRONMENTS)
    seen = {"compute": str(short_tmp / "compute.json"), "shell": str(short_tmp / "shell.env")}
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "environments", seen)
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
    assert view["display"]["status"] == "completed", view
    in_compute = json.loads(Path(seen["compute"]).read_text())
    assert not PRIVATE & set(in_compute), "popped once the runner read them"
    lines = Path(seen["shell"]).read_text().splitlines()
    in_shell = dict(line.split("=", 1) for line in lines if "=" in line)
    assert not PRIVATE & set(in_shell)
    assert in_shell["PI_WORKFLOWS_RUN_ID"] == run_id
    assert in_shell["PI_WORKFLOWS_EFFECT_KEY"].startswith("sha256:")
    assert run_id not in {
        value for name, value in in_shell.items() if name != "PI_WORKFLOWS_RUN_ID"
    }, "the run ID reaches the command only under its documented name"
