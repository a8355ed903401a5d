"""`state status`: the database's size and safe counts, read by the server.

client-protocol.md § Maintenance: `state.status` returns the database file size and
safe counts (runs, decisions, pending interactions, pending follow-ups, active leases,
unsettled effects). It names no run, path or payload.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.conftest import Processes, write_workflow
from tests.server.runs import TERMINAL, start_run, wait_for

pytestmark = pytest.mark.timeout(120)

WAITS = """
from pi_workflows import checkpoint, compute, define_workflow

workflow = define_workflow(
    name="waits",
    start_at="ask",
    nodes={"ask": checkpoint(summary="Ship it?"), "done": compute(lambda ctx: {"ok": True})},
    edges=[{"from": "ask", "to": "done"}],
)
"""
DONE = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="done", start_at="only", nodes={"only": compute(lambda ctx: {"secret": "s3cr3t"})}
)
"""


def test_state_status_counts_runs_and_pending_decisions_and_shows_no_ids_or_paths(
    processes: Processes, running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "waits", WAITS)
    write_workflow(project, "done", DONE)
    state_dir = running_server.state_dir
    with WorkflowClient(state_dir, autostart=False) as client:
        waiting = start_run(client, project, "waits")
        finished = start_run(client, project, "done")
        assert wait_for(client, waiting, {"waiting"} | TERMINAL)["display"]["status"] == "waiting"
        assert wait_for(client, finished, TERMINAL)["display"]["status"] == "completed"
        receipt = client.call("state.status")["receipt"]
    counts = receipt["counts"]
    assert counts["runs"] == 2
    assert counts["nonterminalRuns"] == 1
    assert counts["pendingDecisions"] == 1
    assert counts["pendingInteractions"] == 0
    assert counts["unsettledEffects"] == 0
    assert receipt["databaseBytes"] >= (state_dir / "state.sqlite").stat().st_size > 0
    assert 0 <= receipt["freeBytes"] <= receipt["databaseBytes"]

    shown = processes.cli(state_dir, "state", "status")
    assert shown.returncode == 0, shown.stderr
    assert "pending decisions          1" in shown.stdout
    assert shown.stdout.startswith("database: ")
    as_json = processes.cli(state_dir, "state", "status", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["counts"] == counts
    for text in (shown.stdout, as_json.stdout):
        assert waiting not in text and finished not in text
        assert str(short_tmp) not in text
        assert "s3cr3t" not in text
