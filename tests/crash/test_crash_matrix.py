"""The crash matrix: for every declared crash point, real runs driven into it.

Each scenario starts a real server process armed with one point (a runner point arms the
runners the server starts), lets the process die there, restarts what died (a fresh,
unarmed server; runners are restarted by the server), waits for the system to settle and
checks it (`Lab.finish`, see harness.py): every run in the state the design requires,
no acknowledged command without its stored receipt, no effect applied twice unless it is
ambiguous, no second live runner generation, `state verify` and SQLite's own checks clean.

Each lifecycle transition has points of its own, `server.lifecycle.<transition>.
before_commit` and `.after_commit` (enqueue, launch, ready, node_start, node_finish, ...),
so a scenario names the transition, and `@n` counts only that transition: the second
node_finish of an `approve` run is the charge node's, the answer's transaction enqueues
the continuation and completes the waiting parent (the first complete).

Runner messages of one `charge` run, in the order `runner.message.after_send` counts:

     1 runner.ready  2 node.started a  3 node.finished a  4 node.started charge
     5 effect.reserve  6 effect.settle  7 node.finished charge ...
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows.cli._backup import verify_inactive_backup
from pi_workflows.supervision import CRASH_POINTS
from pi_workflows.testing import (
    FakeProvider,
    FakeTelegram,
    ScriptedTurn,
    workflow_submit_turn,
)
from pi_workflows.wire.client import HostUnavailableError
from tests.conftest import Processes, write_workflow
from tests.crash.harness import (
    PIW,
    SETTLE_S,
    Command,
    Lab,
    Server,
    live_generations,
    runner_rows,
)
from tests.pi.agents import ATTEMPT_IN_PROMPT
from tests.pi.conftest import pi_binary, pi_slot, provider  # noqa: F401 - for NeedsPi cases
from tests.server.retention_seed import assert_whole_trees, run_files, seed_expired_trees
from tests.server.watchers import Watcher

pytestmark = pytest.mark.timeout(90)

Scenario = Callable[[Lab], None]
SCENARIOS: dict[str, dict[str, Scenario]] = {}
"""Crash point -> variant -> scenario. Every declared point needs at least one."""
XFAIL: dict[tuple[str, str], str] = {}
"""(point, variant) -> the reason a scenario is a known bug (strict xfail)."""


def scenario(point: str, variant: str) -> Callable[[Scenario], Scenario]:
    def register(function: Scenario) -> Scenario:
        SCENARIOS.setdefault(point, {})[variant] = function
        return function

    return register


@pytest.fixture
def lab(short_tmp: Path, processes: Processes) -> Iterator[Lab]:
    instance = Lab(short_tmp, processes)
    try:
        yield instance
    finally:
        instance.close()


# --- small reads of the database between a crash and the restart ----------------------


def _row(db: Any, sql: str, *args: Any) -> Any:
    found = db.execute(sql, args).fetchone()
    return None if found is None else (found[0] if len(found) == 1 else tuple(found))


def _queue(db: Any, run_id: str) -> Any:
    return _row(db, "SELECT state FROM run_queue WHERE run_id = ?", run_id)


def _run(db: Any, run_id: str) -> Any:
    """(status, generation, paused) of a run."""
    return _row(db, "SELECT status, generation, paused FROM runs WHERE run_id = ?", run_id)


def _effect_states(db: Any, run_id: str) -> list[str]:
    rows = db.execute("SELECT state FROM effects WHERE run_id = ? ORDER BY created_at", (run_id,))
    return [state for (state,) in rows]


def _requeued_by_recovery(db: Any, run_id: str) -> int:
    return int(
        _row(
            db,
            "SELECT COUNT(*) FROM events WHERE run_id = ? AND event_type = 'run_requeued' "
            "AND json_extract(payload, '$.reason') = 'serverRecovered'",
            run_id,
        )
    )


def _run_of(lab: Lab, start: Command) -> str:
    """The run a run.start made, whether or not its response outran the crash (a lost
    start is re-sent by `Lab.finish`, and must adopt this run)."""
    if start.response is not None:
        return start.new_run
    with lab.database() as db:
        (only,) = db.execute("SELECT run_id FROM runs").fetchall()
    return str(only[0])


def _answer(lab: Lab, run_id: str) -> str:
    """Answer the run's checkpoint; return the continuation run."""
    return lab.command("run.answer", {"answer": {"ok": True}}, run_id=run_id).new_run


def _approve_to_the_end(lab: Lab, run_id: str) -> str:
    """Wait for the checkpoint, answer it, wait for the continuation to complete."""
    lab.wait_status(run_id, "waiting")
    continuation = _answer(lab, run_id)
    lab.wait_status(continuation, "completed")
    return continuation


def _check_approve_ran_once(lab: Lab, run_id: str, continuation: str) -> None:
    assert lab.count(run_id, "a") == 1, "a committed node never runs again"
    assert lab.applied(run_id) == 1, "the effect applied exactly once"
    assert lab.count(continuation, "z") == 1


# --- server.lifecycle.<transition>.before_commit: the transition is lost ----------


@scenario("server.lifecycle.enqueue.before_commit", "run-start")
def _lifecycle_before_enqueue(lab: Lab) -> None:
    armed = lab.start_server("server.lifecycle.enqueue.before_commit")
    start = lab.start_run("approve")
    assert start.lost
    lab.expect_server_crash(armed)
    with lab.database() as db:  # no run and no receipt
        assert _row(db, "SELECT COUNT(*) FROM runs") == 0
        assert _row(db, "SELECT COUNT(*) FROM host_commands") == 0
    lab.start_server()
    lab.resend_lost()
    assert start.resent_outcome == "accepted", "no receipt existed: the retry starts it once"
    run_id = start.new_run
    continuation = _approve_to_the_end(lab, run_id)
    _check_approve_ran_once(lab, run_id, continuation)
    lab.finish({run_id: "completed", continuation: "completed"})


@scenario("server.lifecycle.launch.before_commit", "launch-claim")
def _lifecycle_before_launch(lab: Lab) -> None:
    armed = lab.start_server("server.lifecycle.launch.before_commit")
    start = lab.start_run("approve")
    lab.expect_server_crash(armed)
    with lab.database() as db:
        # The claim never committed. Its admission round either joined the start's group
        # commit (then the start is not durable either, and was never answered) or came
        # after it (then the run is still queued).
        runs = [row[0] for row in db.execute("SELECT run_id FROM runs")]
        assert _row(db, "SELECT COUNT(*) FROM runner_epochs") == 0
        for run_id in runs:
            assert _queue(db, run_id) == "queued"
            assert _run(db, run_id) == ("queued", 0, 0)
    assert len(runs) == 1 or (not runs and start.response is None), runs
    lab.start_server()
    lab.resend_lost()  # a start lost with its group adopts nothing: it starts the run now
    run_id = start.new_run
    assert runs in ([], [run_id])
    continuation = _approve_to_the_end(lab, run_id)
    _check_approve_ran_once(lab, run_id, continuation)
    lab.finish({run_id: "completed", continuation: "completed"})


@scenario("server.lifecycle.node_finish.before_commit", "node-finished-after-effect")
def _lifecycle_before_node_finished(lab: Lab) -> None:
    armed = lab.start_server("server.lifecycle.node_finish.before_commit@2")
    start = lab.start_run("approve")
    lab.expect_server_crash(armed)
    run_id = _run_of(lab, start)
    with lab.database() as db:  # the effect settled; finishing its node did not commit
        assert _effect_states(db, run_id) == ["applied"]
        assert (
            _row(
                db,
                "SELECT status FROM node_attempts WHERE run_id = ? AND node_path = 'charge'",
                run_id,
            )
            == "running"
        )
    lab.start_server()
    continuation = _approve_to_the_end(lab, run_id)
    _check_approve_ran_once(lab, run_id, continuation)  # the rerun adopted the receipt
    lab.finish({run_id: "completed", continuation: "completed"})


@scenario("server.lifecycle.wait.before_commit", "checkpoint-wait")
def _lifecycle_before_wait(lab: Lab) -> None:
    armed = lab.start_server("server.lifecycle.wait.before_commit")
    start = lab.start_run("approve")
    lab.expect_server_crash(armed)
    run_id = _run_of(lab, start)
    with lab.database() as db:  # the checkpoint completed; waiting there did not commit
        assert _run(db, run_id)[0] == "running"
        assert _row(db, "SELECT COUNT(*) FROM human_decisions") == 0
    lab.start_server()
    view = lab.wait_status(run_id, "waiting", "completed")
    assert view["display"]["status"] == "waiting", "the unanswered checkpoint was skipped"
    assert lab.count(run_id, "z") == 0
    continuation = _approve_to_the_end(lab, run_id)
    _check_approve_ran_once(lab, run_id, continuation)
    lab.finish({run_id: "completed", continuation: "completed"})


@scenario("server.lifecycle.complete.before_commit", "answer-command")
def _lifecycle_before_answer(lab: Lab) -> None:
    armed = lab.start_server("server.lifecycle.complete.before_commit")
    run_id = lab.start_run("approve").new_run
    lab.wait_status(run_id, "waiting")
    answer = lab.command("run.answer", {"answer": {"ok": True}}, run_id=run_id)
    assert answer.lost
    lab.expect_server_crash(armed)
    with lab.database() as db:  # no continuation, no receipt
        assert _run(db, run_id)[0] == "waiting"
        assert _row(db, "SELECT COUNT(*) FROM runs WHERE continuation_of = ?", run_id) == 0
        assert _row(db, "SELECT COUNT(*) FROM host_commands WHERE operation = 'run.answer'") == 0
    lab.start_server()
    lab.resend_lost()
    assert answer.resent_outcome == "accepted", "no receipt existed: the retry applies it once"
    continuation = answer.new_run
    lab.wait_status(continuation, "completed")
    _check_approve_ran_once(lab, run_id, continuation)
    lab.finish({run_id: "completed", continuation: "completed"})


# --- server.lifecycle.<transition>.after_commit: durable, nobody acted on it ---------


@scenario("server.lifecycle.launch.after_commit", "launch-claim")
def _lifecycle_after_launch(lab: Lab) -> None:
    armed = lab.start_server("server.lifecycle.launch.after_commit")
    start = lab.start_run("approve")
    lab.expect_server_crash(armed)
    run_id = _run_of(lab, start)
    with lab.database() as db:  # claimed for a runner that was never spawned
        assert _queue(db, run_id) == "starting"
        assert runner_rows(db, run_id) == [("starting", None)]
    lab.start_server()
    continuation = _approve_to_the_end(lab, run_id)
    _check_approve_ran_once(lab, run_id, continuation)
    lab.finish({run_id: "completed", continuation: "completed"})
    with lab.database() as db:
        assert runner_rows(db, run_id) == [("orphaned", None), ("exited", None)]


