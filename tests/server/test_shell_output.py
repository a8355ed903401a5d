"""A shell command whose output escapes to more JSON than a frame holds still completes.

Issue 11 item 3, through a real server, runner and command: 200 KB of NUL bytes on
stdout (1.2 MB of JSON) used to fail the settlement and leave the effect ambiguous.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.conftest import write_workflow
from tests.server.runs import TERMINAL, start_run, wait_for

pytestmark = pytest.mark.timeout(120)

NOISY = """
from pi_workflows import compute, define_workflow, shell

workflow = define_workflow(
    name="noisy",
    start_at="noise",
    nodes={
        "noise": shell(lambda ctx: ["sh", "-c", "head -c 200000 /dev/zero; echo done >&2"]),
        "after": compute(lambda ctx: {"truncated": ctx.outputs["noise"]["truncated"]}),
    },
    edges=[{"from": "noise", "to": "after"}],
)
"""


def test_nul_output_over_a_frame_is_cut_and_the_run_completes(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "noisy", NOISY)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "noisy", {})
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        assert view["display"]["status"] == "completed", view
        assert client.call("server.status")["receipt"]["ambiguousEffects"] == 0
        assert client.call("state.verify")["receipt"]["consistent"]
    steps = [(step["node"], step["status"]) for step in view["steps"]]
    assert steps == [("noise", "completed"), ("after", "completed")]
