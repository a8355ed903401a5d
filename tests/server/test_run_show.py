"""`run.get` is `pi-workflows.run-view.v1`, and `pi-workflows run show` shows what a run did.

Real runs in real runner processes behind a real server socket; the CLI runs as a
child process. A failed compute node keeps its bounded traceback as durable content
(the runner sends it with `node.failed`, the server stores it in `run_view_content`
in the same commit), and both the view and `run show` show it.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.cli._run_show import plain_lines, show_rich
from pi_workflows.wire import protocol
from tests.conftest import Processes, write_workflow
from tests.server.runs import TERMINAL, start_run, wait_for

pytestmark = pytest.mark.timeout(120)

FAILING = """
from pi_workflows import compute, define_workflow


def deep_helper(n):
    raise RuntimeError(f"boom at {n}")


def explode(ctx):
    deep_helper(ctx.outputs["first"]["n"])


workflow = define_workflow(
    name="failing",
    start_at="first",
    nodes={
        "first": compute(lambda ctx: {"n": ctx.input["n"] + 1}),
        "explode": compute(explode),
    },
    edges=[{"from": "first", "to": "explode"}],
)
"""

LARGE = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="large",
    start_at="big",
    nodes={
        "big": compute(lambda ctx: {"text": "x" * 40000}),
        "small": compute(lambda ctx: {"size": len(ctx.outputs["big"]["text"])}),
    },
    edges=[{"from": "big", "to": "small"}],
)
"""


APPROVAL = """
from pi_workflows import checkpoint, compute, define_workflow

workflow = define_workflow(
    name="approval",
    start_at="ask",
    nodes={
        "ask": checkpoint(summary="Ship it?"),
        "done": compute(lambda ctx: {"shipped": ctx.outputs["ask"]["approved"]}),
    },
    edges=[{"from": "ask", "to": "done"}],
)
"""


def _view(client: WorkflowClient, run_id: str) -> dict[str, Any]:
    view = dict(client.call("run.get", run_id=run_id)["receipt"])
    protocol.validate("run-view.v1", view)
    return view


@pytest.fixture
def failed_run(running_server: WorkflowServer, short_tmp: Path) -> tuple[Path, str]:
    project = short_tmp / "project"
    write_workflow(project, "failing", FAILING)
    with WorkflowClient(running_server.state_dir, autostart=False, timeout=60) as client:
        run_id = start_run(client, project, "failing", {"n": 41})
        assert wait_for(client, run_id, TERMINAL)["display"]["status"] == "failed"
    return running_server.state_dir, run_id


