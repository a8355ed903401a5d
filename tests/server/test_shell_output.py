"""A shell command whose output escapes to more JSON than a frame holds still completes.

Issue 11, item 3, through a real server, runner and command: 200 KB of NUL bytes on
stdout (1.2 MB of JSON) used to fail the settlement and leave the effect ambiguous. Now
the whole result goes to the blob store by reference (`content.write`), uncut, and the
node completes with it, whether it is the last node (the run's output is the reference)
or another node reads it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.engine import DEFAULT_SHELL_MAX_OUTPUT_BYTES
from pi_workflows.wire.framing import MAX_FRAME_BYTES
from tests.conftest import write_workflow
from tests.server.runs import TERMINAL, start_run, wait_for

pytestmark = pytest.mark.timeout(120)

NOISY = """
from pi_workflows import compute, define_workflow, shell

noise = shell(lambda ctx: ["sh", "-c", "head -c 200000 /dev/zero; echo done >&2"])

def after(ctx):
    result = ctx.outputs["noise"]
    return {{"nuls": result["stdout"].count("\\x00"), "truncated": result["truncated"]}}

workflow = define_workflow(
    name="noisy",
    start_at="noise",
    nodes={{"noise": noise, "after": compute(after)}} if {followed} else {{"noise": noise}},
    edges=[{{"from": "noise", "to": "after"}}] if {followed} else [],
)
"""


def _stored_output(state_dir: Path, node: str) -> bytes:
    """The node's output as the server stored it (a blob of canonical JSON)."""
    database = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        row = database.execute(
            "SELECT b.content FROM node_attempts a JOIN blobs b ON b.digest = a.output_hash"
            " WHERE a.node_path = ? AND a.status = 'completed'",
            (node,),
        ).fetchone()
    finally:
        database.close()
    return bytes(row[0])


@pytest.mark.parametrize("followed", [True, False], ids=["read-by-next-node", "last-node"])
def test_nul_output_over_a_frame_completes_the_node_by_reference(
    running_server: WorkflowServer, short_tmp: Path, followed: bool
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "noisy", NOISY.format(followed=followed))
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "noisy", {})
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        assert view["display"]["status"] == "completed", view
        assert client.call("server.status")["receipt"]["ambiguousEffects"] == 0
        assert client.call("state.verify")["receipt"]["consistent"]
    steps = [(step["node"], step["status"]) for step in view["steps"]]
    expected = [("noise", "completed")] + ([("after", "completed")] if followed else [])
    assert steps == expected
    noise = _stored_output(running_server.state_dir, "noise")
    assert len(noise) > MAX_FRAME_BYTES, "more than one frame: it came by reference"
    result = json.loads(noise)
    assert result["stdout"] == "\x00" * 200_000 and result["stderr"] == "done\n"
    assert result["truncated"] is False, "uncut"
    if followed:
        after = json.loads(_stored_output(running_server.state_dir, "after"))
        assert after == {"nuls": 200_000, "truncated": False}


OVER_THE_CAP = """
from pi_workflows import define_workflow, shell

workflow = define_workflow(
    name="wide",
    start_at="wide",
    nodes={"wide": shell(lambda ctx: ["sh", "-c", ctx.input["script"]])},
)
"""


@pytest.mark.parametrize(
    ("script", "sizes"),
    [
        ("head -c 990000 /dev/zero | tr '\\0' x", (990_000, 0)),
        (
            "head -c 600000 /dev/zero | tr '\\0' x; head -c 600000 /dev/zero | tr '\\0' y >&2",
            (600_000, 600_000),
        ),
        ("yes | head -c 600000; yes | head -c 600000 >&2", (600_000, 600_000)),  # escapes
    ],
    ids=["990k-stdout", "600k-each", "600k-each-of-lines"],
)
def test_output_over_the_default_caps_is_cut_to_them_and_completes(
    running_server: WorkflowServer, short_tmp: Path, script: str, sizes: tuple[int, int]
) -> None:
    """Issue 11 item 3: these failed the node with `outputTooLarge`; now each stream
    keeps the default cap, and the node completes (inline, or by reference for the
    lines, whose newlines escape to two bytes each)."""
    project = short_tmp / "project"
    write_workflow(project, "wide", OVER_THE_CAP)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "wide", {"script": script})
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
    assert view["display"]["status"] == "completed", view
    result = json.loads(_stored_output(running_server.state_dir, "wide"))
    for name, size in zip(("stdout", "stderr"), sizes, strict=True):
        kept = min(size, DEFAULT_SHELL_MAX_OUTPUT_BYTES)
        assert len(result[name]) == kept
        assert result[f"{name}TruncatedBytes"] == size - kept
    assert result["truncated"] is True and result["exitCode"] == 0