@scenario("server.lifecycle.wait.after_commit", "waiting")
def _lifecycle_after_wait(lab: Lab) -> None:
    armed = lab.start_server("server.lifecycle.wait.after_commit")
    start = lab.start_run("approve")
    lab.expect_server_crash(armed)
    run_id = _run_of(lab, start)
    with lab.database() as db:
        assert _run(db, run_id) == ("waiting", 1, 0)
    lab.start_server()
    view = lab.wait_status(run_id, "waiting")
    assert view["generation"] == 1, "a waiting run is not recovered or relaunched"
    assert view["display"]["waitingOn"] == "approve"
    continuation = _approve_to_the_end(lab, run_id)
    _check_approve_ran_once(lab, run_id, continuation)
    lab.finish({run_id: "completed", continuation: "completed"})
    with lab.database() as db:
        assert runner_rows(db, run_id) == [("orphaned", None)]


@scenario("server.lifecycle.complete.after_commit", "answer-receipt")
def _lifecycle_after_answer(lab: Lab) -> None:
    armed = lab.start_server("server.lifecycle.complete.after_commit")
    run_id = lab.start_run("approve").new_run
    lab.wait_status(run_id, "waiting")
    answer = lab.command("run.answer", {"answer": {"ok": True}}, run_id=run_id)
    assert answer.lost
    lab.expect_server_crash(armed)
    with lab.database() as db:
        assert _run(db, run_id)[0] == "completed"
        (continuation,) = db.execute("SELECT run_id FROM runs WHERE continuation_of = ?", (run_id,))
    lab.start_server()
    lab.resend_lost()
    assert answer.resent_outcome == "adopted"
    assert answer.new_run == continuation[0], "the retry names the one continuation"
    lab.wait_status(answer.new_run, "completed")
    _check_approve_ran_once(lab, run_id, answer.new_run)
    lab.finish({run_id: "completed", answer.new_run: "completed"})


@scenario("server.lifecycle.complete.after_commit", "run-finished")
def _lifecycle_after_finish(lab: Lab) -> None:
    armed = lab.start_server("server.lifecycle.complete.after_commit@2")
    run_id = lab.start_run("approve").new_run
    lab.wait_status(run_id, "waiting")
    continuation = _answer(lab, run_id)
    lab.expect_server_crash(armed)
    with lab.database() as db:
        assert _run(db, continuation)[0] == "completed"
    lab.start_server()
    view = lab.wait_status(continuation, "completed")
    assert view["generation"] == 1, "a completed run is never claimed again"
    _check_approve_ran_once(lab, run_id, continuation)
    lab.finish({run_id: "completed", continuation: "completed"})


# --- the last pure node and the run's completion: one unit ------------------------------
# `pure` ends with b: its runner sends b's finish inside `run.finished`, so the server
# commits both in one transaction. Dead before that commit: neither is durable and b runs
# again; dead after it: both are, and nothing runs again.


def _attempts_of(db: Any, run_id: str, node: str) -> list[str]:
    rows = db.execute(
        "SELECT status FROM node_attempts WHERE run_id = ? AND node_path = ? ORDER BY rowid",
        (run_id, node),
    ).fetchall()
    return [row[0] for row in rows]


def _merged_finish_crash(lab: Lab, point: str, durable: bool) -> None:
    armed = lab.start_server(point)
    start = lab.start_run("pure")
    lab.expect_server_crash(armed)
    run_id = _run_of(lab, start)
    with lab.database() as db:
        if durable:
            assert _run(db, run_id)[0] == "completed"
            assert _attempts_of(db, run_id, "b") == ["completed"], "b finished with the run"
        else:
            # b's start may have gone in the same group commit (the run's end is sent
            # behind the posted messages): durable or not, b did not finish.
            assert _run(db, run_id)[0] == "running"
            assert _attempts_of(db, run_id, "b") in ([], ["running"]), "neither half"
    lab.start_server()
    lab.resend_lost()
    view = lab.wait_status(run_id, "completed")
    with lab.database() as db:
        b_attempts = _attempts_of(db, run_id, "b")
    if durable:
        assert view["generation"] == 1, "a completed run is never claimed again"
        assert lab.count(run_id, "b") == 1
        assert b_attempts == ["completed"]
    else:
        assert lab.count(run_id, "b") == 2, "b ran again in the next generation"
        assert b_attempts in (["completed"], ["interrupted", "completed"])
    lab.finish({run_id: "completed"})


for _point, _durable in (
    ("server.lifecycle.complete.before_commit", False),
    ("server.lifecycle.node_finish.after_commit@2", True),
    ("server.lifecycle.complete.after_commit", True),
):
    scenario(_point.split("@")[0], "last-node-with-run")(
        functools.partial(_merged_finish_crash, point=_point, durable=_durable)
    )


# --- server.receipt.after_commit: the receipt is durable, the response is lost ---------


@scenario("server.receipt.after_commit", "run-start")
def _receipt_start(lab: Lab) -> None:
    armed = lab.start_server("server.receipt.after_commit@1")
    start = lab.start_run("pure")
    assert start.lost
    lab.expect_server_crash(armed)
    with lab.database() as db:
        (only,) = db.execute("SELECT run_id FROM runs").fetchall()
    lab.start_server()
    lab.resend_lost()
    assert start.resent_outcome == "adopted" and start.new_run == only[0]
    lab.wait_status(start.new_run, "completed")
    assert lab.count(start.new_run, "a") == 1
    lab.finish({start.new_run: "completed"})


def _pause_while_applying(lab: Lab, read_back: bool) -> None:
    armed = lab.start_server("server.receipt.after_commit@2")
    run_id = lab.start_run("charge", {"block": "charge", "readBack": read_back}).new_run
    lab.events.wait(run_id, "applying")
    pause = lab.command("run.pause", run_id=run_id)
    assert pause.lost
    lab.expect_server_crash(armed)
    with lab.database() as db:  # parked and paused; the effect stays applying
        assert _run(db, run_id) == ("running", 1, 1)
        assert _queue(db, run_id) == "parked"
        assert _effect_states(db, run_id) == ["applying"]
    lab.start_server()
    lab.resend_lost()
    assert pause.resent_outcome == "adopted"
    view = lab.get(run_id)
    assert view["display"]["status"] == "paused" and view["generation"] == 1
    lab.command("run.resume", run_id=run_id)
    final = "completed" if read_back else "ambiguous"
    lab.wait_status(run_id, final)
    assert lab.applied(run_id) == 1, "proven by read-back, or ambiguous: never applied again"
    assert lab.count(run_id, "a") == 1 and lab.count(run_id, "z") == int(read_back)
    lab.finish({run_id: final}, ambiguous=0 if read_back else 1)


@scenario("server.receipt.after_commit", "pause-applying-read-back")
def _receipt_pause_read_back(lab: Lab) -> None:
    _pause_while_applying(lab, read_back=True)


@scenario("server.receipt.after_commit", "pause-applying-no-read-back")
def _receipt_pause_no_read_back(lab: Lab) -> None:
    _pause_while_applying(lab, read_back=False)


@scenario("server.receipt.after_commit", "restart")
def _receipt_restart(lab: Lab) -> None:
    armed = lab.start_server("server.receipt.after_commit@2")
    old = lab.start_run("pure").new_run
    lab.wait_status(old, "completed")
    restart = lab.command("run.restart", run_id=old)
    assert restart.lost
    lab.expect_server_crash(armed)
    with lab.database() as db:
        (new,) = db.execute("SELECT run_id FROM runs WHERE restart_of = ?", (old,)).fetchall()
    lab.start_server()
    lab.resend_lost()
    assert restart.resent_outcome == "adopted" and restart.new_run == new[0]
    lab.wait_status(restart.new_run, "completed")
    assert lab.count(old, "a") == lab.count(restart.new_run, "a") == 1
    lab.finish({old: "completed", restart.new_run: "completed"})


# --- server.group_commit.*: one COMMIT for a batch of units ----------------------------
# The first batch that writes is `run.start`'s, unless the first lease renewal (2 s after
# the start) wins the race on a slow machine; the checks hold either way. Automatic
# retention is off here: its startup sweep's blob collection is a batch of its own, which
# may come first (even before the server's banner) on a loaded machine.
# tests/actors/test_database.py drives both points with a runner message and a client
# command in one batch.


@scenario("server.group_commit.before_commit", "run-start")
def _group_before_commit(lab: Lab) -> None:
    lab.extra_env["PI_WORKFLOWS_RETENTION_DAYS"] = "0"
    armed = lab.start_server("server.group_commit.before_commit@1")
    start = lab.start_run("pure")
    assert start.lost
    lab.expect_server_crash(armed)
    with lab.database() as db:  # the batch never committed: no run, no receipt
        assert _row(db, "SELECT COUNT(*) FROM runs") == 0
        assert _row(db, "SELECT COUNT(*) FROM host_commands") == 0
    lab.start_server()
    lab.resend_lost()
    assert start.resent_outcome == "accepted", "no receipt existed: the retry starts it once"
    lab.wait_status(start.new_run, "completed")
    assert lab.count(start.new_run, "a") == 1
    lab.finish({start.new_run: "completed"})


@scenario("server.group_commit.after_commit", "run-start")
def _group_after_commit(lab: Lab) -> None:
    lab.extra_env["PI_WORKFLOWS_RETENTION_DAYS"] = "0"
    armed = lab.start_server("server.group_commit.after_commit@1")
    start = lab.start_run("pure")
    assert start.lost, "no unit of a batch is answered before its COMMIT"
    lab.expect_server_crash(armed)
    with lab.database() as db:
        runs = db.execute("SELECT run_id FROM runs").fetchall()
    lab.start_server()
    lab.resend_lost()
    if runs:  # the batch of run.start committed: the retry adopts its receipt
        assert start.resent_outcome == "adopted" and start.new_run == runs[0][0]
    else:  # the lease renewal's batch came first
        assert start.resent_outcome == "accepted"
    lab.wait_status(start.new_run, "completed")
    assert lab.count(start.new_run, "a") == 1
    lab.finish({start.new_run: "completed"})


# --- server.launch.*: the launch is committed, the runner unknown or unborn ------------


def _launch_crash(lab: Lab, point: str) -> None:
    armed = lab.start_server(point)
    start = lab.start_run("charge", {"readBack": False})
    lab.expect_server_crash(armed)
    orphans = lab.lab_processes()  # a spawned runner, its zygote: they must not survive
    with lab.database() as db:
        (run_id,) = db.execute("SELECT run_id FROM runs").fetchone()
        assert _row(db, "SELECT COUNT(*) FROM runner_processes") == 0  # identity unrecorded
        assert _row(db, "SELECT COUNT(*) FROM node_attempts") == 0  # no node ran
        if point == "server.launch.after_commit":  # never spawned
            assert _queue(db, run_id) == "starting"
            assert runner_rows(db, run_id) == [("starting", None)]
        else:  # spawned; its runner.ready may have raced the crash, nothing more can have
            assert [status for status, _ in runner_rows(db, run_id)] in (["starting"], ["ready"])
    lab.start_server()
    lab.assert_gone(orphans, "a process of the crashed server")
    lab.resend_lost()
    assert start.new_run == run_id
    lab.wait_status(run_id, "completed")
    assert lab.count(run_id, "a") == 1, "no node of the lost launch ran"
    assert lab.applied(run_id) == 1
    lab.finish({run_id: "completed"})
    with lab.database() as db:
        assert runner_rows(db, run_id) == [("orphaned", None), ("exited", None)]


@scenario("server.launch.after_commit", "first-launch")
def _launch_after_commit(lab: Lab) -> None:
    _launch_crash(lab, "server.launch.after_commit")


