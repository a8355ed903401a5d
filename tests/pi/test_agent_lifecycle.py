"""No process outlives its agent step, whatever ends it (issue 12 items 3 and 7).

Each test runs a real server, runner and `pi --mode rpc` against the fake provider. The
model first runs `sleep A & setsid sleep B &` through pi's bash tool (the first is
re-parented when its bash exits, the second left pi's session); then pi is busy (a
stalled stream, or a long tool call) when the step is ended by `run cancel`, by the
node's `timeout=`, by `run pause` (then resumed and completed), or by a SIGKILL of the
runner (the run resumes on a new runner and a NEW pi child). After each, no process of
that tree is alive: pi, its tool processes and both sleeps. Each test has its own sleep
durations, unique to this test process too (a concurrent suite in another checkout, or
sleeps left by a killed one, never match), so it finds its own processes by command line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.testing import (
    FakeProvider,
    ScriptedTurn,
    Stall,
    bash_turn,
    workflow_submit_turn,
)
from tests.conftest import write_workflow
from tests.pi.agents import alive as _alive
from tests.pi.agents import attempt_of as _attempt_of
from tests.pi.agents import running_server
from tests.server.runs import TERMINAL, start_run, wait_for, wait_until
from tests.server.test_interaction_submit import pending_request, submit

pytestmark = pytest.mark.timeout(180)

AGENT = """
from pi_workflows import agent, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={{
        "ask": agent(
            prompt="Summarise the work",
            output_schema={{"type": "object", "properties": {{"summary": {{"type": "string"}}}},
                           "required": ["summary"]}},
            tools=["bash"],
            provider="fake",
            model="fake-model",
            timeout={timeout},
        ),
    }},
    edges=[],
)
"""

GONE_TIMEOUT_S = 60.0
"""How long the tree gets to disappear (a runner's SIGTERM grace is 10 s; loaded cores)."""


def _cmdline(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(process.cmdline())
    return ""


def _by_cmdline(commands: Sequence[str]) -> list[psutil.Process]:
    return [
        p for p in psutil.process_iter(["cmdline"]) if " ".join(p.info["cmdline"] or []) in commands
    ]


def _pis_of(project: Path) -> list[psutil.Process]:
    """The pi children serving `project`: children of its runner (`piw-runner`, cwd the
    project), pi's keeper, and pi below it (pi retitles itself)."""
    found = []
    for process in psutil.process_iter(["name", "cwd"]):
        if process.info["name"] != "piw-runner" or process.info["cwd"] != str(project):
            continue
        with contextlib.suppress(psutil.Error):
            for child in process.children():
                if "_pi_keeper" in _cmdline(child):
                    found.append(child)
                    found += [c for c in child.children() if _cmdline(c).startswith("pi")]
    return found


@dataclass
class Tree:
    """What the test saw of one pi child's tree while it ran."""

    project: Path
    sleeps: tuple[str, ...]
    pi: list[psutil.Process] = field(default_factory=list)
    members: list[tuple[psutil.Process, str]] = field(default_factory=list)
    runner: psutil.Process | None = None

    def note(self) -> None:
        """Record pi, everything below it, the sleeps (wherever they are), pi's runner."""
        for pi in _pis_of(self.project):
            if pi.pid not in {p.pid for p in self.pi}:
                self.pi.append(pi)
            self.members.append((pi, _cmdline(pi)))
            with contextlib.suppress(psutil.Error):
                self.members.extend((c, _cmdline(c)) for c in pi.children(recursive=True))
                if "_pi_keeper" in _cmdline(pi):
                    self.runner = pi.parent()
        self.members.extend((p, _cmdline(p)) for p in _by_cmdline(self.sleeps))

    def commands(self) -> list[str]:
        return [cmdline for _, cmdline in self.members]

    def left(self) -> list[str]:
        alive = [p for p, _ in self.members if _alive(p)]
        alive += [p for p in _by_cmdline(self.sleeps) if _alive(p)]
        return sorted({f"{p.pid}:{_cmdline(p)}" for p in alive})

    def wait_gone(self, timeout: float = GONE_TIMEOUT_S) -> None:
        """Wait (with a deadline) until no process of the tree is alive."""
        deadline = time.monotonic() + timeout
        while True:
            alive = [p for p, _ in self.members if _alive(p)]
            alive += [p for p in _by_cmdline(self.sleeps) if _alive(p)]
            if not alive:
                return
            left = deadline - time.monotonic()
            assert left > 0, f"processes of pi's tree outlived the step: {self.left()}"
            psutil.wait_procs(alive, timeout=min(0.25, left))


_UNIQUE = 1_000_000 * (1 + os.getpid() % 4_000_000)
"""Added to every sleep duration: this process's own command lines (a sleep that long
is as good as forever)."""


def _sleep(seconds: int) -> str:
    return f"sleep {_UNIQUE + seconds}"


def _sleeps(base: int) -> tuple[str, str]:
    return (_sleep(base), _sleep(base + 1))


def _background_turn(tree: Tree) -> Any:
    """Turn 1: the model starts `sleep A & setsid sleep B &` through the bash tool."""
    first, second = tree.sleeps[:2]
    return lambda body: bash_turn(
        f"{first} >/dev/null 2>&1 & setsid {second} >/dev/null 2>&1 & echo {_attempt_of(body)}"
    )


def _noting(tree: Tree, then: ScriptedTurn, seen: list[str] | None = None) -> Any:
    """A turn that first records the tree (the sleeps run by now), then answers `then`."""

    def turn(body: Mapping[str, Any]) -> ScriptedTurn:
        tree.note()
        if seen is not None:
            seen.append(_attempt_of(body))
        return then

    return turn


def _submit(tree: Tree | None, attempts: list[str]) -> Any:
    def turn(body: Mapping[str, Any]) -> ScriptedTurn:
        if tree is not None:
            tree.note()
        attempt = _attempt_of(body)
        attempts.append(attempt)
        return workflow_submit_turn("ask", attempt, {"summary": "done"})

    return turn


def _wait_until_seen(tree: Tree, provider: FakeProvider, requests: int) -> None:
    provider.wait_for_requests(requests, timeout=90)
    ran = {c for c in tree.commands() if c in tree.sleeps[:2]}
    assert ran == set(tree.sleeps[:2]), f"both sleeps ran: {tree.commands()}"
    assert tree.pi, "pi was seen running"


def _attempts(state_dir: Path, run_id: str) -> list[tuple[str, str, str | None, str | None]]:
    """(attempt ID, status, output, error) of the `ask` attempts, in start order."""
    (database,) = Path(state_dir).rglob("*.sqlite")
    with contextlib.closing(sqlite3.connect(database)) as conn:
        rows = conn.execute(
            "SELECT a.attempt_id, a.status, b.content, a.error FROM node_attempts a"
            " LEFT JOIN blobs b ON b.digest = a.output_hash"
            " WHERE a.run_id = ? AND a.node_path = 'ask' ORDER BY a.rowid",
            (run_id,),
        ).fetchall()
    return [
        (attempt, status, out if out is None or isinstance(out, str) else out.decode(), error)
        for attempt, status, out, error in rows
    ]


def _logs(state_dir: Path) -> list[str]:
    return [log.read_text()[-1500:] for log in Path(state_dir).rglob("pi.stderr.log")]


@pytest.fixture(params=["zygote", "cold"])
def server(
    request: pytest.FixtureRequest,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    pi_binary: Path,
    provider: FakeProvider,
    pi_slot: None,
) -> Iterator[WorkflowServer]:
    """A server whose runners are forked by the zygote, or (`cold`) plain children of
    the server: then no subreaper above the runner adopts what it leaves behind."""
    if request.param == "cold":
        monkeypatch.setenv("PI_WORKFLOWS_ZYGOTE", "0")
    # The server's agent folder (the state dir's parent) is the one its pi children get.
    provider.write_agent_dir(state_dir.parent)
    monkeypatch.setenv("PI_WORKFLOWS_PI", str(pi_binary))
    with running_server(state_dir) as instance:
        yield instance


def _project(short_tmp: Path, timeout: float = 120) -> Path:
    project = short_tmp / "project"
    write_workflow(project, "ask", AGENT.format(timeout=timeout))
    return project


def test_cancel_while_pi_streams_stops_pi_and_every_tool_process(
    server: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    project = _project(short_tmp)
    tree = Tree(project, _sleeps(3101))
    provider.script(_background_turn(tree), _noting(tree, Stall("thinking")))
    with WorkflowClient(server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        _wait_until_seen(tree, provider, 2)
        client.call("run.cancel", run_id=run_id)
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        tree.wait_gone()
    assert view["display"]["status"] == "cancelled", (view, _logs(server.state_dir))
    attempts = _attempts(server.state_dir, run_id)
    assert [output for _, _, output, _ in attempts] == [None], attempts


def test_a_node_timeout_while_pi_runs_a_tool_stops_the_tree_and_times_the_step_out(
    server: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    # Long enough for pi to start and run both turns on loaded cores; the second
    # turn's tool call outlasts it by far.
    project = _project(short_tmp, timeout=20)
    tree = Tree(project, (*_sleeps(3201), _sleep(3299)))
    provider.script(_background_turn(tree), _noting(tree, bash_turn(tree.sleeps[2])))
    with WorkflowClient(server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        _wait_until_seen(tree, provider, 2)
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        tree.wait_gone()
    assert view["display"]["status"] == "timed_out", (view, _logs(server.state_dir))
    attempts = _attempts(server.state_dir, run_id)
    assert [(status, output) for _, status, output, _ in attempts] == [("timed_out", None)], (
        attempts
    )


def test_pause_while_pi_streams_stops_the_tree_writes_no_result_and_resume_completes(
    server: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    project = _project(short_tmp)
    tree = Tree(project, _sleeps(3301))
    streaming: list[str] = []
    provider.script(_background_turn(tree), _noting(tree, Stall("thinking"), streaming))
    with WorkflowClient(server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        _wait_until_seen(tree, provider, 2)
        client.call("run.pause", run_id=run_id)
        wait_until(client, run_id, lambda item: item["display"]["status"] == "paused")
        tree.wait_gone()
        # The fenced runner wrote nothing for the step it was in: no result, no failure.
        (paused,) = _attempts(server.state_dir, run_id)
        assert paused[0] == streaming[0] and paused[2] is None, paused
        assert paused[1] not in ("completed", "failed", "timed_out"), paused
        submitted: list[str] = []
        resumed = Tree(project, tree.sleeps)
        provider.script(_submit(resumed, submitted))
        client.call("run.resume", run_id=run_id)
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        resumed.wait_gone()
    assert view["display"]["status"] == "completed", (view, _logs(server.state_dir))
    assert {p.pid for p in resumed.pi} - {p.pid for p in tree.pi}, "a new pi child ran it"
    attempts = _attempts(server.state_dir, run_id)
    assert [a for a in attempts if a[1] == "completed"] == [
        (submitted[0], "completed", json.dumps({"summary": "done"}, separators=(",", ":")), None)
    ], attempts
    assert submitted[0] != streaming[0], "the step was presented again, as a new attempt"


def test_a_sigkilled_runner_leaves_no_process_and_a_new_pi_child_completes_the_step(
    server: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    project = _project(short_tmp)
    tree = Tree(project, _sleeps(3401))
    streaming: list[str] = []
    resumed = Tree(project, tree.sleeps)
    submitted: list[str] = []
    provider.script(
        _background_turn(tree),
        _noting(tree, Stall("thinking"), streaming),
        _submit(resumed, submitted),
    )
    with WorkflowClient(server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        _wait_until_seen(tree, provider, 2)
        runner = tree.runner
        assert runner is not None and runner.name() == "piw-runner", runner
        os.kill(runner.pid, signal.SIGKILL)  # the runner only: pi is in a group of its own
        tree.members.append((runner, "piw-runner"))
        tree.wait_gone()
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        resumed.wait_gone()
    assert view["display"]["status"] == "completed", (view, _logs(server.state_dir))
    assert {p.pid for p in resumed.pi} - {p.pid for p in tree.pi}, (
        "the resumed run presented the step to a new pi child"
    )
    attempts = _attempts(server.state_dir, run_id)
    completed = [a for a in attempts if a[1] == "completed"]
    assert [a[0] for a in completed] == submitted, attempts
    assert streaming[0] not in submitted, attempts


def test_an_output_accepted_before_the_runner_was_lost_is_adopted_without_a_new_pi_child(
    server: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    # While pi streams, the step's output is submitted and accepted (sent here as the
    # bridge sends it, through the live server and its validation child); the runner,
    # which has not seen the acceptance, is then SIGKILLed before any node result. The
    # next runner adopts that output: no pi child starts and nothing is asked twice.
    project = _project(short_tmp)
    tree = Tree(project, _sleeps(3501))
    streaming: list[str] = []
    provider.script(_background_turn(tree), _noting(tree, Stall("thinking"), streaming))
    state_dir = server.state_dir
    with WorkflowClient(state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        _wait_until_seen(tree, provider, 2)
        request_id = pending_request(state_dir, run_id)
        answer = submit(client, run_id, request_id, {"summary": "accepted before the loss"}, "k1")
        assert answer["outcome"] == "accepted", answer
        logs_before = sorted(Path(state_dir).rglob("pi.stderr.log"))
        requests_before = len(provider.chat_requests())
        runner = tree.runner
        assert runner is not None and runner.name() == "piw-runner", runner
        os.kill(runner.pid, signal.SIGKILL)  # the runner only: pi is in a group of its own
        tree.members.append((runner, "piw-runner"))
        tree.wait_gone()
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
    assert view["display"]["status"] == "completed", (view, _logs(state_dir))
    assert len(provider.chat_requests()) == requests_before, "no model was asked again"
    assert sorted(Path(state_dir).rglob("pi.stderr.log")) == logs_before, "no new pi child"
    attempts = _attempts(state_dir, run_id)
    completed = [a for a in attempts if a[1] == "completed"]
    assert [json.loads(a[2] or "null") for a in completed] == [
        {"summary": "accepted before the loss"}
    ], attempts
    assert completed[0][0] != streaming[0], "a new attempt adopted it"


@pytest.fixture
def pi_env(
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    pi_binary: Path,
    provider: FakeProvider,
    pi_slot: None,
) -> Path:
    provider.write_agent_dir(state_dir.parent)
    monkeypatch.setenv("PI_WORKFLOWS_PI", str(pi_binary))
    return state_dir


def test_a_server_stop_while_pi_streams_hands_the_step_back_and_the_next_server_completes_it(
    pi_env: Path, provider: FakeProvider, short_tmp: Path
) -> None:
    # "A pause or stop during a step strands the run": a graceful stop drains, stops pi's
    # tree, and hands the run back; the next server presents the step to a new pi child.
    project = _project(short_tmp)
    tree = Tree(project, _sleeps(3601))
    provider.script(_background_turn(tree), _noting(tree, Stall("thinking")))
    first = WorkflowServer(pi_env, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    first.start()
    try:
        with WorkflowClient(pi_env, autostart=False) as client:
            run_id = start_run(client, project, "ask")
            _wait_until_seen(tree, provider, 2)
    finally:
        first.stop("a graceful stop")
    tree.wait_gone()
    resumed = Tree(project, tree.sleeps)
    submitted: list[str] = []
    provider.script(_submit(resumed, submitted))
    second = WorkflowServer(pi_env, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    second.start()
    try:
        with WorkflowClient(pi_env, autostart=False) as client:
            view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
    finally:
        second.stop("test teardown")
    resumed.wait_gone()
    assert view["display"]["status"] == "completed", (view, _logs(pi_env))
    assert {p.pid for p in resumed.pi} - {p.pid for p in tree.pi}, "a new pi child ran it"
    completed = [a for a in _attempts(pi_env, run_id) if a[1] == "completed"]
    assert [a[0] for a in completed] == submitted
