"""A run's execution mode (`run_bindings.execution_mode`) is shown to viewers.

Issue 12: a run started from the CLI or the library without an origin session is
`headless`, and viewers show the mode: `run.get` and the run list carry
`executionMode`, and `run status` prints it. The storage read says `interactive` for a
run bound to an origin session.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient
from pi_workflows.storage import ManualClock, get_run_summary, list_runs, open_database
from tests.conftest import Processes, write_workflow
from tests.storage.storage_helpers import INTERACTIVE, enqueue

pytestmark = pytest.mark.timeout(120)


def test_a_cli_started_run_is_headless_in_run_get_the_run_list_and_run_status(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "echo")
    started = processes.cli(state_dir, "run", "start", "echo", "--project", str(project))
    assert started.returncode == 0, started.stderr
    processes.adopt(int((state_dir / "host" / "server.lock").read_text().strip()))
    run_id = started.stdout.strip()
    waited = processes.cli(state_dir, "run", "wait", run_id, "--timeout", "60", "--json")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    shown = processes.cli(state_dir, "run", "status", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "execution mode: headless" in shown.stdout.splitlines(), shown.stdout
    as_json = processes.cli(state_dir, "run", "status", run_id, "--json")
    assert json.loads(as_json.stdout)["executionMode"] == "headless"
    with WorkflowClient(state_dir, autostart=False) as client:
        view = client.call("run.get", run_id=run_id)["receipt"]
        page = client.call("run.list")["receipt"]
    assert view["executionMode"] == "headless"
    assert [item["executionMode"] for item in page["items"]] == ["headless"]
    processes.cli(state_dir, "server", "stop")


def test_the_summary_read_names_an_interactive_binding(tmp_path: Path) -> None:
    db = open_database(tmp_path / "state.sqlite", clock=ManualClock())
    try:
        enqueue(db, "run-h")
        enqueue(db, "run-i", **INTERACTIVE)
        modes = {summary.run_id: summary.execution_mode for summary in list_runs(db)}
        summary = get_run_summary(db, "run-i")
    finally:
        db.close()
    assert modes == {"run-h": "headless", "run-i": "interactive"}
    assert summary is not None and summary.execution_mode == "interactive"