@scenario("server.launch.after_spawn", "first-launch")
def _launch_after_spawn(lab: Lab) -> None:
    _launch_crash(lab, "server.launch.after_spawn")


# --- server.ready.before_command: live runner, no command -------------------------------


@scenario("server.ready.before_command", "first-ready")
def _ready_before_command(lab: Lab) -> None:
    armed = lab.start_server("server.ready.before_command")
    start = lab.start_run("charge", {"readBack": False})
    lab.expect_server_crash(armed)
    run_id = _run_of(lab, start)
    with lab.database() as db:
        assert _queue(db, run_id) == "running"
        assert [status for status, _ in runner_rows(db, run_id)] == ["ready"]
        assert _row(db, "SELECT COUNT(*) FROM node_attempts") == 0
    lab.start_server()
    lab.wait_status(run_id, "completed")
    assert lab.count(run_id, "a") == 1 and lab.applied(run_id) == 1
    lab.finish({run_id: "completed"})
    with lab.database() as db:
        assert runner_rows(db, run_id) == [("orphaned", None), ("exited", None)]


# --- server.lifecycle.cancel.before_fence: cancelled durably, the runner not stopped yet


@scenario("server.lifecycle.cancel.before_fence", "shell-running")
def _cancel_shell(lab: Lab) -> None:
    armed = lab.start_server("server.lifecycle.cancel.before_fence")
    run_id = lab.start_run("build", {"block": "build"}).new_run
    shell_pid = lab.events.wait(run_id, "build")
    shell = psutil.Process(shell_pid)
    cancel = lab.command("run.cancel", run_id=run_id)
    assert cancel.lost
    lab.expect_server_crash(armed)
    with lab.database() as db:  # terminal, and the running shell effect is ambiguous
        assert _run(db, run_id)[0] == "cancelled"
        assert _effect_states(db, run_id) == ["ambiguous"]
        assert (
            _row(db, "SELECT role FROM runner_processes WHERE pid = ?", shell_pid) == "registered"
        )
    lab.start_server()
    lab.assert_gone([shell], "the registered shell command")  # stopped by exact identity
    lab.resend_lost()
    assert cancel.resent_outcome == "adopted"
    assert lab.get(run_id)["generation"] == 1, "a cancelled run never resumes"
    assert lab.shell_runs(run_id) == 1 and lab.count(run_id, "z") == 0
    lab.finish({run_id: "cancelled"}, ambiguous=1)


@scenario("server.lifecycle.cancel.before_fence", "effect-applying")
def _cancel_effect(lab: Lab) -> None:
    armed = lab.start_server("server.lifecycle.cancel.before_fence")
    run_id = lab.start_run("charge", {"block": "charge"}).new_run
    lab.events.wait(run_id, "applying")
    cancel = lab.command("run.cancel", run_id=run_id)
    assert cancel.lost
    lab.expect_server_crash(armed)
    with lab.database() as db:
        assert _run(db, run_id)[0] == "cancelled"
        assert _effect_states(db, run_id) == ["ambiguous"]
    lab.start_server()
    lab.resend_lost()
    assert cancel.resent_outcome == "adopted"
    assert lab.applied(run_id) == 1, "an ambiguous effect is never retried (nor read back)"
    assert lab.count(run_id, "z") == 0
    lab.finish({run_id: "cancelled"}, ambiguous=1)


# --- server.recovery.*: a crash inside startup recovery --------------------------------


@scenario("server.recovery.after_epoch", "shell-running-and-waiting")
def _recovery_after_epoch(lab: Lab) -> None:
    first = lab.start_server()
    waiting = lab.start_run("approve").new_run
    lab.wait_status(waiting, "waiting")
    building = lab.start_run("build", {"block": "build"}).new_run
    shell = psutil.Process(lab.events.wait(building, "build"))
    lab.kill_server(first)
    armed = lab.start_server("server.recovery.after_epoch", ready=False)
    lab.expect_server_crash(armed)
    assert armed.popen.stdout is not None and armed.popen.stdout.read() == ""  # never ready
    with lab.database() as db:  # nothing recovered yet
        assert _queue(db, building) == "running"
        assert _requeued_by_recovery(db, building) == 0
    final = lab.start_server()
    assert first.epoch is not None and final.epoch == first.epoch + 2
    lab.assert_gone([shell], "the registered shell command")
    lab.wait_status(building, "ambiguous")
    assert lab.shell_runs(building) == 1, "an interrupted shell command is never rerun"
    assert lab.get(waiting)["generation"] == 1
    continuation = _approve_to_the_end(lab, waiting)
    _check_approve_ran_once(lab, waiting, continuation)
    lab.finish(
        {waiting: "completed", continuation: "completed", building: "ambiguous"}, ambiguous=1
    )
    with lab.database() as db:
        assert _requeued_by_recovery(db, building) == 1


@scenario("server.recovery.after_first_run", "compute-and-effect-in-flight")
def _recovery_after_first_batch(lab: Lab) -> None:
    first = lab.start_server()
    paying = lab.start_run("charge", {"block": "charge"}).new_run
    computing = lab.start_run("pure", {"block": "a"}).new_run
    lab.events.wait(paying, "applying")
    lab.events.wait(computing, "a")
    lab.kill_server(first)
    armed = lab.start_server("server.recovery.after_first_run", ready=False)
    lab.expect_server_crash(armed)
    with lab.database() as db:  # the batch committed: both requeued under a new generation
        for run_id in (paying, computing):
            assert _queue(db, run_id) == "queued"
            assert _run(db, run_id) == ("queued", 2, 0)
            assert _requeued_by_recovery(db, run_id) == 1
    lab.start_server()
    lab.wait_status(paying, "completed")
    lab.wait_status(computing, "completed")
    assert lab.applied(paying) == 1, "read-back proved the interrupted effect"
    assert lab.count(computing, "a") == 2 and lab.count(computing, "b") == 1
    lab.finish({paying: "completed", computing: "completed"})
    with lab.database() as db:
        for run_id in (paying, computing):
            assert _requeued_by_recovery(db, run_id) == 1, "recovered once, not twice"
        assert _effect_states(db, paying) == ["applied"]


KEEPER = """\
from pi_workflows.resource_managers import define_resource_manager


def reconcile(ctx):
    child = ctx.workflows.ensure(request_key="pure/1", workflow="pure", input={})
    return ctx.settled(status={"phase": child.state, "runId": child.run_id})


resource_manager = define_resource_manager(
    name="keeper", initial_status=lambda spec: {"phase": "new"}, reconcile=reconcile
)
"""


@scenario("server.resource.ensure.child_reserved", "one-child-per-key")
def _resource_child_reserved(lab: Lab) -> None:
    folder = lab.project / ".pi" / "resource-managers"
    folder.mkdir(parents=True)
    (folder / "keeper.resource_manager.py").write_text(KEEPER)
    ref = {"manager": "keeper", "key": "k", "projectPath": str(lab.project)}
    armed = lab.start_server("server.resource.ensure.child_reserved")
    lab.command("resourceManager.apply", {**ref, "spec": {}})
    lab.expect_server_crash(armed)
    with lab.database() as db:  # the reservation and its queued run committed together
        [(run_id,)] = db.execute("SELECT run_id FROM resource_child_runs").fetchall()
        assert _queue(db, run_id) == "queued"
    lab.start_server()
    lab.wait_status(run_id, "completed")
    deadline = time.monotonic() + SETTLE_S
    while lab.call("resourceManager.get", ref)["resource"]["status"].get("phase") != "done":
        assert time.monotonic() < deadline, "the parent never read its child's end"
        time.sleep(0.1)  # polling the server for a condition
    with lab.database() as db:
        children = db.execute("SELECT run_id FROM resource_child_runs").fetchall()
        assert children == [(run_id,)], "the pass after the crash found the same run"
    lab.finish({run_id: "completed"})


# --- runner.*: a runner dies; the server lives and decides -----------------------------


@scenario("runner.ready.before_send", "first-runner")
def _runner_before_ready(lab: Lab) -> None:
    armed = lab.start_server("runner.ready.before_send")
    run_id = lab.start_run("pure").new_run
    view = lab.wait_reason(run_id, "runnerNoProgress")
    lab.expect_runner_crash(armed)
    lab.wait_no_runners()
    view = lab.get(run_id)
    display = view["display"]
    assert (display["status"], display["reason"]) == ("queued", "runnerNoProgress"), display
    assert "resume" in display["controls"], "parked: the operator may resume it"
    assert view["generation"] == 1 and lab.count(run_id, "a") == 0
    lab.command("run.resume", run_id=run_id)  # the operator's explicit resume
    lab.wait_status(run_id, "completed")
    assert lab.count(run_id, "a") == 1
    lab.finish({run_id: "completed"})
    with lab.database() as db:
        assert runner_rows(db, run_id) == [("crashed", signal.SIGKILL), ("exited", None)]


def _runner_effect_crash(lab: Lab, point: str, read_back: bool, applied: int) -> None:
    armed = lab.start_server(point)
    run_id = lab.start_run("charge", {"readBack": read_back}).new_run
    if read_back:
        lab.wait_status(run_id, "completed")
        assert lab.count(run_id, "z") == 1
    else:
        view = lab.wait_status(run_id, "ambiguous")
        assert view["display"]["reason"] == "effectAmbiguous"
        assert lab.count(run_id, "z") == 0
    lab.expect_runner_crash(armed)
    assert lab.count(run_id, "a") == 1
    assert lab.applied(run_id) == applied
    lab.finish({run_id: "completed" if read_back else "ambiguous"}, ambiguous=0 if read_back else 1)
    with lab.database() as db:
        assert _effect_states(db, run_id) == ["applied" if read_back else "ambiguous"]
        assert runner_rows(db, run_id)[0] == ("crashed", signal.SIGKILL)


@scenario("runner.effect.after_reserve", "read-back")
def _after_reserve_read_back(lab: Lab) -> None:
    _runner_effect_crash(lab, "runner.effect.after_reserve", read_back=True, applied=1)


@scenario("runner.effect.after_reserve", "no-read-back")
def _after_reserve_no_read_back(lab: Lab) -> None:
    _runner_effect_crash(lab, "runner.effect.after_reserve", read_back=False, applied=0)


@scenario("runner.effect.after_apply", "read-back")
def _after_apply_read_back(lab: Lab) -> None:
    _runner_effect_crash(lab, "runner.effect.after_apply", read_back=True, applied=1)


@scenario("runner.effect.after_apply", "no-read-back")
def _after_apply_no_read_back(lab: Lab) -> None:
    _runner_effect_crash(lab, "runner.effect.after_apply", read_back=False, applied=1)


@scenario("runner.effect.after_apply", "shell")
def _after_apply_shell(lab: Lab) -> None:
    armed = lab.start_server("runner.effect.after_apply")
    run_id = lab.start_run("build").new_run
    lab.wait_status(run_id, "ambiguous")
    lab.expect_runner_crash(armed)
    assert lab.shell_runs(run_id) == 1 and lab.count(run_id, "z") == 0
    lab.finish({run_id: "ambiguous"}, ambiguous=1)


