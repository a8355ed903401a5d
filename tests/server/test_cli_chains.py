"""A workflow that waits twice reads as one workflow in the CLI, through a real server.

Answering a checkpoint completes the waiting run and starts its continuation, so a
workflow with two checkpoints is three runs. The first two complete with no output of
their own; `run wait`, `run status`, `run show` and `run list` of any of them say where
the chain is now and give the last run's result and exit code. The CLI runs as a
child process against an embedded server that executes runs in real runners.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.conftest import Processes, write_workflow
from tests.server.runs import TERMINAL, wait_for

pytestmark = pytest.mark.timeout(180)

TWICE = """
from pi_workflows import checkpoint, compute, define_workflow


def total(ctx):
    if ctx.outputs["second"]["n"] < 0:
        raise ValueError("a negative second answer")
    return {"sum": ctx.outputs["first"]["n"] + ctx.outputs["second"]["n"]}


workflow = define_workflow(
    name="twice",
    start_at="first",
    nodes={
        "first": checkpoint(summary="First number?"),
        "second": checkpoint(summary="Second number?"),
        "total": compute(total),
    },
    edges=[{"from": "first", "to": "second"}, {"from": "second", "to": "total"}],
)
"""


@pytest.fixture
def twice(running_server: WorkflowServer, short_tmp: Path) -> Path:
    project = short_tmp / "project"
    write_workflow(project, "twice", TWICE)
    return project


def _start(processes: Processes, state_dir: Path, project: Path) -> str:
    started = processes.cli(state_dir, "run", "start", "twice", "--project", str(project))
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    assert started.stdout == f"{run_id}\n" and run_id.startswith("run-")
    return run_id


def _answer(processes: Processes, state_dir: Path, run_id: str, n: int) -> str:
    """Answer the run's checkpoint through the CLI; stdout is the continuation's bare ID."""
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        assert wait_for(client, run_id, {"waiting"} | TERMINAL)["display"]["status"] == "waiting"
    answered = processes.cli(state_dir, "run", "answer", run_id, "--input-json", f'{{"n": {n}}}')
    assert answered.returncode == 0, answered.stderr
    continuation = answered.stdout.strip()
    assert answered.stdout == f"{continuation}\n" and continuation.startswith("run-")
    assert continuation in answered.stderr, "the words go to stderr"
    return continuation


def test_run_wait_of_the_first_run_follows_the_chain_to_its_end(
    processes: Processes, running_server: WorkflowServer, twice: Path
) -> None:
    state_dir = running_server.state_dir
    first = _start(processes, state_dir, twice)
    second = _answer(processes, state_dir, first, 2)

    # The first run completed, but the workflow waits again, in the second run.
    waited = processes.cli(state_dir, "run", "wait", first, "--timeout", "90")
    assert waited.returncode == 1, waited.stderr
    assert waited.stdout.startswith(f"{second}  waiting  (checkpoint)"), waited.stdout
    assert f"(chain: {first} -> {second})" in waited.stdout

    third = _answer(processes, state_dir, second, 3)
    waited = processes.cli(state_dir, "run", "wait", first, "--timeout", "90")
    assert waited.returncode == 0, waited.stderr
    lines = waited.stdout.splitlines()
    assert lines[0] == f"{third}  completed  (chain: {first} -> {second} -> {third})", lines
    assert lines[1] == 'output: {"sum": 5}', lines
    as_json = processes.cli(state_dir, "run", "wait", first, "--json", "--timeout", "90")
    assert as_json.returncode == 0, as_json.stderr
    leaf = json.loads(as_json.stdout)
    assert leaf["runId"] == third and leaf["result"]["output"] == {"value": {"sum": 5}}
    assert leaf["lineage"]["continuationOf"] == second
    assert leaf["lineage"]["rootRunId"] == first
    middle = processes.cli(state_dir, "run", "wait", second, "--timeout", "90")
    assert middle.returncode == 0 and middle.stdout.startswith(f"{third}  completed")
    # The last run itself is no chain: the line `run wait` always printed.
    own = processes.cli(state_dir, "run", "wait", third, "--timeout", "90")
    assert own.returncode == 0 and own.stdout.splitlines()[0] == f"{third}  completed"


def test_run_wait_of_the_first_run_exits_as_the_failed_leaf(
    processes: Processes, running_server: WorkflowServer, twice: Path
) -> None:
    state_dir = running_server.state_dir
    first = _start(processes, state_dir, twice)
    second = _answer(processes, state_dir, first, 2)
    third = _answer(processes, state_dir, second, -1)
    waited = processes.cli(state_dir, "run", "wait", first, "--json", "--timeout", "90")
    assert waited.returncode == 1, waited.stderr
    leaf = json.loads(waited.stdout)
    assert (leaf["runId"], leaf["display"]["status"]) == (third, "failed")
    plain = processes.cli(state_dir, "run", "wait", first, "--timeout", "90")
    assert plain.returncode == 1
    assert plain.stdout.startswith(f"{third}  failed"), plain.stdout
    assert "output:" not in plain.stdout


def test_status_show_and_list_of_a_continued_run_show_the_chain_and_its_result(
    processes: Processes, running_server: WorkflowServer, twice: Path
) -> None:
    state_dir = running_server.state_dir
    first = _start(processes, state_dir, twice)
    second = _answer(processes, state_dir, first, 2)
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        assert wait_for(client, second, {"waiting"} | TERMINAL)["display"]["status"] == "waiting"
        parent = client.call("run.get", run_id=first)["receipt"]
    assert parent["display"]["status"] == "completed"
    assert "result" not in parent, "no null output of its own: the chain's result is the leaf's"

    status = processes.cli(state_dir, "run", "status", first)
    assert status.returncode == 0, status.stderr
    assert f"chain: {first} -> {second}; now at {second}: waiting, waiting on second" in (
        status.stdout
    )
    assert "chain reason: Waiting for an answer at a checkpoint." in status.stdout
    lines = status.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("chain action:"))
    advised = [line.strip() for line in lines[at + 1 :] if line.startswith("  pi-workflows")]
    assert any(f"run answer {second} " in line for line in advised), (
        "the advice is a command about the run that waits"
    )

    third = _answer(processes, state_dir, second, 3)
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        assert wait_for(client, third, TERMINAL)["display"]["status"] == "completed"
    status = processes.cli(state_dir, "run", "status", first)
    assert f"chain: {first} -> {second} -> {third}; now at {third}: completed" in status.stdout
    assert 'chain output: {"sum": 5}' in status.stdout
    as_json = processes.cli(state_dir, "run", "status", first, "--json")
    assert json.loads(as_json.stdout)["lineage"]["continuedBy"] == [second], "its own view"

    shown = processes.cli(state_dir, "run", "show", first)
    assert shown.returncode == 0, shown.stderr
    assert "\noutput:" not in shown.stdout, "no run output of its own (an attempt's is shown)"
    assert f"continued as {second}" in shown.stdout
    assert f"chain:       {first} -> {second} -> {third}; now at {third}: completed" in (
        shown.stdout
    )
    assert 'chain output: {"sum": 5}' in shown.stdout
    leaf_shown = processes.cli(state_dir, "run", "show", third)
    assert 'output:      {"sum": 5}' in leaf_shown.stdout and "chain:" not in leaf_shown.stdout

    listed = processes.cli(state_dir, "run", "list")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split("\t")[0]: line.split("\t") for line in listed.stdout.splitlines()}
    assert rows[first][1] == "completed" and rows[first][4] == f"continued as {second}"
    assert rows[second][4] == f"continued as {third}"
    assert rows[third][1] == "completed" and rows[third][4] == ""
    items = {
        item["runId"]: item
        for item in json.loads(processes.cli(state_dir, "run", "list", "--json").stdout)["items"]
    }
    assert items[second]["continuationOf"] == first and items[second]["continuedBy"] == third
    assert "continuedBy" not in items[third] and items[third]["continuationOf"] == second
