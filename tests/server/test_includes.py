"""Included workflows that really run: a root file includes others by name, in real runners."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.conftest import Processes, write_workflow
from tests.server.runs import TERMINAL, start_run, wait_fifo, wait_for, wait_until

pytestmark = pytest.mark.timeout(120)


REVIEW = """
from pi_workflows import compute, define_workflow

def look(ctx):
    return {"input": ctx.input, "sees": sorted(ctx.outputs), "path": ctx.node_path}

def judge(ctx):
    return {"ok": ctx.input["n"] > 5, "twice": ctx.input["n"] * 2, "sees": sorted(ctx.outputs)}

workflow = define_workflow(
    name="review",
    start_at="look",
    nodes={
        "look": compute(look),
        "judge": compute(judge),
        "pass_": compute(lambda ctx: {"verdict": "pass", "twice": ctx.outputs["judge"]["twice"]}),
        "fail_": compute(lambda ctx: {"verdict": "fail"}),
    },
    edges=[
        {"from": "look", "to": "judge"},
        {"from": "judge", "switch": {"on": "$.ok", "cases": {"true": "pass_"}, "default": "fail_"}},
    ],
    input_schema={"type": "object", "required": ["n"]},
    exits={"passed": {"from": "pass_"}, "failed": {"from": "fail_"}},
)
"""

SHIP = """
from pi_workflows import compute, define_workflow, include_workflow

workflow = define_workflow(
    name="ship",
    start_at="prep",
    nodes={
        "prep": compute(lambda ctx: {"n": ctx.input["n"] + 1}),
        "ship": compute(lambda ctx: {"shipped": ctx.outputs["review"],
                                     "sees": sorted(ctx.outputs)}),
        "fix": compute(lambda ctx: {"fix": ctx.outputs["review"]["exit"]}),
    },
    includes={"review": include_workflow("review", input=lambda ctx: ctx.outputs["prep"])},
    edges=[
        {"from": "prep", "to": "review"},
        {"from": "review.passed", "to": "ship"},
        {"from": "review.failed", "to": "fix"},
    ],
)
"""


def _outputs(state_dir: Path, run_id: str) -> dict[str, Any]:
    """Node path → output of its latest completed attempt, read from the database."""
    database = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        rows = database.execute(
            "SELECT a.node_path, b.content FROM node_attempts AS a "
            "JOIN blobs AS b ON b.digest = a.output_hash "
            "WHERE a.run_id = ? AND a.status = 'completed' ORDER BY a.started_at",
            (run_id,),
        ).fetchall()
    finally:
        database.close()
    return {path: json.loads(content) for path, content in rows}


@pytest.mark.parametrize(("n", "exit_name"), [(9, "passed"), (1, "failed")])
def test_a_root_includes_a_workflow_by_name_and_routes_on_its_exit(
    running_server: WorkflowServer, short_tmp: Path, n: int, exit_name: str
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "review", REVIEW)
    write_workflow(project, "ship", SHIP)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ship", {"n": n})
        view = wait_for(client, run_id, TERMINAL)
    assert view["display"]["status"] == "completed", view
    leaf, after = ("pass_", "ship") if exit_name == "passed" else ("fail_", "fix")
    assert [step["node"] for step in view["steps"]] == [
        "prep",
        "review",
        "review/look",
        "review/judge",
        f"review/{leaf}",
        f"review/__piw_exit_{exit_name}",
        after,
    ]
    outputs = _outputs(running_server.state_dir, run_id)
    assert outputs["review"]["input"] == {"n": n + 1}
    # The child sees its own input and, by local names, only its own nodes.
    assert outputs["review/look"] == {"input": {"n": n + 1}, "sees": [], "path": "review/look"}
    assert outputs["review/judge"]["sees"] == ["look"]
    exit_output = outputs[f"review/__piw_exit_{exit_name}"]
    assert exit_output == {"exit": exit_name, "output": outputs[f"review/{leaf}"]}
    if exit_name == "passed":
        assert exit_output["output"] == {"verdict": "pass", "twice": 2 * (n + 1)}
        assert outputs["ship"] == {"shipped": exit_output, "sees": ["prep", "review"]}
    else:
        assert outputs["fix"] == {"fix": "failed"}


OUTER = """
from pi_workflows import compute, define_workflow, include_workflow