@scenario("runner.content.after_write", "large-output")
def _content_after_write(lab: Lab) -> None:
    # Killed after the third of the output's seven parts: nothing names them yet, so the
    # attempt is interrupted and `big` runs again; the output is recorded whole, once.
    armed = lab.start_server("runner.content.after_write@3")
    run_id = lab.start_run("large").new_run
    lab.wait_status(run_id, "completed")
    lab.expect_runner_crash(armed)
    assert lab.count(run_id, "big") == 2 and lab.count(run_id, "z") == 1
    lab.finish({run_id: "completed"})
    with lab.database() as db:
        statuses = db.execute(
            "SELECT status FROM node_attempts WHERE run_id = ? AND node_path = 'big'"
            " ORDER BY started_at, attempt_id",
            (run_id,),
        ).fetchall()
        (content,) = db.execute(
            "SELECT b.content FROM node_attempts a JOIN blobs b ON b.digest = a.output_hash"
            " WHERE a.run_id = ? AND a.node_path = 'big' AND a.status = 'completed'",
            (run_id,),
        ).fetchone()
        assert runner_rows(db, run_id)[0] == ("crashed", signal.SIGKILL)
    assert sorted(status for (status,) in statuses) == ["completed", "interrupted"]
    assert json.loads(content) == {"node": "big", "count": 2, "text": "b" * 3 * 1024 * 1024}


# The event each committed runner message writes (the replies themselves go with their
# runner epoch: `record_runner_exit` deletes them, since no frame of it is answered again).
_EVENT_OF_MESSAGE = {
    "runner_live": "runner.ready",
    "node_started": "node.started",
    "node_finished": "node.finished",
    "node_failed": "node.failed",
    "effect_reserved": "effect.reserve",
    "effect_settled": "effect.settle",
    "interaction_requested": "interaction.requested",
}
_SERVER_EVENTS = frozenset({"run_queued", "run_claimed", "run_requeued", "run_parked"})


def _messages_of_the_crashed_runner(lab: Lab, run_id: str) -> list[str]:
    """The kinds of the messages the server committed from the run's first runner.

    Read from the events of its generation: its stored replies were deleted when its
    epoch ended (a repeat from it is refused before the database).
    """
    with lab.database() as db:
        crashed, generation = db.execute(
            "SELECT runner_epoch, generation FROM runner_epochs WHERE run_id = ?"
            " ORDER BY started_at, generation",
            (run_id,),
        ).fetchone()
        kept = db.execute(
            "SELECT count(*) FROM runner_messages WHERE runner_epoch = ?", (crashed,)
        ).fetchone()[0]
        events = db.execute(
            "SELECT event_type FROM events WHERE run_id = ? AND generation = ? ORDER BY revision",
            (run_id, generation),
        ).fetchall()
        assert runner_rows(db, run_id)[0] == ("crashed", signal.SIGKILL)
    assert kept == 0, "an ended runner epoch keeps no replies"
    return [_EVENT_OF_MESSAGE.get(kind, kind) for (kind,) in events if kind not in _SERVER_EVENTS]


def _message_crash(lab: Lab, hit: int, kind: str) -> None:
    armed = lab.start_server(f"runner.message.after_send@{hit}")
    run_id = lab.start_run("charge", {"readBack": False}).new_run
    lab.wait_status(run_id, "completed")
    lab.expect_runner_crash(armed)
    assert lab.count(run_id, "a") == 1, "a committed node.finished is never rerun"
    assert lab.applied(run_id) == 1, "a committed settlement is adopted, not reapplied"
    assert lab.count(run_id, "z") == 1
    lab.finish({run_id: "completed"})
    kinds = _messages_of_the_crashed_runner(lab, run_id)
    assert len(kinds) == hit and kinds[-1] == kind, "the server committed the last message"


@scenario("runner.message.after_send", "node-finished")
def _message_node_finished(lab: Lab) -> None:
    _message_crash(lab, 3, "node.finished")


@scenario("runner.message.after_send", "effect-settle")
def _message_effect_settle(lab: Lab) -> None:
    _message_crash(lab, 6, "effect.settle")


@scenario("runner.message.after_send", "checkpoint-finished")
def _message_checkpoint_finished(lab: Lab) -> None:
    # Message 9 of an `approve` run is node.finished of the checkpoint; run.parked is next.
    armed = lab.start_server("runner.message.after_send@9")
    run_id = lab.start_run("approve").new_run
    view = lab.wait_status(run_id, "waiting", "completed")
    lab.expect_runner_crash(armed)
    assert view["display"]["status"] == "waiting", "the unanswered checkpoint was skipped"
    assert view["display"]["waitingOn"] == "approve" and lab.count(run_id, "z") == 0
    continuation = _approve_to_the_end(lab, run_id)
    _check_approve_ran_once(lab, run_id, continuation)
    lab.finish({run_id: "completed", continuation: "completed"})
    kinds = _messages_of_the_crashed_runner(lab, run_id)
    assert kinds[-2:] == ["node.started", "node.finished"] and len(kinds) == 9


# --- interaction.requested: an agent step's request, committed; the real pi, faked model --
# The agent step resolves pi, proposes its attempt's request and only then spawns pi, so
# a crash on either side of that commit leaves a request and no pi child. The next
# runner presents the step again (a new attempt and its own request) to a real pi whose
# fake model submits; the run completes with the submitted output.

ASK = """
from pi_workflows import agent, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={
        "ask": agent(
            prompt="Summarise the work",
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            provider="fake",
            model="fake-model",
            timeout=120,
        ),
    },
)
"""
SUBMITTED = {"summary": "presented again, submitted once"}


@dataclass(frozen=True)
class RealPi:
    """The real pi binary and the module's fake model provider, for an agent scenario."""

    binary: Path
    provider: FakeProvider


@dataclass(frozen=True)
class NeedsPi:
    """A scenario that runs a real pi child: `test_crash_point` takes a pi slot for it."""

    function: Callable[[Lab, RealPi], None]

    def __call__(self, lab: Lab) -> None:  # pragma: no cover - test_crash_point unwraps
        raise AssertionError("a real-pi scenario runs with RealPi")


def pi_scenario(point: str, variant: str) -> Callable[[Callable[[Lab, RealPi], None]], NeedsPi]:
    def register(function: Callable[[Lab, RealPi], None]) -> NeedsPi:
        wrapped = NeedsPi(function)
        SCENARIOS.setdefault(point, {})[variant] = wrapped
        return wrapped

    return register


def _submit_for_the_prompted_attempt(body: Mapping[str, Any]) -> ScriptedTurn:
    found = ATTEMPT_IN_PROMPT.search(json.dumps(body.get("messages")))
    assert found is not None, "the prompt carries the step contract"
    return workflow_submit_turn("ask", found.group(1), SUBMITTED)


def _ask_lab(lab: Lab, pi: RealPi) -> None:
    """The `ask` workflow, pi children of this lab's servers, one scripted submit."""
    write_workflow(lab.project, "ask", ASK)
    pi.provider.write_agent_dir(lab.state_dir.parent)  # the servers' PI_CODING_AGENT_DIR
    pi.provider.script(_submit_for_the_prompted_attempt)


def _requests_by_attempt(lab: Lab, run_id: str) -> list[tuple[str, str, int]]:
    """(attempt status, request status, requests of that attempt) of each `ask` attempt."""
    with lab.database() as db:
        rows = db.execute(
            "SELECT a.status, coalesce(max(r.status), 'none'), count(r.request_id)"
            " FROM node_attempts a LEFT JOIN interactive_requests r ON r.attempt_id = a.attempt_id"
            " WHERE a.run_id = ? AND a.node_path = 'ask'"
            " GROUP BY a.attempt_id ORDER BY a.started_at, a.attempt_id",
            (run_id,),
        ).fetchall()
    return [(str(a), str(r), int(n)) for a, r, n in rows]


def _check_presented_again(lab: Lab, pi: RealPi, run_id: str) -> None:
    """The first attempt's request committed once and no pi saw it; the next attempt
    was presented to one pi child, once, and its submitted output is the step's."""
    attempts = _requests_by_attempt(lab, run_id)
    assert [count for _, _, count in attempts] == [1, 1], attempts
    assert attempts[0][0] == "interrupted" and attempts[-1][0] == "completed", attempts
    # The interrupted attempt's request never got a submission: the run's end cancelled
    # it. The completed one is settled once the bridge submits through the server.
    assert attempts[0][1] == "cancelled", attempts
    assert attempts[-1][1] in ("settled", "cancelled"), attempts
    assert len(pi.provider.chat_requests()) == 1, "the model was asked once, by the new attempt"
    with lab.database() as db:
        (output,) = db.execute(
            "SELECT b.content FROM node_attempts a JOIN blobs b ON b.digest = a.output_hash"
            " WHERE a.run_id = ? AND a.node_path = 'ask' AND a.status = 'completed'",
            (run_id,),
        ).fetchone()
    assert json.loads(output) == SUBMITTED


def _no_pi_left(lab: Lab) -> None:
    """pi runs with an environment built from scratch (no lab tag): find it by its cwd."""
    left = []
    for process in psutil.process_iter(["cwd"]):
        if process.info["cwd"] == str(lab.project):
            left.append(process)
    lab.assert_gone(left, "a process in the lab's project (pi or a runner)")


@pi_scenario("server.runner_message.interaction_requested.after_commit", "agent-step")
def _interaction_requested_committed(lab: Lab, pi: RealPi) -> None:
    _ask_lab(lab, pi)
    armed = lab.start_server("server.runner_message.interaction_requested.after_commit")
    start = lab.start_run("ask")
    lab.expect_server_crash(armed)
    run_id = _run_of(lab, start)
    assert _requests_by_attempt(lab, run_id) == [("running", "pending", 1)]
    assert pi.provider.chat_requests() == [], "pi is spawned only after the request's reply"
    lab.start_server()
    lab.resend_lost()
    lab.wait_status(run_id, "completed")
    _check_presented_again(lab, pi, run_id)
    lab.finish({run_id: "completed"})
    _no_pi_left(lab)
    with lab.database() as db:
        assert _requeued_by_recovery(db, run_id) == 1


@pi_scenario("runner.message.interaction_requested.after_send", "agent-step")
def _interaction_requested_sent(lab: Lab, pi: RealPi) -> None:
    _ask_lab(lab, pi)
    armed = lab.start_server("runner.message.interaction_requested.after_send")
    run_id = lab.start_run("ask").new_run
    lab.wait_status(run_id, "completed")
    lab.expect_runner_crash(armed)
    _check_presented_again(lab, pi, run_id)
    lab.finish({run_id: "completed"})
    _no_pi_left(lab)
    kinds = _messages_of_the_crashed_runner(lab, run_id)
    assert kinds[-1] == "interaction.requested", "the server committed the last message"


# --- named points of every transition, message kind and effect step --------------------
# Each point is reached by running one workflow of the lab (and, for commands, by sending
# the command) on a server armed with that point alone: no hit counting. The checks after
# the restart are the matrix's own (`Lab.finish`): the run ends as the design requires,
# nothing acknowledged is lost, no effect or shell command ran twice, `state verify` clean.

FINAL = {
    "pure": "completed",
    "charge": "completed",
    "note": "completed",
    "fails": "failed",
    "late": "timed_out",
    "build": "ambiguous",
}
"""What each workflow of an autonomous run ends as after a crash at one of its points."""


