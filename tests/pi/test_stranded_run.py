"""No stranded run (issue 24, item 1), with the real `pi` in its terminal UI (tmux).

A person types `/new` and `/workflow start digest`; the run's first node computes, and
Pi is SIGKILLed meanwhile. Pi saves a session only once it holds a model reply, so
before this issue the new session was lost and the run waited forever for it. Now the
extension saves the session before the run is accepted, and the start notice prints the
command that reopens it. The test runs exactly that command: the reopened Pi presents
the agent step once, the (fake) model submits, and the run completes. The same holds
when the workflow server is SIGKILLed too and started again.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient
from pi_workflows.testing import FakeProvider, ScriptedTurn, text_turn, workflow_submit_turn
from tests.conftest import Processes, write_workflow
from tests.pi.agents import running_server
from tests.pi.origin_pi import wait_until
from tests.pi.tmux_pi import TmuxPi, use_fake_model

pytestmark = pytest.mark.timeout(300)

DIGEST = """
import time
from pathlib import Path

from pi_workflows import agent, compute, define_workflow


def gather(ctx):
    gate = Path(ctx.input["gate"])
    (gate.parent / "gathering").touch()  # the test kills Pi while this node runs
    while not gate.exists():
        time.sleep(0.02)
    return {"items": 3}


workflow = define_workflow(
    name="digest",
    start_at="gather",
    nodes={
        "gather": compute(gather),
        "summarise": agent(
            prompt=lambda ctx: f"Summarise the {ctx.outputs['gather']['items']} items",
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            timeout=600,
        ),
    },
    edges=[{"from": "gather", "to": "summarise"}],
)
"""
PROMPT = "Summarise the 3 items"
ATTEMPT = re.compile(r"step: summarise, attempt: (attempt-[0-9a-f]+)\)")
STARTED = re.compile(r"Started workflow digest: (run-[0-9a-f]+)")
REOPEN = re.compile(r"If Pi exits, reopen this session with: (pi --session \S+)")


def submit(body: Mapping[str, Any]) -> ScriptedTurn:
    found = ATTEMPT.search(json.dumps(body.get("messages")))
    assert found is not None, "the step prompt carries its contract"
    return workflow_submit_turn("summarise", found.group(1), {"summary": "three items"})


class Rig:
    """The agent dir (fake provider, installed extension), project, gate and server."""

    def __init__(self, root: Path, provider: FakeProvider, pi: TmuxPi) -> None:
        self.root, self.provider, self.pi = root, provider, pi
        self.gate = root / "gate" / "open"
        self.gate.parent.mkdir()

    @property
    def state_dir(self) -> Path:
        return self.pi.agent_dir / "workflows"

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(f"file:{self.state_dir / 'state.sqlite'}?mode=ro", uri=True)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def status(self, run_id: str) -> str:
        with WorkflowClient(self.state_dir, autostart=False, timeout=30) as client:
            view = client.call("run.get", run_id=run_id)["receipt"]
        return str(view["display"]["status"])

    def start_in_a_new_session(self) -> tuple[str, list[str], Any]:
        """`/new`, then `/workflow start digest`: the run, the reopen command, pi."""
        pi = self.pi.launch()
        self.pi.type("/new")
        self.pi.find(r"New session started", "the new session")
        self.pi.type(f'/workflow start digest {{"gate": "{self.gate}"}}')
        run_id = self.pi.find(STARTED.pattern, "the start notice").group(1)
        command = self.pi.find(REOPEN.pattern, "the command that reopens the session").group(1)
        argv = shlex.split(command)
        session_file = Path(argv[-1])
        assert session_file.is_file(), "the origin session is on disk before Pi dies"
        wait_until((self.gate.parent / "gathering").exists, "the compute node")
        return run_id, argv, pi

    def reopen_and_complete(self, run_id: str, argv: list[str]) -> None:
        """Run the printed command; the step is presented once and the run completes."""
        assert argv[0] == "pi"
        self.provider.script(submit, text_turn("Done: three items."))
        self.pi.launch(argv[1:])
        wait_until(lambda: self.status(run_id) == "completed", "the run to complete", 120)
        messages = self.rows(
            "SELECT kind, reason, state FROM workflow_messages WHERE run_id = ? "
            "ORDER BY session_order",
            run_id,
        )
        assert messages[0] == ("step", "initial", "sent"), messages
        assert [m for m in messages if m[0] == "step"] == [messages[0]], "presented once"
        asked = [r for r in self.provider.chat_requests() if PROMPT in json.dumps(r.body)]
        assert len(asked) >= 1
        first = json.dumps(asked[0].body.get("messages"))
        assert first.count(PROMPT) == 1, "the model got the step once"


@pytest.fixture
def rig(pi_binary: Path, provider: FakeProvider, pi_slot: None, short_tmp: Path) -> Iterator[Rig]:
    agent_dir = short_tmp / "agent"
    provider.write_agent_dir(agent_dir)
    use_fake_model(agent_dir)
    provider.script()  # nothing may reach the model before the reopened Pi
    env = dict(os.environ, PI_CODING_AGENT_DIR=str(agent_dir))
    installed = subprocess.run(
        [sys.executable, "-m", "pi_workflows.cli", "pi-extension", "install"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    project = short_tmp / "project"
    write_workflow(project, "digest", DIGEST)
    pi = TmuxPi(short_tmp, pi_binary, agent_dir, project)
    try:
        yield Rig(short_tmp, provider, pi)
    finally:
        pi.close()


def test_pi_killed_during_a_compute_node_reopens_its_saved_session_and_the_run_completes(
    rig: Rig,
) -> None:
    with running_server(rig.state_dir):
        run_id, argv, pi = rig.start_in_a_new_session()
        [(origin,)] = rig.rows(
            "SELECT origin_session_id FROM run_bindings WHERE run_id = ?", run_id
        )
        header = json.loads(Path(argv[-1]).read_text().splitlines()[0])
        assert header["id"] == origin, "the file named holds the run's origin session"
        rig.pi.kill(pi)
        rig.gate.touch()
        wait_until(lambda: rig.status(run_id) == "waiting", "the run to wait at its step")
        assert rig.rows("SELECT state FROM workflow_messages WHERE run_id = ?", run_id) == [
            ("pending",)
        ], "no Pi has the step yet"
        rig.reopen_and_complete(run_id, argv)


def test_pi_and_the_server_killed_during_a_compute_node_recover_the_same_way(
    rig: Rig, processes: Processes
) -> None:
    server = processes.spawn_cli(rig.state_dir, "server", "run", "--idle-exit", "0")
    assert server.stdout is not None and "running" in server.stdout.readline()
    run_id, argv, pi = rig.start_in_a_new_session()
    rig.pi.kill(pi)
    os.killpg(server.pid, signal.SIGKILL)
    server.wait(30)
    rig.gate.touch()  # the recovered runner computes the node again and goes on
    again = processes.spawn_cli(rig.state_dir, "server", "run", "--idle-exit", "0")
    assert again.stdout is not None and "running" in again.stdout.readline()
    wait_until(lambda: rig.status(run_id) == "waiting", "the run to wait at its step", 120)
    rig.reopen_and_complete(run_id, argv)
    with WorkflowClient(rig.state_dir, autostart=False) as client:
        client.call("server.stop", {"drainSeconds": 0})
    again.wait(60)
