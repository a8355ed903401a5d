"""Automatic state retention on a real server with a manual clock.

workflow-server.md § State retention: after startup recovery the server sweeps the
terminal root-run trees older than the retention period, with the selector, exact-tree
deletion and blob collection of `state prune` (so it deletes exactly what a dry run of
the same cutoff lists), makes no backup, keeps protected trees and blobs a retained
run still names, removes a deleted run's pi folders and runner logs, and a repeated
sweep changes nothing. `state status` reports it, with no IDs or paths. A retained run
(29 days old) keeps its `run show`, its restart, its content references and its
origin session's terminal message through a sweep that deletes an older tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.domain import SweepTree
from pi_workflows.storage import (
    DAY_MS,
    Database,
    ManualClock,
    RunnerOutcome,
    complete_run,
    open_database,
    pause_run,
    put_blob,
    record_runner_exit,
)
from pi_workflows.testing import perform_with_calls
from tests.conftest import Processes, write_workflow
from tests.server.origin import SESSION, session_snapshot
from tests.server.retention_seed import seed_expired_trees
from tests.server.runs import TERMINAL, start_run, wait_fifo, wait_for
from tests.server.test_run_show import _view
from tests.server.test_run_view_rules import _ambiguous_effect
from tests.server.watchers import Watcher
from tests.storage.storage_helpers import enqueue, running
from tests.storage.test_prune import _finished_run

pytestmark = pytest.mark.timeout(60)

T0 = 1_700_000_000_000
SHARED_OUTPUT: dict[str, object] = {"shared": True}


PROTECTED = ("old-c", "prot-message", "prot-follow-up", "prot-chain")
"""The expired trees each kept for one kind of protected state (see `_seed`)."""
UNFINISHED = "prot-paused"
"""An old tree kept for its unfinished (queued, paused) restart: not expired at all."""


def _protect(db: Database) -> None:
    """Protected state on more expired trees: a paused restart still queued (an
    unfinished run and a live queue row), a terminal message not yet delivered to its
    origin session and a queued follow-up (`_seed` adds a follow-up of `prot-chain`'s
    chain from the retained run)."""
    _finished_run(db, "prot-paused", {"p": 1}, failing=False)
    enqueue(db, "prot-paused-again", restart_of="prot-paused")
    with db.write() as tx:
        pause_run(tx, "prot-paused-again")  # queued, paused: no runner work pending
    for run_id in ("prot-message", "prot-follow-up", "prot-chain"):
        _finished_run(db, run_id, {"run": run_id}, failing=False)
    with db.write() as tx:
        text = put_blob(tx, b"a message for the origin session")
        params = {"now": tx.now, "d": text}
        tx.execute(
            "INSERT INTO workflow_messages (message_id, run_id, target_session_id, kind,"
            " source_id, content_digest, session_order, state, created_at, updated_at) VALUES"
            " ('m-1', 'prot-message', 's-1', 'terminal', 'prot-message', :d, 1, 'pending',"
            " :now, :now)",
            params,
        )
        tx.execute(
            "INSERT INTO follow_ups (follow_up_id, run_id, chain_run_id, target_session_id,"
            " content_hash, state, created_at, updated_at) VALUES"
            " ('f-1', 'prot-follow-up', 'prot-follow-up', 's-2', :d, 'pending', :now, :now)",
            params,
        )


def _seed(state_dir: Path) -> None:
    """Trees 31 days old at T0 + 31 days: `old-a` (shares its output blob with the
    retained run), `old-b` (a failed attempt's traceback), `old-c` (an ambiguous effect:
    protected) and the protected trees of `_protect`; `kept-r` finished two days later
    (29 days old), with a follow-up of `prot-chain`'s chain (which that protects)."""
    clock = ManualClock(T0)
    db = open_database(state_dir / "state.sqlite", clock=clock)
    try:
        _finished_run(db, "old-a", SHARED_OUTPUT, failing=False)
        _finished_run(db, "old-b", {"b": 1}, failing=True)
        claim = running(db, "old-c")
        _ambiguous_effect(db, claim)
        with db.write() as tx:
            complete_run(tx, "old-c", claim=claim, payload={"output": {}})
            record_runner_exit(tx, "old-c-e1", outcome=RunnerOutcome.EXITED, exit_code=0)
        _protect(db)
        clock.advance(2 * DAY_MS)
        _finished_run(db, "kept-r", SHARED_OUTPUT, failing=False)
        with db.write() as tx:
            tx.execute(
                "INSERT INTO follow_ups (follow_up_id, run_id, chain_run_id, target_session_id,"
                " content_hash, state, created_at, updated_at) VALUES ('f-2', 'kept-r',"
                " 'prot-chain', 's-3', :d, 'cancelled', :now, :now)",
                {"now": tx.now, "d": put_blob(tx, b"a follow-up")},
            )
    finally:
        db.close()
    for run_id in ("old-a", "kept-r"):
        (state_dir / "pi" / run_id / f"{run_id}-a1").mkdir(parents=True)
        runners = state_dir / "logs" / "runners"
        runners.mkdir(parents=True, exist_ok=True)
        (runners / f"{run_id}-e1.log").write_text("runner log")
        validators = state_dir / "logs" / "validators" / run_id
        validators.mkdir(parents=True)
        (validators / "validator-0123.log").write_text("validator log")
    # The pass log of a resource deleted by a server that died before it removed the file.
    resource_logs = state_dir / "logs" / "resource-runners"
    resource_logs.mkdir(parents=True)
    (resource_logs / "res-deleted.log").write_text("pass log")