def _settle(lab: Lab, run_id: str, workflow: str) -> dict[str, str]:
    """Wait for the run (and an approve run's continuation) to end; the expected map."""
    if workflow == "approve":
        continuation = _approve_to_the_end(lab, run_id)
        _check_approve_ran_once(lab, run_id, continuation)
        return {run_id: "completed", continuation: "completed"}
    final = FINAL[workflow]
    lab.wait_status(run_id, final)
    if workflow == "charge":
        assert lab.applied(run_id) == 1, "proven by read-back or adopted: applied once"
    last = {"pure": "b", "charge": "z", "note": "z"}.get(workflow)
    if last is not None:  # pure nodes may run again after a crash; never a third time
        assert lab.count(run_id, "a") <= 2 and 1 <= lab.count(run_id, last) <= 2
    return {run_id: final}


def _autonomous_server_crash(lab: Lab, point: str, workflow: str, **given: Any) -> None:
    """The server dies at `point` while a run goes its own way; the next server finishes."""
    armed = lab.start_server(point)
    start = lab.start_run(workflow, given)
    lab.expect_server_crash(armed)
    run_id = _run_of(lab, start)
    lab.start_server()
    lab.resend_lost()
    assert start.new_run == run_id, "a lost run.start adopts the run it made"
    expected = _settle(lab, run_id, workflow)
    lab.finish(expected, ambiguous=int(FINAL.get(workflow) == "ambiguous"))


def _autonomous_runner_crash(lab: Lab, point: str, workflow: str, **given: Any) -> None:
    """A runner dies at `point`; the server hands the run to the next runner."""
    armed = lab.start_server(point)
    run_id = lab.start_run(workflow, given).new_run
    if point == "runner.message.runner_ready.after_send":
        # Dead right after ready: the run made no progress, so it parks for review
        # (runnerNoProgress) instead of looping; an operator's resume goes on.
        lab.wait_reason(run_id, "runnerNoProgress")
        lab.command("run.resume", run_id=run_id)
    expected = _settle(lab, run_id, workflow)
    lab.expect_runner_crash(armed)
    lab.finish(expected, ambiguous=int(FINAL.get(workflow) == "ambiguous"))


AUTONOMOUS_SERVER: dict[str, tuple[str, dict[str, Any]]] = {
    "server.lifecycle.enqueue.after_commit": ("pure", {}),
    "server.lifecycle.ready.before_commit": ("pure", {}),
    "server.lifecycle.ready.after_commit": ("pure", {}),
    "server.lifecycle.node_start.before_commit": ("pure", {}),
    "server.lifecycle.node_start.after_commit": ("pure", {}),
    "server.lifecycle.node_finish.after_commit": ("charge", {}),
    "server.lifecycle.node_fail.before_commit": ("fails", {}),
    "server.lifecycle.node_fail.after_commit": ("fails", {}),
    "server.lifecycle.fail.before_commit": ("fails", {}),
    "server.lifecycle.fail.after_commit": ("fails", {}),
    "server.lifecycle.time_out.before_commit": ("late", {"block": "late"}),
    "server.lifecycle.time_out.after_commit": ("late", {"block": "late"}),
    "server.runner_message.runner_ready.after_commit": ("pure", {}),
    "server.runner_message.node_started.after_commit": ("pure", {}),
    "server.runner_message.node_finished.after_commit": ("pure", {}),
    "server.runner_message.node_failed.after_commit": ("fails", {}),
    "server.runner_message.effect_reserve.after_commit": ("charge", {}),
    "server.runner_message.effect_settle.after_commit": ("charge", {}),
    "server.runner_message.notification_requested.after_commit": ("note", {}),
    "server.runner_message.run_parked.after_commit": ("approve", {}),
    "server.runner_message.run_finished.after_commit": ("pure", {}),
    "server.runner_message.runner_progress.after_commit": ("build", {}),
}

AUTONOMOUS_RUNNER: dict[str, tuple[str, dict[str, Any]]] = {
    "runner.message.runner_ready.after_send": ("pure", {}),
    "runner.message.node_started.after_send": ("pure", {}),
    "runner.message.node_finished.after_send": ("pure", {}),
    "runner.message.node_failed.after_send": ("fails", {}),
    "runner.message.effect_reserve.after_send": ("charge", {}),
    "runner.message.effect_settle.after_send": ("charge", {"readBack": False}),
    "runner.message.notification_requested.after_send": ("note", {}),
    "runner.message.run_parked.after_send": ("approve", {}),
    "runner.message.run_finished.after_send": ("pure", {}),
    "runner.message.runner_progress.after_send": ("build", {}),
    "runner.effect.after_settle": ("charge", {"readBack": False}),
}


def _register_autonomous() -> None:
    for point, (workflow, given) in AUTONOMOUS_SERVER.items():
        scenario(point, workflow)(
            functools.partial(_autonomous_server_crash, point=point, workflow=workflow, **given)
        )
    for point, (workflow, given) in AUTONOMOUS_RUNNER.items():
        scenario(point, workflow)(
            functools.partial(_autonomous_runner_crash, point=point, workflow=workflow, **given)
        )


_register_autonomous()


def _wait_attempt(lab: Lab, run_id: str, node: str) -> None:
    """Wait until the node's attempt committed (a pipelined start is not confirmed)."""
    deadline = time.monotonic() + 30
    pause = threading.Event()
    while True:
        with lab.database() as db:
            found = _row(
                db,
                "SELECT COUNT(*) FROM node_attempts WHERE run_id = ? AND node_path = ?",
                run_id,
                node,
            )
        if found:
            return
        assert time.monotonic() < deadline, f"{node} of {run_id} never started"
        pause.wait(0.05)


def _blocked(lab: Lab, point: str) -> tuple[Server, str, int]:
    """A `pure` run blocked in its committed node a: (server, run, the runner's PID)."""
    armed = lab.start_server(point)
    run_id = lab.start_run("pure", {"block": "a"}).new_run
    runner_pid = lab.events.wait(run_id, "a")
    _wait_attempt(lab, run_id, "a")
    return armed, run_id, runner_pid


def _command_crash(lab: Lab, point: str, operation: str, final: str) -> None:
    """A command on a run blocked in a pure node dies at `point`; its retry settles it."""
    armed, run_id, _ = _blocked(lab, point)
    if operation == "run.resume":
        lab.command("run.pause", run_id=run_id)
        lab.wait_status(run_id, "paused")
    command = lab.command(operation, run_id=run_id)
    assert command.lost
    lab.expect_server_crash(armed)
    lab.start_server()
    lab.resend_lost()
    assert command.resent_outcome in ("accepted", "adopted")
    if operation == "run.pause":
        assert lab.get(run_id)["display"]["status"] == "paused"
        lab.command("run.resume", run_id=run_id)
    lab.wait_status(run_id, final)
    if final == "completed":
        assert lab.count(run_id, "b") == 1
    lab.finish({run_id: final})


for _point, _operation, _final in (
    ("server.lifecycle.pause.before_commit", "run.pause", "completed"),
    ("server.lifecycle.pause.after_commit", "run.pause", "completed"),
    ("server.lifecycle.pause.before_fence", "run.pause", "completed"),
    ("server.lifecycle.resume.before_commit", "run.resume", "completed"),
    ("server.lifecycle.resume.after_commit", "run.resume", "completed"),
    ("server.lifecycle.cancel.before_commit", "run.cancel", "cancelled"),
    ("server.lifecycle.cancel.after_commit", "run.cancel", "cancelled"),
):
    scenario(_point, "blocked-pure-node")(
        functools.partial(_command_crash, point=_point, operation=_operation, final=_final)
    )


def _ambiguous_charge(lab: Lab, point: str) -> tuple[Server, str]:
    """A charge without read-back interrupted by a pause: resumed, it parks ambiguous."""
    armed = lab.start_server(point)
    run_id = lab.start_run("charge", {"block": "charge", "readBack": False}).new_run
    lab.events.wait(run_id, "applying")
    lab.command("run.pause", run_id=run_id)
    lab.wait_status(run_id, "paused")
    lab.command("run.resume", run_id=run_id)
    return armed, run_id


def _park_crash(lab: Lab, point: str) -> None:
    armed, run_id = _ambiguous_charge(lab, point)
    lab.expect_server_crash(armed)
    lab.start_server()
    lab.wait_status(run_id, "ambiguous")
    assert lab.applied(run_id) == 1, "an uncertain effect without read-back never repeats"
    lab.finish({run_id: "ambiguous"}, ambiguous=1)


def _recover_crash(lab: Lab, point: str) -> None:
    armed, run_id = _ambiguous_charge(lab, point)
    lab.wait_recoverable(run_id)
    confirm = lab.command("run.recover", {"action": "confirm"}, run_id=run_id)
    assert confirm.lost
    lab.expect_server_crash(armed)
    lab.start_server()
    lab.resend_lost()
    lab.wait_status(run_id, "completed")
    assert lab.applied(run_id) == 1, "confirmed: the effect is not applied again"
    assert lab.count(run_id, "z") == 1
    lab.finish({run_id: "completed"})


for _point in ("server.lifecycle.park.before_commit", "server.lifecycle.park.after_commit"):
    scenario(_point, "ambiguous-effect")(functools.partial(_park_crash, point=_point))
for _point in ("server.lifecycle.recover.before_commit", "server.lifecycle.recover.after_commit"):
    scenario(_point, "confirm")(functools.partial(_recover_crash, point=_point))


def _requeue_crash(lab: Lab, point: str) -> None:
    """A runner SIGKILLed in a committed pure node: its run is requeued (the point)."""
    armed, run_id, runner_pid = _blocked(lab, point)
    os.killpg(runner_pid, signal.SIGKILL)
    lab.expect_server_crash(armed)
    lab.start_server()
    lab.wait_status(run_id, "completed")
    assert lab.count(run_id, "a") == 2, "the interrupted pure node ran again"
    assert lab.count(run_id, "b") == 1
    lab.finish({run_id: "completed"})


for _point in ("server.lifecycle.requeue.before_commit", "server.lifecycle.requeue.after_commit"):
    scenario(_point, "runner-killed")(functools.partial(_requeue_crash, point=_point))


SESSION = "pi-session-crash"


def _coordinate(lab: Lab, *, start_turn: bool) -> Watcher:
    """The origin session's coordinator: claim the epoch, report the branch with the
    step message on it (Pi busy), and, with `start_turn`, report the turn's start."""
    coordinator = Watcher(lab.state_dir / "host" / "host.sock")
    coordinator.subscribe({"kind": "sessionView", "sessionId": SESSION, "coordinator": True})
    with lab.database() as db:
        message = _row(db, "SELECT message_id FROM workflow_messages")
    branch = {
        "sessionId": SESSION,
        "entries": [{"messageId": message, "entryId": "entry-1"}],
        "isIdle": False,
        "hasPendingMessages": False,
    }
    assert coordinator.request("workflowMessage.reportBranch", branch)["outcome"] == "accepted"
    if start_turn:
        with lab.database() as db:
            run_id = _row(db, "SELECT run_id FROM runs")
        turn = {"sessionId": SESSION, "messageId": message, "turnId": "turn-1", "phase": "started"}
        answer = coordinator.request("workflowTurn.report", turn, runId=run_id)
        assert answer["receipt"]["ownership"] == "active", answer
    return coordinator