workflow = define_workflow(
    name="outer",
    start_at="middle",
    nodes={"report": compute(lambda ctx: {"got": ctx.outputs["middle"]["output"]})},
    includes={"middle": include_workflow("middle", input=lambda ctx: {"n": ctx.input["n"] * 10})},
    edges=[{"from": "middle.done", "to": "report"}],
)
"""

MIDDLE = """
from pi_workflows import compute, define_workflow, include_workflow

workflow = define_workflow(
    name="middle",
    start_at="pre",
    nodes={
        "pre": compute(lambda ctx: {"n": ctx.input["n"] + 1}),
        "post": compute(lambda ctx: {"inner": ctx.outputs["inner"]["output"]["twice"],
                                     "sees": sorted(ctx.outputs), "input": ctx.input}),
    },
    includes={"inner": include_workflow("review", input=lambda ctx: ctx.outputs["pre"])},
    edges=[
        {"from": "pre", "to": "inner"},
        {"from": "inner.passed", "to": "post"},
        {"from": "inner.failed", "to": "post"},
    ],
    exits={"done": {"from": "post"}},
)
"""


def test_an_include_inside_an_include_runs_and_shows_in_run_status(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    for name, source in (("outer", OUTER), ("middle", MIDDLE), ("review", REVIEW)):
        write_workflow(project, name, source)
    started = processes.cli(
        state_dir, "run", "start", "outer", "--project", str(project), "--input-json", '{"n": 2}'
    )
    assert started.returncode == 0, started.stderr
    processes.adopt(int((state_dir / "host" / "server.lock").read_text().strip()))
    run_id = started.stdout.strip()
    waited = processes.cli(state_dir, "run", "wait", run_id, "--timeout", "60", "--json")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    status = processes.cli(state_dir, "run", "status", run_id, "--json")
    assert status.returncode == 0, status.stderr
    receipt = json.loads(status.stdout)
    assert receipt["display"]["status"] == "completed"
    assert [step["node"] for step in receipt["steps"]] == [
        "middle",
        "middle/pre",
        "middle/inner",
        "middle/inner/look",
        "middle/inner/judge",
        "middle/inner/pass_",
        "middle/inner/__piw_exit_passed",
        "middle/post",
        "middle/__piw_exit_done",
        "report",
    ]
    outputs = _outputs(state_dir, run_id)
    assert outputs["middle/inner/look"]["input"] == {"n": 21}
    assert outputs["middle/post"] == {"inner": 42, "sees": ["inner", "pre"], "input": {"n": 20}}
    assert outputs["report"] == {"got": outputs["middle/post"]}
    processes.cli(state_dir, "server", "stop")


# The first execution of `slow` announces itself on a FIFO and then blocks; the rerun
# (after its runner was killed) finds the counter at 2 and reports what it sees.
CRASHY_CHILD = """
import os, time
from pathlib import Path
from pi_workflows import compute, define_workflow

COUNTER = Path({counter!r})

def slow(ctx):
    count = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1
    COUNTER.write_text(str(count))
    if count == 1:
        with open({fifo!r}, "w") as pipe:
            pipe.write(str(os.getpid()))  # the runner process runs the node
        time.sleep(300)
    return {{"runs": count, "input": ctx.input, "sees": dict(ctx.outputs)}}

