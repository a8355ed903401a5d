"""Large values by reference, end to end: a real server, real runners, the real CLI.

A node's output, a node's error (message and traceback) and a run's output larger than
one 1 MiB frame travel as `content.write` parts and an `uploadRef` (workflow-server.md
§ Runner protocol); the server records them whole, and `run show --json` prints them
whole. A value over the cap (`PI_WORKFLOWS_MAX_VALUE_BYTES`) fails its node naming the
cap. Every frame stays within the frame limit: the server's decoder refuses a larger
frame and ends the runner's channel (the run would go on under a new generation, or
fail), so a run that completes under its first generation sent none.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.server import ServerStartError
from pi_workflows.wire.runner import MAX_VALUE_ENV
from tests.conftest import Processes, write_workflow
from tests.server.runs import TERMINAL, start_run, wait_for

pytestmark = pytest.mark.timeout(120)

BIG = 3 * 1024 * 1024
"""A 3 MiB string: three frames' worth, far below the 64 MiB default cap."""

LARGE_OUTPUT = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="large",
    start_at="big",
    nodes={
        "big": compute(lambda ctx: {"text": "x" * %(size)d}),
        "size": compute(lambda ctx: {"size": len(ctx.outputs["big"]["text"])}),
        "echo": compute(lambda ctx: ctx.outputs["big"]),
    },
    edges=[{"from": "big", "to": "size"}, {"from": "size", "to": "echo"}],
)
"""

LONG_ERROR = """
from pi_workflows import compute, define_workflow

MESSAGE = "start " + "é" * (100 * 1024) + " end"  # 200 KiB of UTF-8


def explode(ctx):
    raise ValueError(MESSAGE)


workflow = define_workflow(name="long", start_at="explode", nodes={"explode": compute(explode)})
"""
MESSAGE = "start " + "é" * (100 * 1024) + " end"


@pytest.fixture
def capped_server(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkflowServer]:
    """A server (and its runners: they get its environment) with a 1 MiB value cap."""
    monkeypatch.setenv(MAX_VALUE_ENV, str(1024 * 1024))
    instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown")


def _show_json(processes: Processes, state_dir: Path, run_id: str) -> dict[str, Any]:
    shown = processes.cli(state_dir, "run", "show", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    document: dict[str, Any] = json.loads(shown.stdout)
    return document


def _attempt_errors(state_dir: Path, run_id: str) -> list[str]:
    db = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT error FROM node_attempts WHERE run_id = ? AND error IS NOT NULL", (run_id,)
        ).fetchall()
    finally:
        db.close()
    return [str(error) for (error,) in rows]


def test_a_3_mib_output_completes_and_run_show_json_has_it_whole(
    running_server: WorkflowServer, short_tmp: Path, processes: Processes
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "large", LARGE_OUTPUT % {"size": BIG})
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "large")
        view = wait_for(client, run_id, TERMINAL)
    assert view["display"]["status"] == "completed", view
    assert view["generation"] == 1, "no runner crashed on the way"
    document = _show_json(processes, running_server.state_dir, run_id)
    whole = {"text": "x" * BIG}
    assert document["result"]["output"]["value"] == whole, "the run output, whole"
    outputs = {item["node"]: item["output"]["value"] for item in document["trace"]["items"]}
    assert outputs == {"big": whole, "size": {"size": BIG}, "echo": whole}


def test_a_200_kib_error_fails_the_node_with_its_message_whole(
    running_server: WorkflowServer, short_tmp: Path, processes: Processes
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "long", LONG_ERROR)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "long")
        view = wait_for(client, run_id, TERMINAL)
    assert view["display"]["status"] == "failed", view
    assert _attempt_errors(running_server.state_dir, run_id) == [
        f"nodeFailed: ValueError: {MESSAGE}"
    ]
    document = _show_json(processes, running_server.state_dir, run_id)
    (item,) = document["trace"]["items"]
    assert item["error"] == f"nodeFailed: ValueError: {MESSAGE}"
    traceback = item["traceback"]["text"]
    assert "in explode" in traceback and traceback.rstrip().endswith(f"ValueError: {MESSAGE}")
    assert document["failureReason"] == f"nodeFailed: explode: ValueError: {MESSAGE}"
    assert document["display"]["reasonText"] == document["failureReason"]
    assert view["generation"] == 1, "no frame over the limit ended the runner's channel"


def test_a_value_over_the_cap_fails_its_node_naming_the_cap(
    capped_server: WorkflowServer, short_tmp: Path, processes: Processes
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "large", LARGE_OUTPUT % {"size": 2 * 1024 * 1024})
    with WorkflowClient(capped_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "large")
        view = wait_for(client, run_id, TERMINAL)
    assert view["display"]["status"] == "failed", view
    (error,) = _attempt_errors(capped_server.state_dir, run_id)
    assert error.startswith("outputTooLarge: OutputTooLarge: the node output is ")
    assert f"at most {1024 * 1024} bytes" in error and MAX_VALUE_ENV in error
    assert "big: outputTooLarge: " in view["failureReason"]


def test_a_bad_cap_is_one_clear_error_at_start(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for bad in ("lots", "-1", "1024", str(2**31)):
        monkeypatch.setenv(MAX_VALUE_ENV, bad)
        with pytest.raises(ServerStartError, match=MAX_VALUE_ENV) as caught:
            WorkflowServer(state_dir, idle_exit_s=None)
        assert "65536" in str(caught.value) and "1073741824" in str(caught.value)