def _step_timeout_crash(lab: Lab, point: str) -> None:
    """The timer's transaction of an interactive step (no runner alive) is the point."""
    armed = lab.start_server(point)
    payload = {
        "workflow": "timedask",
        "input": {},
        "projectPath": str(lab.project),
        "originSessionId": SESSION,
    }
    run_id = lab.command("run.start", payload).new_run
    lab.wait_status(run_id, "waiting")
    coordinator = _coordinate(lab, start_turn=True)
    lab.expect_server_crash(armed)  # 1 s of turn later, in the control claim's commit
    coordinator.close()
    committed = point.endswith("after_commit")
    with lab.database() as db:
        request = _row(db, "SELECT status FROM interactive_requests")
        attempt = _row(db, "SELECT status FROM node_attempts")
        assert (request, attempt) == (
            ("cancelled", "timed_out") if committed else ("pending", "waiting")
        )
        # Committed: queued, or already claimed for its timeout-resume runner (the
        # scheduler may admit it before the process dies); recovery requeues that claim.
        assert _queue(db, run_id) in (("queued", "starting") if committed else ("parked",))
    lab.start_server()
    if not committed:
        # The step's time may not have run out by the dead server's last heartbeat: a
        # new coordinator reports the still-open turn, which runs what is left of it.
        coordinator = _coordinate(lab, start_turn=False)
    lab.wait_status(run_id, "timed_out")
    coordinator.close()
    with lab.database() as db:
        events = _row(db, "SELECT count(*) FROM events WHERE event_type = 'interaction_timed_out'")
        assert events == 1, "timed out once"
        assert db.execute("SELECT status FROM node_attempts").fetchall() == [("timed_out",)]
        assert _row(db, "SELECT reserved FROM run_bindings") == 0
    lab.finish({run_id: "timed_out"})


for _point in ("server.lifecycle.requeue.before_commit", "server.lifecycle.requeue.after_commit"):
    scenario(_point, "interactive-step-timeout")(
        functools.partial(_step_timeout_crash, point=_point)
    )


def _decision_timeout_crash(lab: Lab, point: str) -> None:
    """A protected decision's deadline (no runner alive): the control claim's transaction
    that records the default, closes the decision and queues the continuation is the
    point (the parent's completion is the first `complete` of this server)."""
    armed = lab.start_server(point)
    run_id = lab.start_run("decide").new_run
    lab.wait_status(run_id, "waiting")
    lab.expect_server_crash(armed)  # 1 s later, in the timeout's commit
    committed = point.endswith("after_commit")
    with lab.database() as db:
        resolution = db.execute(
            "SELECT outcome, provenance FROM human_decision_resolutions"
        ).fetchall()
        assert resolution == ([("accepted", "timeout")] if committed else [])
        assert _run(db, run_id)[0] == ("completed" if committed else "waiting")
        continued = _row(db, "SELECT COUNT(*) FROM runs WHERE continuation_of = ?", run_id)
        assert continued == int(committed), "the continuation commits with the default"
        assert _row(db, "SELECT COUNT(*) FROM leases WHERE resource = ?", run_id) == 0
    lab.start_server()  # recovery applies a passed deadline before anything else
    lab.wait_status(run_id, "completed")
    with lab.database() as db:
        (continuation,) = db.execute("SELECT run_id FROM runs WHERE continuation_of = ?", (run_id,))
        assert db.execute(
            "SELECT outcome, provenance FROM human_decision_resolutions"
        ).fetchall() == [("accepted", "timeout")], "the fence holds: one resolution"
    lab.wait_status(continuation[0], "completed")
    assert lab.count(continuation[0], "z") == 1, "the default's branch ran once"
    lab.finish({run_id: "completed", continuation[0]: "completed"})


for _point in ("server.lifecycle.complete.before_commit", "server.lifecycle.complete.after_commit"):
    scenario(_point, "decision-timeout")(functools.partial(_decision_timeout_crash, point=_point))


@scenario("runner.effect.after_read_back", "runner-killed-while-applying")
def _after_read_back(lab: Lab) -> None:
    armed = lab.start_server("runner.effect.after_read_back")
    run_id = lab.start_run("charge", {"block": "charge"}).new_run
    first_runner = lab.events.wait(run_id, "applying")
    os.killpg(first_runner, signal.SIGKILL)  # the first runner, inside its apply
    lab.wait_status(run_id, "completed")
    lab.expect_runner_crash(armed)  # the second runner read back, then died
    assert lab.applied(run_id) == 1, "the third runner's read-back proved it applied"
    lab.finish({run_id: "completed"})


@scenario("server.drain.started", "blocked-pure-node")
def _drain_started(lab: Lab) -> None:
    armed, run_id, _ = _blocked(lab, "server.drain.started")
    lab.call("server.stop")
    lab.expect_server_crash(armed)
    lab.start_server()
    lab.wait_status(run_id, "completed")
    assert lab.count(run_id, "b") == 1
    lab.finish({run_id: "completed"})


@scenario("server.drain.after_hand_back", "shell-finishes")
def _drain_hand_back(lab: Lab) -> None:
    armed = lab.start_server("server.drain.after_hand_back")
    run_id = lab.start_run("slowbuild").new_run
    lab.events.wait(run_id, "build")
    lab.call("server.stop")  # the running command may finish within the drain
    lab.expect_server_crash(armed)
    with lab.database() as db:  # the command's node finished; the run went back queued
        assert _queue(db, run_id) == "queued"
        assert _effect_states(db, run_id) == ["applied"]
    lab.start_server()
    lab.wait_status(run_id, "completed")
    assert lab.shell_runs(run_id) == 1, "the next server goes on from the step after"
    lab.finish({run_id: "completed"})


# --- Telegram deliveries: reservation, send, result -----------------------------------

_TG_TOKEN = "123456789:AAH-crash-token-abcdefghijklmnopqrstu"
_TG_CHAT = -1001234567890


def _telegram_profile(lab: Lab, fake: FakeTelegram) -> None:
    """`channels.json` with one profile that serves the `ask` workflow."""
    path = lab.state_dir.parent / "workflows" / "channels.json"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    profile = {
        "botToken": _TG_TOKEN,
        "chatId": _TG_CHAT,
        "allowedUserIds": [4242],
        "workflows": ["ask"],
        "apiBase": fake.api_base,
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"schema": "pi-workflows.channels.v1", "profiles": {"ops": profile}}, handle)


def _delivery(lab: Lab, run_id: str) -> tuple[str, list[str]] | None:
    """(the run's delivery state, its attempts' states in order)."""
    with lab.database() as db:
        state = _row(
            db,
            "SELECT m.delivery_state FROM channel_messages AS m JOIN human_decisions AS d "
            "ON d.decision_id = m.decision_id WHERE d.run_id = ?",
            run_id,
        )
        attempts = [
            str(a)
            for (a,) in db.execute(
                "SELECT a.state FROM effect_attempts AS a JOIN effects AS e "
                "ON e.effect_id = a.effect_id WHERE e.run_id = ? AND e.effect_type = "
                "'channel.deliver' ORDER BY a.attempt_number",
                (run_id,),
            )
        ]
    return None if state is None else (str(state), attempts)


def _wait_delivery(lab: Lab, run_id: str, want: Callable[[tuple[str, list[str]]], bool]) -> Any:
    deadline = time.monotonic() + 40
    pause = threading.Event()
    while not ((found := _delivery(lab, run_id)) is not None and want(found)):
        assert time.monotonic() < deadline, f"delivery of {run_id}: {found}"
        pause.wait(0.05)
    return found


def _crash_around_a_delivery(lab: Lab, point: str) -> None:
    """SIGKILL of the server at `point`: after the restart the delivery is ambiguous
    with a recover path; the operator's retry presents it, and nothing else is sent."""
    with FakeTelegram(token=_TG_TOKEN, chat_id=_TG_CHAT) as fake:
        _telegram_profile(lab, fake)
        armed = lab.start_server(point)
        run_id = lab.start_run("ask").new_run
        lab.expect_server_crash(armed)
        sent_before = len(fake.bot_messages())
        assert sent_before <= 1
        lab.start_server()
        _wait_delivery(lab, run_id, lambda found: found[0] == "ambiguous")
        view = lab.wait_status(run_id, "ambiguous")
        assert "channelRecoverRetry" in view["display"]["controls"], view["display"]
        assert len(fake.bot_messages()) == sent_before, "never sent again on its own"
        lab.call("channel.recover", {"action": "retry"}, run_id=run_id)
        _wait_delivery(lab, run_id, lambda found: found[0] == "presented")
        assert len(fake.bot_messages()) == sent_before + 1
        lab.wait_status(run_id, "waiting")
        lab.finish({run_id: "waiting"})


@scenario("server.channel.after_reserve", "telegram")
def _channel_after_reserve(lab: Lab) -> None:
    _crash_around_a_delivery(lab, "server.channel.after_reserve")


@scenario("server.channel.after_send", "telegram")
def _channel_after_send(lab: Lab) -> None:
    _crash_around_a_delivery(lab, "server.channel.after_send")


@scenario("server.channel.after_result", "rate-limited")
def _channel_after_a_429(lab: Lab) -> None:
    """Killed in a 429's wait: the stored retry time holds, the next server sends once."""
    with FakeTelegram(token=_TG_TOKEN, chat_id=_TG_CHAT) as fake:
        _telegram_profile(lab, fake)
        fake.rate_limit_next("sendMessage", 2)
        armed = lab.start_server("server.channel.after_result")
        run_id = lab.start_run("ask").new_run
        lab.expect_server_crash(armed)
        assert _delivery(lab, run_id) == ("pending", ["cancelled"])
        lab.start_server()
        limited, sent = fake.wait_for_calls("sendMessage", 2, 40)
        assert sent.at - limited.at >= 2.0, "sent again before the 429's retry_after"
        _wait_delivery(lab, run_id, lambda found: found == ("presented", ["cancelled", "applied"]))
        assert len(fake.bot_messages()) == 1
        lab.finish({run_id: "waiting"})


# --- state retention: a sweep's trees, blobs, WAL truncate and VACUUM ----------------------
# Sixteen trees 31 days old (each with its own ~20 KB output blob, so their deletion frees
# enough pages for VACUUM) and one recent run; the startup sweep reaches each point.

EXPIRED = 16


def _seed_lab(lab: Lab) -> None:
    seed_expired_trees(lab.state_dir, EXPIRED, now_ms=int(time.time() * 1000))
    lab.extra_env["PI_WORKFLOWS_RETENTION_VACUUM_MIN_BYTES"] = "0"  # VACUUM when 20 % free


def _swept(lab: Lab) -> dict[str, Any]:
    deadline = time.monotonic() + SETTLE_S
    while True:
        retention = lab.call("state.status")["retention"]
        if retention["lastSweep"] is not None:
            return dict(retention["lastSweep"])
        assert time.monotonic() < deadline, retention
        time.sleep(0.05)