workflow = define_workflow(
    name="crashy",
    start_at="first",
    nodes={{"first": compute(lambda ctx: {{"first": ctx.input}}), "slow": compute(slow)}},
    edges=[{{"from": "first", "to": "slow"}}],
    exits={{"done": {{"from": "slow"}}}},
)
"""

HOLDER = """
from pi_workflows import compute, define_workflow, include_workflow

workflow = define_workflow(
    name="holder",
    start_at="before",
    nodes={{
        "before": compute(lambda ctx: {{"k": "v"}}),
        "after": compute(lambda ctx: ctx.outputs["{mount}"]),
    }},
    includes={{"{mount}": include_workflow("crashy", input=lambda ctx: ctx.outputs["before"])}},
    edges=[{{"from": "before", "to": "{mount}"}}, {{"from": "{mount}.done", "to": "after"}}],
)
"""


def test_a_runner_killed_inside_an_include_resumes_with_the_child_scope(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    counter, fifo = short_tmp / "counter", short_tmp / "started.fifo"
    os.mkfifo(fifo)
    write_workflow(project, "crashy", CRASHY_CHILD.format(counter=str(counter), fifo=str(fifo)))
    write_workflow(project, "holder", HOLDER.format(mount="sub"))
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "holder", {})
        runner = psutil.Process(int(wait_fifo(fifo)))
        assert os.getpgid(runner.pid) == runner.pid, "a runner leads its own group"
        os.killpg(runner.pid, signal.SIGKILL)
        psutil.wait_procs([runner], timeout=30)
        view = wait_for(client, run_id, TERMINAL)
    assert view["display"]["status"] == "completed", view
    assert view["generation"] == 2
    assert counter.read_text() == "2", "the interrupted child node ran exactly once more"
    steps = [(step["node"], step["status"]) for step in view["steps"]]
    assert steps == [
        ("before", "completed"),
        ("sub", "completed"),
        ("sub/first", "completed"),
        ("sub/slow", "interrupted"),
        ("sub/slow", "completed"),
        ("sub/__piw_exit_done", "completed"),
        ("after", "completed"),
    ]
    slow = _outputs(running_server.state_dir, run_id)["sub/slow"]
    assert slow == {"runs": 2, "input": {"k": "v"}, "sees": {"first": {"first": {"k": "v"}}}}


GATED = """
from pi_workflows import checkpoint, compute, define_workflow, include_workflow

workflow = define_workflow(
    name="gated",
    start_at="approve",
    nodes={"approve": checkpoint(summary="Go?"), "end": compute(lambda ctx: ctx.outputs["sub"])},
    includes={"sub": include_workflow("leaf")},
    edges=[{"from": "approve", "to": "sub"}, {"from": "sub.done", "to": "end"}],
)
"""

LEAF = """
from pi_workflows import compute, define_workflow
{extra}
workflow = define_workflow(
    name="leaf", start_at="a", nodes={{"a": compute(lambda ctx: {{"leaf": 1}})}},
    exits={{"done": {{"from": "a"}}}},
)
"""


def test_an_included_file_edited_while_the_run_waits_parks_its_continuation(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    marker = short_tmp / "edited-ran"
    write_workflow(project, "gated", GATED)
    leaf = write_workflow(project, "leaf", LEAF.format(extra=""))
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "gated", {})
        waiting = wait_for(client, run_id, {"waiting"} | TERMINAL)
        assert waiting["display"]["status"] == "waiting"
        edit = f"from pathlib import Path\nPath({str(marker)!r}).write_text('the edit ran')\n"
        leaf.write_text(LEAF.format(extra=edit))
        answer = client.call("run.answer", {"answer": {"ok": True}}, run_id=run_id)
        continuation = answer["receipt"]["continuationRunId"]
        view = wait_until(
            client,
            continuation,
            lambda item: item["display"].get("reason") == "workflowSourceChanged",
        )
    assert view["display"].get("reason") == "workflowSourceChanged"
    assert view["steps"] == [], "no node of the continuation ran"
    assert not marker.exists(), "changed included code must never execute"