def _rows(state_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect((state_dir / "state.sqlite").as_uri() + "?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _server(state_dir: Path, clock: ManualClock, *, execute_runs: bool = False) -> WorkflowServer:
    return WorkflowServer(
        state_dir,
        idle_exit_s=None,
        tick_s=0.05,
        execute_runs=execute_runs,
        units=perform_with_calls,
        clock=clock,
    )


def _status(state_dir: Path) -> dict[str, Any]:
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        return dict(client.call("state.status")["receipt"])


def _wait_sweeps(state_dir: Path, at_least: int, timeout: float = 30.0) -> dict[str, Any]:
    """Wait until the retention report shows a completed sweep (finishedAt moved)."""
    deadline = time.monotonic() + timeout
    seen: set[int] = set()
    while True:
        retention = _status(state_dir)["retention"]
        last = retention.get("lastSweep")
        if last is not None:
            seen.add(last["finishedAt"])
            if len(seen) >= at_least and retention["state"] == "idle":
                return dict(retention)
        assert time.monotonic() < deadline, f"no sweep: {retention}"
        time.sleep(0.05)


@pytest.fixture
def seeded(short_tmp: Path) -> Iterator[Path]:
    state_dir = short_tmp / "state"
    state_dir.mkdir()
    _seed(state_dir)
    yield state_dir


def test_startup_sweeps_exactly_what_state_prune_lists_and_keeps_the_rest(
    seeded: Path, monkeypatch: pytest.MonkeyPatch, processes: Processes
) -> None:
    state = seeded
    now = T0 + 31 * DAY_MS
    monkeypatch.setenv("PI_WORKFLOWS_RETENTION_DAYS", "0")
    with _server(state, ManualClock(now)):
        with WorkflowClient(state, autostart=False, timeout=30) as client:
            listed = client.call("state.prune", {"olderThanDays": 30})["receipt"]
        assert _status(state)["retention"]["enabled"] is False
    assert sorted(listed["runIds"]) == ["old-a", "old-b"]
    assert listed["keptProtected"] == len(PROTECTED)
    shared = _rows(state, "SELECT output_hash FROM node_attempts WHERE run_id = 'kept-r'")
    files_before = sorted(p.name for p in state.iterdir())

    monkeypatch.setenv("PI_WORKFLOWS_RETENTION_DAYS", "30")
    clock = ManualClock(now)
    with _server(state, clock) as server:
        retention = _wait_sweeps(state, 1)
        last = retention["lastSweep"]
        assert (last["trigger"], last["treesDeleted"], last["runsDeleted"]) == ("recovery", 2, 2)
        assert last["treesKeptProtected"] == len(PROTECTED)
        remaining = {r[0] for r in _rows(state, "SELECT root_run_id FROM runs")}
        assert remaining == {"kept-r", UNFINISHED, *PROTECTED}, "exactly what the dry run listed"
        assert _rows(state, f"SELECT count(*) FROM blobs WHERE digest = '{shared[0][0]}'") == [
            (1,)
        ], "a blob a retained run names survives"
        assert not (state / "pi" / "old-a").exists()
        assert not (state / "logs" / "runners" / "old-a-e1.log").exists()
        assert not (state / "logs" / "validators" / "old-a").exists()
        assert (state / "logs" / "validators" / "kept-r" / "validator-0123.log").exists()
        assert (state / "pi" / "kept-r" / "kept-r-a1").is_dir()
        assert (state / "logs" / "runners" / "kept-r-e1.log").exists()
        assert not (state / "logs" / "resource-runners" / "res-deleted.log").exists()
        assert sorted(p.name for p in state.iterdir()) == files_before, "no backup file"
        with WorkflowClient(state, autostart=False, timeout=30) as client:
            assert client.call("state.verify")["receipt"]["findingCount"] == 0
            kept = client.call("run.get", run_id="kept-r")
            assert kept["receipt"]["display"]["status"] == "completed", (
                "a retained run keeps its view"
            )
        counts = _rows(state, "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM blobs)")
        pages = _status(state)["pageCount"]
        clock.advance(DAY_MS)  # the daily check: a second sweep with nothing to do
        again = _wait_sweeps(state, 2)["lastSweep"]
        assert (again["trigger"], again["treesDeleted"], again["blobsDeleted"]) == ("daily", 0, 0)
        assert _rows(state, "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM blobs)") == (
            counts
        )
        status = _status(state)
        assert status["pageCount"] == pages, "the same file"
        shown = processes.cli(state, "state", "status").stdout
        assert "retention: terminal run trees are kept 30 days" in shown
        assert "last sweep: 2023-" in shown and "(daily): 0 trees (0 runs) deleted" in shown
        assert status["counts"]["retainedTrees"] == 2, (
            "kept-r (29 days old), and an unfinished tree"
        )
        assert status["runsByState"] == {"completed": 2 + len(PROTECTED), "queued": 1}
        assert status["walBytes"] >= 0 and status["freePages"] <= status["pageCount"]
        assert status["retention"]["retentionDays"] == 30
        assert status["retention"]["nextDueAt"] == now + 2 * DAY_MS
        assert server.running
    text = repr(status) + shown
    for secret in ("old-a", "kept-r", str(state)):
        assert secret not in text


GATED = """
from pi_workflows import compute, define_workflow


def gate(ctx):
    with open(ctx.input["ready"], "w") as ready:
        ready.write("at the gate")
    with open(ctx.input["release"]) as release:  # blocks until the test writes
        release.read()
    return {"ok": True}


workflow = define_workflow(
    name="gated", start_at="gate", nodes={"gate": compute(gate, timeout=120)}
)
"""


def test_a_sweep_yields_to_a_running_run_and_its_runner_exit_finishes_it(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The startup sweep finds a run admitted (requeued by the stop of a first server):
    it deletes nothing while that run's runner works, and the runner's exit on the idle
    server continues it (the manual clock never reaches the five-minute retry)."""
    state, project = short_tmp / "state", short_tmp / "project"
    now = T0 + 31 * DAY_MS
    seed_expired_trees(state, 3, now_ms=now)
    write_workflow(project, "gated", GATED)
    ready, release = short_tmp / "ready.fifo", short_tmp / "release.fifo"
    os.mkfifo(ready)
    os.mkfifo(release)
    monkeypatch.setenv("PI_WORKFLOWS_RETENTION_DAYS", "0")
    clock = ManualClock(now)
    with _server(state, clock, execute_runs=True) as first:
        with WorkflowClient(state, autostart=False, timeout=30) as client:
            gated = start_run(
                client, project, "gated", {"ready": str(ready), "release": str(release)}
            )
        wait_fifo(ready)
        first.stop("handing the run back", drain_s=0.2)  # requeued at its last boundary
    monkeypatch.setenv("PI_WORKFLOWS_RETENTION_DAYS", "30")
    with _server(state, clock, execute_runs=True):
        wait_fifo(ready)  # the run is running again
        retention = _status(state)["retention"]
        assert retention["lastSweep"] is None and retention["state"] in ("due", "waitingForIdle")
        assert len(_rows(state, "SELECT run_id FROM runs WHERE run_id LIKE 'exp-%'")) == 3
        release.write_text("go")
        last = _wait_sweeps(state, 1)["lastSweep"]
        assert (last["trigger"], last["treesDeleted"]) == ("recovery", 3)
        with WorkflowClient(state, autostart=False, timeout=30) as client:
            assert wait_for(client, gated, TERMINAL)["display"]["status"] == "completed"
        remaining = sorted(r[0] for r in _rows(state, "SELECT run_id FROM runs"))
        assert remaining == sorted([gated, "recent"])


class _FailFirstSweep:
    """The server's units, with one fault: the first tree deletion raises an SQLite
    error (as a failing disk would), through the `units=` hook tests use."""

    def __init__(self) -> None:
        self.failed = threading.Event()

    def __call__(self, db: Database, unit: object) -> Any:
        if isinstance(unit, SweepTree) and not self.failed.is_set():
            self.failed.set()
            raise sqlite3.OperationalError("disk I/O error in /secret/place")
        return perform_with_calls(db, unit)


def test_a_failed_sweep_is_one_bounded_diagnostic_and_retries_after_five_minutes(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = short_tmp / "state"
    now = T0 + 31 * DAY_MS
    seed_expired_trees(state, 3, now_ms=now)
    monkeypatch.setenv("PI_WORKFLOWS_RETENTION_DAYS", "30")
    clock = ManualClock(now)
    units = _FailFirstSweep()
    server = WorkflowServer(
        state, idle_exit_s=None, tick_s=0.05, execute_runs=False, units=units, clock=clock
    )
    with server:
        deadline = time.monotonic() + 30
        while (retention := _status(state)["retention"])["state"] != "retrying":
            assert time.monotonic() < deadline, retention
            time.sleep(0.05)
        assert retention["lastFailure"]["error"] == "OperationalError"
        assert retention["nextDueAt"] == now + 5 * 60 * 1000
        assert len(_rows(state, "SELECT run_id FROM runs WHERE run_id LIKE 'exp-%'")) == 3
        clock.advance(4 * 60 * 1000)  # not yet: no tight retry loop
        assert _status(state)["retention"]["state"] == "retrying"
        clock.advance(60 * 1000)
        last = _wait_sweeps(state, 1)["lastSweep"]
        assert last["treesDeleted"] == 3
        assert server.running, "a failed sweep does not stop the server"
    log = (state / "logs" / "server.log").read_text()
    failures = [line for line in log.splitlines() if "retention.failed" in line]
    assert len(failures) == 1
    assert "secret" not in failures[0] and str(state) not in failures[0]
    assert len(failures[0]) < 500


def test_a_run_started_during_a_sweep_runs_at_once_and_the_sweep_goes_on_after_it(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started while the startup sweep deletes 300 trees reaches its node without
    waiting for the sweep (one tree per transaction); the sweep, if the run caught it
    under way, stopped between two trees, and goes on after the runner exits."""
    state, project = short_tmp / "state", short_tmp / "project"
    now = T0 + 31 * DAY_MS
    seed_expired_trees(state, 300, now_ms=now)
    write_workflow(project, "gated", GATED)
    ready, release = short_tmp / "ready.fifo", short_tmp / "release.fifo"
    os.mkfifo(ready)
    os.mkfifo(release)
    monkeypatch.setenv("PI_WORKFLOWS_RETENTION_DAYS", "30")
    with _server(state, ManualClock(now), execute_runs=True):
        with WorkflowClient(state, autostart=False, timeout=30) as client:
            gates = {"ready": str(ready), "release": str(release)}
            gated = start_run(client, project, "gated", gates)
            wait_fifo(ready)  # running: it did not wait for the sweep
            retention = _status(state)["retention"]
            if retention["lastSweep"] is None:  # caught under way: stopped between trees
                assert retention["state"] in ("sweeping", "waitingForIdle")
                left = _rows(state, "SELECT count(*) FROM runs WHERE run_id LIKE 'exp-%'")
                assert 0 < left[0][0] <= 300
            release.write_text("go")
            assert wait_for(client, gated, TERMINAL)["display"]["status"] == "completed"
        _wait_sweeps(state, 1)
        assert _rows(state, "SELECT count(*) FROM runs WHERE run_id LIKE 'exp-%'") == [(0,)]
        remaining = sorted(r[0] for r in _rows(state, "SELECT run_id FROM runs"))
        assert remaining == sorted([gated, "recent"])


HUGE = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="huge",
    start_at="big",
    nodes={"big": compute(lambda ctx: {"text": "x" * 1_200_000})},
)
"""
"""A node output larger than a frame: the runner uploads it to the blob store and names
it by reference; the run view shows a reference that `view.content` serves."""


def test_a_retained_run_keeps_run_show_restart_content_and_terminal_message(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, processes: Processes
) -> None:
    """Runs made by real runners at T0; a server started 29 days later sweeps after
    recovery and deletes a tree 31 days old, and the 29-day-old runs keep all they had."""
    state, project = short_tmp / "state", short_tmp / "project"
    write_workflow(project, "huge", HUGE)
    write_workflow(project, "echo")
    state.mkdir()
    db = open_database(state / "state.sqlite", clock=ManualClock(T0 - 2 * DAY_MS))
    try:
        _finished_run(db, "old-x", {"old": True}, failing=True)  # 31 days old at the sweep
    finally:
        db.close()
    monkeypatch.setenv("PI_WORKFLOWS_RETENTION_DAYS", "30")
    with (
        _server(state, ManualClock(T0), execute_runs=True),
        WorkflowClient(state, autostart=False, timeout=60) as client,
    ):
        huge = start_run(client, project, "huge")
        assert wait_for(client, huge, TERMINAL)["display"]["status"] == "completed"
        payload = {
            "workflow": "echo",
            "input": {},
            "projectPath": str(project),
            "originSessionId": SESSION,
            "mode": "interactive",
        }
        told = client.call("run.start", payload)["receipt"]["runId"]
        assert wait_for(client, told, TERMINAL)["display"]["status"] == "completed"
        before = _view(client, huge)
    ref = before["trace"]["items"][0]["output"]["ref"]
    assert ref["byteCount"] > 1_000_000, "stored by reference, not inline"
    messages = _rows(state, f"SELECT kind, state FROM workflow_messages WHERE run_id = '{told}'")
    assert messages == [("terminal", "pending")]

    later = ManualClock(T0 + 29 * DAY_MS)
    with _server(state, later, execute_runs=True) as server:
        last = _wait_sweeps(state, 1)["lastSweep"]
        assert (last["trigger"], last["treesDeleted"]) == ("recovery", 1)
        remaining = sorted(r[0] for r in _rows(state, "SELECT run_id FROM runs"))
        assert remaining == sorted([huge, told]), "only the 31-day-old tree went"
        with WorkflowClient(state, autostart=False, timeout=60) as client:
            after = _view(client, huge)
            assert after["trace"]["items"][0]["output"] == before["trace"]["items"][0]["output"]
            assert after["display"]["status"] == "completed"
            data = client.run_content(huge, ref)  # its content reference still serves
            assert hashlib.sha256(data).hexdigest() == ref["digest"].removeprefix("sha256:")
            assert json.loads(data) == {"text": "x" * 1_200_000}
            restarted = client.call("run.restart", run_id=huge)["receipt"]["runId"]
            assert wait_for(client, restarted, TERMINAL)["display"]["status"] == "completed"
            assert _view(client, huge)["lineage"]["restartedBy"] == [restarted]
        shown = processes.cli(state, "run", "show", huge)
        assert shown.returncode == 0, shown.stderr
        assert "completed" in shown.stdout and f"restarted as {restarted}" in shown.stdout
        watcher = Watcher(server.socket_path)
        try:  # the origin session is still shown the run's terminal message
            watcher.subscribe({"kind": "sessionView", "sessionId": SESSION})
            view = session_snapshot(watcher, lambda v: v["activeRun"] is not None, "the run")
        finally:
            watcher.close()
        assert view["activeRun"]["runId"] == told
        assert view["activeRun"]["display"]["status"] == "completed"
        [item] = view["messages"]["items"]
        assert (item["runId"], item["kind"], item["state"]) == (told, "terminal", "pending")