def _sweep_crash(lab: Lab, point: str) -> None:
    _seed_lab(lab)
    armed = lab.start_server(point)
    lab.expect_server_crash(armed)
    with lab.database() as db:
        assert_whole_trees(db)
        left = {row[0] for row in db.execute("SELECT run_id FROM runs")}
    assert "recent" in left
    server = lab.start_server()
    last = _swept(lab)
    assert last["treesDeleted"] == len(left) - 1, "the next start finishes the job"
    with lab.database() as db:
        assert [row[0] for row in db.execute("SELECT run_id FROM runs")] == ["recent"]
        assert_whole_trees(db)
    assert run_files(lab.state_dir) == {"recent"}, "a dead server's leftover files go too"
    listed = lab.call("state.prune", {"olderThanDays": 30})
    assert (listed["treeCount"], listed["unnamedBlobs"]) == (0, 0), "no blob left behind"
    assert lab.call("state.verify")["consistent"]
    lab.stop_server(server)
    with lab.database() as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


@scenario("server.lifecycle.prune_tree.before_commit", "sweep-third-tree")
def _sweep_before_tree_commit(lab: Lab) -> None:
    _sweep_crash(lab, "server.lifecycle.prune_tree.before_commit@3")


@scenario("server.lifecycle.prune_tree.after_commit", "sweep-third-tree")
def _sweep_after_tree_commit(lab: Lab) -> None:
    _sweep_crash(lab, "server.lifecycle.prune_tree.after_commit@3")


@scenario("server.retention.before_blob_collection", "sweep")
def _sweep_before_blobs(lab: Lab) -> None:
    _sweep_crash(lab, "server.retention.before_blob_collection")


@scenario("server.retention.before_wal_truncate", "sweep")
def _sweep_before_wal_truncate(lab: Lab) -> None:
    _sweep_crash(lab, "server.retention.before_wal_truncate")


@scenario("server.retention.before_vacuum", "sweep")
def _sweep_before_vacuum(lab: Lab) -> None:
    _sweep_crash(lab, "server.retention.before_vacuum")


@scenario("server.retention.after_vacuum", "sweep")
def _sweep_after_vacuum(lab: Lab) -> None:
    _sweep_crash(lab, "server.retention.after_vacuum")


PRUNE_RUNS = 2_000
"""Runs for the interrupted manual prune, each with its own output blob (small: a
thousand deleted trees' blobs are what a second prune must find). The same scenario at
20,000 runs is `benchmarks/soak_prune_interrupted.py`."""


@scenario("server.lifecycle.prune_tree.after_commit", "manual-prune")
def _manual_prune_interrupted(lab: Lab) -> None:
    """`state prune --apply` over 2,000 expired runs whose server dies after half of the
    trees: the CLI says the server went away during the deletions; a second prune lists
    only what is left, and an applied one leaves no blob that no row names."""
    seed_expired_trees(lab.state_dir, PRUNE_RUNS, now_ms=int(time.time() * 1000), pad_chars=200)
    lab.extra_env["PI_WORKFLOWS_RETENTION_DAYS"] = "0"  # only the manual prune deletes
    armed = lab.start_server(f"server.lifecycle.prune_tree.after_commit@{PRUNE_RUNS // 2}")
    backup = lab.root / "before-prune.sqlite"
    argv = [*PIW, "--state-dir", str(lab.state_dir), "state", "prune", "--older-than", "30"]
    done = subprocess.run(
        [*argv, "--apply", "--backup", str(backup)],
        env=lab.env(),  # its retry may start a server: unarmed, tagged for the lab's cleanup
        capture_output=True,
        text=True,
        timeout=SETTLE_S,
        check=False,
    )
    lab.expect_server_crash(armed)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "went away during the deletions" in done.stderr
    assert "some trees may already be gone" in done.stderr
    with lab.database() as db:
        assert_whole_trees(db)
        left = sorted(
            row[0] for row in db.execute("SELECT run_id FROM runs WHERE run_id != 'recent'")
        )
    assert len(left) == PRUNE_RUNS - PRUNE_RUNS // 2
    listed = json.loads(
        subprocess.run(
            [*argv, "--json"], env=lab.env(), capture_output=True, text=True, timeout=SETTLE_S,
            check=True,
        ).stdout
    )  # fmt: skip
    # The dry run names the first 1,000 runs and counts them all.
    assert listed["runCount"] == len(left), "the second prune lists only what is left"
    assert set(listed["runIds"]) <= set(left) and listed["runIds"]
    again = lab.call(
        "state.prune",
        {"olderThanDays": 30, "apply": True, "backupPath": str(lab.root / "second.sqlite")},
        idempotency_key=f"second-{lab.tag}",
    )
    assert again["treeCount"] == len(left) and again["blobsDeleted"] > 0
    after = lab.call("state.prune", {"olderThanDays": 30})
    assert (after["treeCount"], after["unnamedBlobs"]) == (0, 0), "no unnamed blob remains"
    assert lab.call("state.verify")["consistent"]
    lab.call("server.stop")
    lab.assert_gone(lab.lab_processes(), "the server the retry started")


# --- server.backup.*: a verified backup, before and after it has its name ---------------


@dataclass
class _CrashedBackup:
    run_id: str
    dest: Path
    key: str
    left: list[str]
    """What the crash left in the destination's folder."""


def _backup_crash(lab: Lab, point: str) -> _CrashedBackup:
    """A completed run, then `state.backup` into an armed server that dies at `point`."""
    armed = lab.start_server(f"{point}@1")
    run_id = lab.start_run("pure").new_run
    lab.wait_status(run_id, "completed")
    dest = lab.root / "backups" / "state.sqlite"
    dest.parent.mkdir()
    key = f"backup-{lab.tag}"
    with pytest.raises(HostUnavailableError):
        lab.client().request("state.backup", {"path": str(dest)}, idempotency_key=key)
    lab.expect_server_crash(armed)
    with lab.database() as db:
        stored = _row(db, "SELECT COUNT(*) FROM host_commands WHERE idempotency_key = ?", key)
    assert stored == 0, "no receipt before the backup is verified and named"
    return _CrashedBackup(run_id, dest, key, sorted(p.name for p in dest.parent.iterdir()))


def _backup_again(lab: Lab, crashed: _CrashedBackup) -> dict[str, Any]:
    lab.start_server()
    payload = {"path": str(crashed.dest)}
    return dict(lab.client().request("state.backup", payload, idempotency_key=crashed.key))


def _backup_before_its_name(lab: Lab, point: str) -> None:
    crashed = _backup_crash(lab, point)
    assert crashed.dest.name not in crashed.left, "nothing unverified under the new name"
    assert all(name.endswith(".partial") for name in crashed.left), crashed.left
    answer = _backup_again(lab, crashed)  # no receipt: the retry backs up, once
    assert answer["outcome"] == "accepted", answer
    assert answer["receipt"]["byteCount"] == crashed.dest.stat().st_size
    assert verify_inactive_backup(crashed.dest, lab.state_dir) == []
    with lab.database() as db:
        assert _row(db, "SELECT COUNT(*) FROM runs WHERE run_id = ?", crashed.run_id) == 1
    lab.finish({crashed.run_id: "completed"})


@scenario("server.backup.copy", "state-backup")
def _backup_during_copy(lab: Lab) -> None:
    _backup_before_its_name(lab, "server.backup.copy")


@scenario("server.backup.verify", "state-backup")
def _backup_before_verify(lab: Lab) -> None:
    _backup_before_its_name(lab, "server.backup.verify")


@scenario("server.backup.linked", "state-backup")
def _backup_after_link(lab: Lab) -> None:
    crashed = _backup_crash(lab, "server.backup.linked")
    assert crashed.dest.name in crashed.left, crashed.left
    assert verify_inactive_backup(crashed.dest, lab.state_dir) == [], "verified before named"
    answer = _backup_again(lab, crashed)  # no receipt says it is good: refused, not adopted
    assert answer["outcome"] == "rejected" and answer["error"]["code"] == "backupExists"
    assert verify_inactive_backup(crashed.dest, lab.state_dir) == []
    lab.finish({crashed.run_id: "completed"})


# --- a resource manager's reconcile pass ------------------------------------------------
# One resource of a manager that counts every run of its code and settles. Whatever dies
# (the server around a claim or a result commit, the resource runner after loading or
# before proposing), the next pass settles it once: one `settled` pass in its history,
# no claim left, and `state verify` clean. Manager code may run again; a committed
# result never commits twice.

TALLY = """
import os
from pi_workflows.resource_managers import condition_true, define_resource_manager

def reconcile(ctx):
    with open(__COUNTS__, "a") as f:
        f.write("pass\\n")
    return ctx.settled(status={"done": True}, conditions=[condition_true("Ready", "Done")])

resource_manager = define_resource_manager(
    name="tally", initial_status=lambda spec: {}, reconcile=reconcile
)
"""


def _tally_passes(lab: Lab) -> int:
    counts = lab.root / "counts" / "reconcile"
    return len(counts.read_text().splitlines()) if counts.exists() else 0


def _apply_tally(lab: Lab) -> Command:
    folder = lab.project / ".pi" / "resource-managers"
    folder.mkdir(parents=True, exist_ok=True)
    counts = repr(str(lab.root / "counts" / "reconcile"))
    (folder / "tally.resource_manager.py").write_text(TALLY.replace("__COUNTS__", counts))
    payload = {"manager": "tally", "key": "k", "spec": {"n": 1}, "projectPath": str(lab.project)}
    return lab.command("resourceManager.apply", payload)


def _tally_view(lab: Lab) -> dict[str, Any]:
    payload = {"manager": "tally", "key": "k", "projectPath": str(lab.project)}
    return dict(lab.call("resourceManager.get", payload))


def _wait_settled(lab: Lab) -> dict[str, Any]:
    deadline = time.monotonic() + SETTLE_S
    pause = threading.Event()
    while True:
        view = _tally_view(lab)
        if any(p["outcome"] == "settled" for p in view["recentPasses"]):
            return view
        assert time.monotonic() < deadline, view
        pause.wait(0.05)


def _check_settled_once(lab: Lab) -> list[tuple[str, str | None]]:
    """The resource settled by exactly one committed pass; returns its passes, oldest first."""
    view = _wait_settled(lab)
    passes = [(p["outcome"], p["errorClass"]) for p in reversed(view["recentPasses"])]
    assert passes.count(("settled", None)) == 1, passes
    resource = view["resource"]
    assert resource["status"] == {"done": True}
    assert resource["observedGeneration"] == resource["generation"] == 1
    assert view["queue"] is None, "settled: nothing is due"
    with lab.database() as db:
        assert _row(db, "SELECT COUNT(*) FROM resource_claims") == 0
    return passes


def _reconcile_server_crash(lab: Lab, point: str) -> tuple[int, int]:
    """Apply, die at `point`; returns (passes of manager code at the crash, after)."""
    armed = lab.start_server(point)
    _apply_tally(lab)
    lab.expect_server_crash(armed)
    at_crash = _tally_passes(lab)
    with lab.database() as db:  # a reader of what the crash left
        claims = _row(db, "SELECT COUNT(*) FROM resource_claims")
        settled = _row(db, "SELECT COUNT(*) FROM reconcile_history WHERE outcome = 'settled'")
    committed = point.startswith("server.lifecycle.reconcile_commit.after")
    assert settled == (1 if committed else 0)
    assert claims == (1 if point.endswith("claim.after_commit") or "commit.before" in point else 0)
    lab.start_server()
    lab.resend_lost()  # an apply whose answer the crash swallowed adopts its receipt
    _check_settled_once(lab)
    after = _tally_passes(lab)
    lab.finish({})
    return at_crash, after