def test_a_failed_compute_node_keeps_its_traceback_in_the_run_view(
    failed_run: tuple[Path, str],
) -> None:
    state_dir, run_id = failed_run
    with WorkflowClient(state_dir, autostart=False) as client:
        view = _view(client, run_id)
    assert view["schema"] == "pi-workflows.run-view.v1"
    display = view["display"]
    assert display["status"] == "failed" and display["controls"] == ["restart"]
    assert display["reasonCode"] == "nodeFailed"
    assert "explode: RuntimeError: boom at 42" in display["reasonText"], "the stored reason"
    assert "traceback" in display["action"]
    first, failed = view["trace"]["items"]
    assert (first["node"], first["outcome"], first["output"]) == (
        "first",
        "completed",
        {"value": {"n": 42}},
    )
    assert (failed["node"], failed["kind"], failed["visit"], failed["attempt"]) == (
        "explode",
        "compute",
        1,
        1,
    )
    assert failed["outcome"] == "failed"
    assert failed["error"] == "nodeFailed: RuntimeError: boom at 42"
    assert failed["startedAt"] <= failed["finishedAt"]
    traceback = failed["traceback"]
    text = traceback["text"]
    assert text.startswith("Traceback (most recent call last):")
    assert "in deep_helper" in text and "in explode" in text
    assert text.rstrip().endswith("RuntimeError: boom at 42")
    assert "pi_workflows/engine" not in text, "the engine's own frames are left out"
    data = text.encode()
    assert traceback["ref"]["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert traceback["ref"]["byteCount"] == len(data)
    assert view["state"]["input"] == {"value": {"n": 41}}
    assert view["executionMode"] == "headless"
    assert view["lineage"] == {"rootRunId": run_id}


def test_run_show_prints_status_reason_input_attempts_and_the_traceback(
    processes: Processes, failed_run: tuple[Path, str]
) -> None:
    state_dir, run_id = failed_run
    shown = processes.cli(state_dir, "run", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert out.startswith(f"run {run_id}  failed  failing\n")
    assert "reason:      nodeFailed: explode: RuntimeError: boom at 42" in out
    assert "what to do:  Read the failed attempt's error and traceback" in out
    assert "mode:        headless" in out
    assert 'input:       {"n": 41}' in out
    assert "attempts: 2" in out
    assert "  1. first  compute  visit 1 attempt 1" in out and 'output: {"n": 42}' in out
    assert "  2. explode  compute  visit 1 attempt 1  generation 1  failed" in out
    assert "     error: nodeFailed: RuntimeError: boom at 42" in out
    assert "       Traceback (most recent call last):" in out
    assert "in deep_helper" in out
    assert "\x1b[" not in out, "plain text when stdout is not a terminal"

    as_json = processes.cli(state_dir, "run", "show", run_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    protocol.validate("run-view.v1", document)
    assert document["trace"]["items"][1]["traceback"]["text"].startswith("Traceback")


def test_run_show_of_a_missing_run_says_not_found(
    processes: Processes, failed_run: tuple[Path, str]
) -> None:
    state_dir, _ = failed_run
    shown = processes.cli(state_dir, "run", "show", "run-missing")
    assert shown.returncode == 1
    assert "notFound" in shown.stderr and shown.stdout == ""


def test_a_restart_links_both_runs_and_large_values_are_bounded(
    processes: Processes, running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "large", LARGE)
    with WorkflowClient(running_server.state_dir, autostart=False, timeout=60) as client:
        run_id = start_run(client, project, "large")
        assert wait_for(client, run_id, TERMINAL)["display"]["status"] == "completed"
        restarted = client.call("run.restart", run_id=run_id)["receipt"]["runId"]
        wait_for(client, restarted, TERMINAL)
        old, new = _view(client, run_id), _view(client, restarted)
    assert old["lineage"]["restartedBy"] == [restarted]
    assert new["lineage"]["restartOf"] == run_id and new["restartOf"] == run_id
    big, small = old["trace"]["items"]
    shown_big = big["output"]
    ref = shown_big["ref"]
    assert (ref["mediaType"], ref["marker"]) == ("application/json", "server")
    assert ref["byteCount"] > 40000 and ref["digest"].startswith("sha256:")
    assert shown_big["preview"].startswith('{"text":"xxx') and len(shown_big["preview"]) <= 1024
    assert small["output"] == {"value": {"size": 40000}}
    assert old["result"] == {"output": {"value": {"size": 40000}}}
    assert old["display"]["status"] == "completed" and "reasonText" not in old["display"]
    assert len(json.dumps(old)) < 64 * 1024, "a large value never enters the view whole"
    with WorkflowClient(running_server.state_dir, autostart=False, timeout=60) as client:
        data = client.run_content(run_id, ref)
    assert hashlib.sha256(data).hexdigest() == ref["digest"].removeprefix("sha256:")
    assert json.loads(data) == {"text": "x" * 40000}

    shown = processes.cli(running_server.state_dir, "run", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert f"lineage:     restarted as {restarted}" in shown.stdout
    assert "bytes in all; --full prints everything)" in shown.stdout
    assert "x" * 40000 not in shown.stdout, "a bounded head without --full"
    assert 'output:      {"size": 40000}' in shown.stdout
    whole = processes.cli(running_server.state_dir, "run", "show", run_id, "--full")
    assert whole.returncode == 0, whole.stderr
    assert '{"text": "' + "x" * 40000 + '"}' in whole.stdout, "--full prints it whole"
    shown = processes.cli(running_server.state_dir, "run", "show", restarted)
    assert f"lineage:     restart of {run_id}" in shown.stdout


def test_the_rich_form_renders_a_view_with_colour(failed_run: tuple[Path, str]) -> None:
    """The terminal form (rich) renders every attempt; plain lines carry the same facts."""
    state_dir, run_id = failed_run
    with WorkflowClient(state_dir, autostart=False) as client:
        view = _view(client, run_id)
    console = Console(record=True, force_terminal=True, width=160, file=io.StringIO())
    show_rich(view, console)
    assert "\x1b[31mfailed" in console.export_text(styles=True, clear=False), "colour"
    rendered = console.export_text()
    assert "explode" in rendered and "boom at 42" in rendered and "deep_helper" in rendered
    assert any("Traceback" in line for line in plain_lines(view))


def test_a_checkpoint_wait_and_its_continuation_through_run_show(
    processes: Processes, running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "approval", APPROVAL)
    state_dir = running_server.state_dir
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        run_id = start_run(client, project, "approval")
        assert wait_for(client, run_id, {"waiting"} | TERMINAL)["display"]["status"] == "waiting"
        waiting = _view(client, run_id)
    assert waiting["display"]["waitingOn"] == "ask" and "currentNode" not in waiting["display"]
    assert waiting["display"]["controls"] == ["answer", "pause", "cancel"]
    shown = processes.cli(state_dir, "run", "show", run_id)
    assert "waiting on:  ask" in shown.stdout
    assert "reason:      Waiting for an answer at a checkpoint." in shown.stdout
    # Each allowed control is the command that performs it, never its internal name.
    assert "what to do:  Answer the checkpoint, or cancel the run." in shown.stdout
    assert f"             pi-workflows run answer {run_id} --input-json JSON\n" in shown.stdout
    assert f"             pi-workflows run cancel {run_id}\n" in shown.stdout
    assert f"allowed now: pi-workflows run pause {run_id}\n" in shown.stdout, shown.stdout

    answered = processes.cli(
        state_dir, "run", "answer", run_id, "--input-json", '{"approved": true}'
    )
    assert answered.returncode == 0, answered.stderr
    child = answered.stdout.strip()
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        assert wait_for(client, child, TERMINAL)["display"]["status"] == "completed"
        parent_view, child_view = _view(client, run_id), _view(client, child)
    assert parent_view["lineage"]["continuedBy"] == [child]
    assert child_view["lineage"]["continuationOf"] == run_id
    assert child_view["result"] == {"output": {"value": {"shipped": True}}}
    shown = processes.cli(state_dir, "run", "show", child)
    assert f"continuation of {run_id}" in shown.stdout
    assert 'output:      {"shipped": true}' in shown.stdout
