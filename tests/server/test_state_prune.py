"""`state.prune` and `pi-workflows state prune` on a real server with real runners.

A failed compute run leaves its traceback in `run_view_content`; after an applied prune
(backup first, verified) the run, its rows and that content are gone, `run.get` answers
`notFound` and the run list no longer has it. A dry run deletes nothing; a protected run
(waiting at a checkpoint) is kept; a retry of the same invocation key adopts the stored receipt;
apply without a new absolute backup path is refused before anything is deleted; an
applied prune shows its stages (JSON lines with `--json`, one line a stage otherwise).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.storage import TRACEBACK_MEDIA_TYPE
from pi_workflows.wire.client import RequestFailedError
from tests.conftest import Processes, write_workflow
from tests.server.runs import TERMINAL, start_run, wait_for
from tests.server.test_run_show import APPROVAL, FAILING

pytestmark = pytest.mark.timeout(120)


_TRACEBACKS = "SELECT count(*) FROM run_view_content WHERE run_id = ? AND media_type = ?"


def _rows(state_dir: Path, sql: str, *params: object) -> list[tuple[Any, ...]]:
    """Read the live database through a WAL reader (the test's view, never the CLI's)."""
    conn = sqlite3.connect((state_dir / "state.sqlite").as_uri() + "?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _prune(processes: Processes, state_dir: Path, *args: str) -> dict[str, Any]:
    done = processes.cli(state_dir, "state", "prune", "--json", *args)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.splitlines()[-1]))  # an applied prune: the last line


@pytest.fixture
def runs(running_server: WorkflowServer, short_tmp: Path) -> dict[str, str]:
    project = short_tmp / "project"
    write_workflow(project, "failing", FAILING)
    write_workflow(project, "hello")
    write_workflow(project, "approval", APPROVAL)
    with WorkflowClient(running_server.state_dir, autostart=False, timeout=60) as client:
        failed = start_run(client, project, "failing", {"n": 41})
        assert wait_for(client, failed, TERMINAL)["display"]["status"] == "failed"
        done = start_run(client, project, "hello")
        assert wait_for(client, done, TERMINAL)["display"]["status"] == "completed"
        protected = start_run(client, project, "approval")  # waits at its checkpoint
        assert wait_for(client, protected, {"waiting"})["display"]["status"] == "waiting"
    return {"failed": failed, "done": done, "protected": protected}


def test_a_dry_run_lists_what_would_go_and_deletes_nothing(
    running_server: WorkflowServer, runs: dict[str, str], processes: Processes
) -> None:
    state = running_server.state_dir
    before = _rows(state, "SELECT count(*) FROM runs")
    listed = _prune(processes, state, "--older-than", "0")
    assert listed["applied"] is False
    assert sorted(listed["runIds"]) == sorted([runs["failed"], runs["done"]])
    assert (listed["treeCount"], listed["runCount"]) == (2, 2)
    assert _rows(state, "SELECT count(*) FROM runs") == before
    plain = processes.cli(state, "state", "prune", "--older-than", "0")
    assert plain.returncode == 0 and "would prune 2 run trees" in plain.stdout
    assert "nothing deleted" in plain.stdout
    kept = _prune(processes, state)  # the default: 30 days; nothing is that old
    assert kept["runIds"] == [] and kept["olderThanDays"] == 30


def test_apply_backs_up_then_prunes_the_failed_run_and_its_traceback(
    running_server: WorkflowServer, runs: dict[str, str], processes: Processes, short_tmp: Path
) -> None:
    state, failed = running_server.state_dir, runs["failed"]
    assert _rows(state, _TRACEBACKS, failed, TRACEBACK_MEDIA_TYPE) == [(1,)], (
        "the failed node's traceback is stored content"
    )
    backup = short_tmp / "backup.sqlite"
    receipt = _prune(processes, state, "--older-than", "0", "--apply", "--backup", str(backup))
    assert receipt["applied"] is True and receipt["backup"]["verified"] is True
    assert sorted(receipt["runIds"]) == sorted([failed, runs["done"]])
    assert receipt["skipped"] == 0
    for table in ("runs", "events", "node_attempts", "run_view_content", "run_queue"):
        assert _rows(state, f"SELECT count(*) FROM {table} WHERE run_id = ?", failed) == [(0,)]
    assert _rows(state, "SELECT run_id FROM runs") == [(runs["protected"],)], "waiting: kept"
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        with pytest.raises(RequestFailedError) as missing:
            client.call("run.get", run_id=failed)
        assert missing.value.outcome == "notFound"
        listed = [item["runId"] for item in client.list_runs().items]
        assert listed == [runs["protected"]]
    copy = sqlite3.connect(backup.as_uri() + "?mode=ro", uri=True)
    try:  # the backup holds what was pruned, traceback included
        assert copy.execute(_TRACEBACKS, (failed, TRACEBACK_MEDIA_TYPE)).fetchone() == (1,)
    finally:
        copy.close()
    verified = processes.cli(state, "state", "verify")
    assert verified.returncode == 0, verified.stdout


def test_a_retried_invocation_adopts_its_receipt_and_a_new_one_prunes_again(
    running_server: WorkflowServer, runs: dict[str, str], short_tmp: Path
) -> None:
    state = running_server.state_dir
    payload = {"olderThanDays": 0, "apply": True, "backupPath": str(short_tmp / "b1.sqlite")}
    with WorkflowClient(state, autostart=False, timeout=60) as client:
        first = client.call("state.prune", payload, idempotency_key="prune-key-1")
        again = client.call("state.prune", payload, idempotency_key="prune-key-1")
        assert first["outcome"] == "accepted" and again["outcome"] == "adopted"
        assert again["receipt"] == first["receipt"]
        assert first["receipt"]["treeCount"] == 2
        fresh = dict(payload, backupPath=str(short_tmp / "b2.sqlite"))
        second = client.call("state.prune", fresh, idempotency_key="prune-key-2")
        assert second["receipt"]["treeCount"] == 0, "nothing left to prune"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--apply"], "--apply needs --backup"),
        (["--apply", "--backup", "relative.sqlite"], "absolute"),
        (["--backup", "/tmp/x.sqlite"], "only used with --apply"),
    ],
)
def test_apply_without_a_new_absolute_backup_is_refused(
    running_server: WorkflowServer,
    runs: dict[str, str],
    processes: Processes,
    args: list[str],
    message: str,
) -> None:
    state = running_server.state_dir
    done = processes.cli(state, "state", "prune", "--older-than", "0", *args)
    assert done.returncode == 2 and message in done.stderr
    assert len(_rows(state, "SELECT run_id FROM runs")) == 3


def test_an_existing_backup_path_refuses_the_prune_and_deletes_nothing(
    running_server: WorkflowServer, runs: dict[str, str], short_tmp: Path
) -> None:
    state = running_server.state_dir
    taken = short_tmp / "taken.sqlite"
    taken.write_text("not mine to replace")
    payload = {"olderThanDays": 0, "apply": True, "backupPath": str(taken)}
    with WorkflowClient(state, autostart=False, timeout=60) as client:
        answer = client.request("state.prune", payload)
    assert answer["outcome"] == "rejected" and answer["error"]["code"] == "backupExists"
    assert str(taken) not in answer["error"]["message"], "no user path in errors"
    assert taken.read_text() == "not mine to replace"
    assert len(_rows(state, "SELECT run_id FROM runs")) == 3


_STAGES = ["copy", "verify", "delete", "collect"]


def test_an_applied_prune_shows_its_progress_as_json_lines(
    running_server: WorkflowServer, runs: dict[str, str], processes: Processes, short_tmp: Path
) -> None:
    state = running_server.state_dir
    backup = short_tmp / "progress.sqlite"
    done = processes.cli(
        state, "state", "prune", "--older-than", "0", "--apply", "--backup", str(backup), "--json"
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines[0]["stage"] == "start" and lines[0]["idempotencyKey"].startswith("cli-prune-")
    receipt = lines[-1]
    assert receipt["stage"] == "done" and receipt["treeCount"] == 2 and receipt["applied"]
    steps = lines[1:-1]
    assert steps, "progress between the start and the receipt"
    order = [_STAGES.index(step["stage"]) for step in steps]
    assert order == sorted(order), "stages come in order: backup, deletions, blobs"
    deletes = [step for step in steps if step["stage"] == "delete"]
    assert deletes and all(step["total"] == 2 for step in deletes), "trees done of how many"
    assert [step["done"] for step in deletes] == sorted(step["done"] for step in deletes)
    assert steps[-1]["stage"] == "collect"


def test_without_a_terminal_an_applied_prune_prints_one_line_a_stage(
    running_server: WorkflowServer, runs: dict[str, str], processes: Processes, short_tmp: Path
) -> None:
    state = running_server.state_dir
    backup = short_tmp / "plain.sqlite"
    done = processes.cli(
        state, "state", "prune", "--older-than", "0", "--apply", "--backup", str(backup)
    )
    assert done.returncode == 0, done.stderr
    words = {
        "backing up:": "copy",
        "verifying the backup": "verify",
        "deleting 2 run trees": "delete",
        "collecting unreferenced blobs": "collect",
    }
    stages = [
        next(stage for start, stage in words.items() if line.startswith(start))
        for line in done.stderr.splitlines()
    ]
    assert stages == sorted(set(stages), key=_STAGES.index), "one line a stage, in order"
    assert stages[-1] == "collect"
    assert done.stdout.startswith("pruned 2 run trees"), done.stdout