@scenario("server.lifecycle.reconcile_claim.before_commit", "apply")
def _reconcile_claim_before_commit(lab: Lab) -> None:
    at_crash, after = _reconcile_server_crash(lab, "server.lifecycle.reconcile_claim.before_commit")
    assert (at_crash, after) == (0, 1), "no pass started; the next server's pass runs once"


@scenario("server.lifecycle.reconcile_claim.after_commit", "apply")
def _reconcile_claim_after_commit(lab: Lab) -> None:
    at_crash, after = _reconcile_server_crash(lab, "server.lifecycle.reconcile_claim.after_commit")
    assert (at_crash, after) == (0, 1), "recovery step 7 returned the claim; one pass ran"


@scenario("server.lifecycle.reconcile_commit.before_commit", "settled")
def _reconcile_commit_before_commit(lab: Lab) -> None:
    at_crash, after = _reconcile_server_crash(
        lab, "server.lifecycle.reconcile_commit.before_commit"
    )
    assert (at_crash, after) == (1, 2), "the lost result's pass runs again, once"


@scenario("server.lifecycle.reconcile_commit.after_commit", "settled")
def _reconcile_commit_after_commit(lab: Lab) -> None:
    at_crash, after = _reconcile_server_crash(lab, "server.lifecycle.reconcile_commit.after_commit")
    assert (at_crash, after) == (1, 1), "a committed result is never reconciled again"


def _reconcile_runner_crash(lab: Lab, point: str) -> list[tuple[str, str | None]]:
    armed = lab.start_server(point)
    _apply_tally(lab)
    deadline = time.monotonic() + SETTLE_S
    pause = threading.Event()
    while armed.marker is not None and not armed.marker.exists():
        assert time.monotonic() < deadline, f"{point} was never reached"
        pause.wait(0.05)
    passes = _check_settled_once(lab)
    assert armed.alive(), "a resource runner point must not kill the server"
    assert passes == [("error", "runnerExited"), ("settled", None)], passes
    lab.finish({})
    return passes


@scenario("runner.reconcile.after_load", "apply")
def _reconcile_runner_after_load(lab: Lab) -> None:
    _reconcile_runner_crash(lab, "runner.reconcile.after_load")
    assert _tally_passes(lab) == 1, "the dead child ran no manager code"


@scenario("runner.reconcile.before_result", "apply")
def _reconcile_runner_before_result(lab: Lab) -> None:
    _reconcile_runner_crash(lab, "runner.reconcile.before_result")
    assert _tally_passes(lab) == 2, "the pass without an outcome ran again, once"


# --- the matrix -------------------------------------------------------------------------


def _cases() -> list[Any]:
    cases = []
    for point, variants in SCENARIOS.items():
        for variant, function in variants.items():
            reason = XFAIL.get((point, variant))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            cases.append(pytest.param(function, id=f"{point}-{variant}", marks=marks))
    return cases


@pytest.mark.timeout(60)
@pytest.mark.parametrize("run_scenario", _cases())
def test_crash_point(lab: Lab, run_scenario: Scenario, request: pytest.FixtureRequest) -> None:
    if isinstance(run_scenario, NeedsPi):
        request.getfixturevalue("pi_slot")  # at most two real pi on the machine
        monkeypatch = request.getfixturevalue("monkeypatch")
        binary = request.getfixturevalue("pi_binary")
        monkeypatch.setenv("PI_WORKFLOWS_PI", str(binary))  # the lab's servers inherit it
        run_scenario.function(lab, RealPi(binary, request.getfixturevalue("provider")))
    else:
        run_scenario(lab)


@pytest.mark.timeout(10)
def test_every_declared_crash_point_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(CRASH_POINTS), (
        f"no scenario: {sorted(set(CRASH_POINTS) - set(SCENARIOS))}; "
        f"no such point: {sorted(set(SCENARIOS) - set(CRASH_POINTS))}"
    )
    assert all(SCENARIOS.values())


# --- How it must behave ------------------------------------------------------------------


def _next_renewal(lab: Lab, run_id: str, *, after: int) -> tuple[int, int]:
    """(heartbeat, expiry) of the run's lease once its heartbeat moved past `after`."""
    deadline = time.monotonic() + 10
    pause = threading.Event()
    while True:
        with lab.database() as db:  # a WAL reader: it never blocks the server
            lease = _row(
                db, "SELECT heartbeat_at, expires_at FROM leases WHERE resource = ?", run_id
            )
        if lease[0] > after:
            return int(lease[0]), int(lease[1])
        assert time.monotonic() < deadline, "the blocked run's claim was not renewed"
        pause.wait(0.1)


@pytest.mark.timeout(60)
def test_a_blocked_runner_cannot_stop_renewal_or_other_runs(lab: Lab) -> None:
    lab.start_server()
    spinning = lab.start_run("pure", {"spin": "a"}).new_run
    spinner = psutil.Process(lab.events.wait(spinning, "a"))
    spun_before = sum(spinner.cpu_times()[:2])
    with lab.database() as db:  # a WAL reader: it never blocks the server
        before = _row(
            db, "SELECT heartbeat_at, expires_at FROM leases WHERE resource = ?", spinning
        )
    other = lab.start_run("charge").new_run
    lab.wait_status(other, "completed")  # another run went from start to end meanwhile
    # The server answers beside the blocked runner (each call would time out if it
    # waited for it; how fast it answers on a loaded machine is not the point).
    for _ in range(10):
        status = lab.call("server.status")
    assert status["runs"]["running"] == 1 and status["expiredClaims"] == 0
    # The renewer keeps renewing the blocked run's claim although its runner writes
    # nothing: two timer renewals in a row, each moving the heartbeat and the expiry on.
    first = _next_renewal(lab, spinning, after=before[0])
    second = _next_renewal(lab, spinning, after=first[0])
    assert second[1] > first[1] > second[0]
    # It spun all along (its state at one instant, R or S, is the scheduler's business).
    assert sum(spinner.cpu_times()[:2]) > spun_before, "the runner kept spinning"
    spinner.send_signal(signal.SIGTERM)  # ignored
    assert spinner.is_running()
    spinner.kill()  # a crash after progress: requeued, and the pure node runs again
    lab.wait_status(spinning, "completed")
    assert lab.count(spinning, "a") == 2 and lab.count(spinning, "b") == 1
    assert lab.applied(other) == 1
    lab.finish({spinning: "completed", other: "completed"})


@pytest.mark.timeout(90)
def test_a_killed_server_brings_back_queued_running_paused_and_waiting_runs(lab: Lab) -> None:
    first = lab.start_server(max_workers=3)
    paused = lab.start_run("pure", {"block": "a"}).new_run
    lab.events.wait(paused, "a")
    lab.command("run.pause", run_id=paused)
    lab.wait_status(paused, "paused")
    waiting = lab.start_run("approve").new_run
    lab.wait_status(waiting, "waiting")
    computing = lab.start_run("pure", {"block": "a"}).new_run
    paying = lab.start_run("charge", {"block": "charge"}).new_run
    building = lab.start_run("build", {"block": "build"}).new_run
    lab.events.wait(computing, "a")
    lab.events.wait(paying, "applying")
    shell = psutil.Process(lab.events.wait(building, "build"))
    queued = lab.start_run("pure").new_run  # all three slots are busy
    assert lab.get(queued)["display"]["status"] == "queued"
    lab.kill_server(first)
    with lab.database() as db:
        assert live_generations(db) == {}
    lab.start_server(max_workers=3)
    lab.assert_gone([shell], "the registered shell command")
    for run_id, status in (
        (computing, "completed"),
        (paying, "completed"),
        (queued, "completed"),
        (building, "ambiguous"),
    ):
        lab.wait_status(run_id, status)
    for run_id, status in ((waiting, "waiting"), (paused, "paused")):
        view = lab.get(run_id)
        assert view["display"]["status"] == status and view["generation"] == 1, view
    assert lab.count(computing, "a") == 2, "the interrupted pure node ran again, once"
    assert lab.count(queued, "a") == 1
    assert lab.applied(paying) == 1, "read-back proved the interrupted effect"
    assert lab.shell_runs(building) == 1, "the interrupted shell command never reran"
    assert lab.count(paused, "a") == 1 and lab.count(building, "z") == 0
    lab.command("run.resume", run_id=paused)
    continuation = _approve_to_the_end(lab, waiting)
    lab.wait_status(paused, "completed")
    _check_approve_ran_once(lab, waiting, continuation)
    assert lab.count(paused, "a") == 2 and lab.count(paused, "b") == 1
    verified = subprocess.run(
        [*PIW, "--state-dir", str(lab.state_dir), "state", "verify", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=lab.env(),
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["consistent"] is True
    expected = {
        paused: "completed",
        waiting: "completed",
        continuation: "completed",
        computing: "completed",
        paying: "completed",
        queued: "completed",
        building: "ambiguous",
    }
    lab.finish(expected, ambiguous=1)


@pytest.mark.timeout(90)
def test_duplicate_commands_across_a_server_crash_return_stored_receipts(lab: Lab) -> None:
    first = lab.start_server()
    resumed = lab.start_run("pure", {"block": "a"}).new_run
    lab.events.wait(resumed, "a")
    lab.command("run.pause", run_id=resumed)
    # At once: the fenced runner has not exited yet, and must not lend its released claim.
    lab.command("run.resume", run_id=resumed)
    lab.wait_status(resumed, "completed")
    restarted = lab.command("run.restart", run_id=resumed).new_run  # same input: blocks in a
    lab.events.wait(restarted, "a")
    waiting = lab.start_run("approve").new_run
    lab.wait_status(waiting, "waiting")
    answer = lab.command("run.answer", {"answer": {"ok": True}}, run_id=waiting)
    cancelled = lab.start_run("pure", {"block": "a"}).new_run
    lab.events.wait(cancelled, "a")
    lab.command("run.cancel", run_id=cancelled)
    lab.kill_server(first)
    lab.start_server()
    lab.resend_acknowledged()  # every one adopted, with the receipt it got first
    conflict = lab.client().request(
        "run.answer", {"answer": {"ok": False}}, run_id=waiting, idempotency_key=answer.key
    )
    assert conflict["outcome"] == "conflict"
    assert conflict["error"]["code"] == "idempotencyConflict"
    for run_id in (restarted, answer.new_run):
        lab.wait_status(run_id, "completed")
    assert lab.count(resumed, "a") == lab.count(restarted, "a") == 2
    assert lab.count(cancelled, "a") == 1 and lab.count(cancelled, "b") == 0
    assert lab.applied(waiting) == 1
    lab.finish(
        {
            resumed: "completed",
            restarted: "completed",
            waiting: "completed",
            answer.new_run: "completed",
            cancelled: "cancelled",
        }
    )
    with lab.database() as db:
        rows = db.execute(
            "SELECT COUNT(*), COUNT(DISTINCT idempotency_key) FROM host_commands "
            "WHERE client_id = ?",
            (lab.client_id,),
        ).fetchone()
    assert rows == (len(lab.commands), len(lab.commands)), "one receipt per command"
