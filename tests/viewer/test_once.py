"""`piw RUN_ID --once` through real processes: golden frames and its exit codes.

A real server (embedded, executing runs in runner processes) runs real workflows; the
`piw` program prints one frame of each, which must equal the committed golden text
under tests/viewer/golden/ once run IDs and times are normalised. Regenerate them with
`PIW_GOLDEN_UPDATE=1` (and read the diff). The failure exits: a missing run (1), no
server that can be reached or started (3), no view in time (6). An interactive run
with a recorded conversation shows its newest lines, bounded, in the same frame.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.cli.test_relay import _start_relay, _start_server
from tests.conftest import Processes, write_workflow
from tests.server import origin, test_session_record
from tests.server.conftest import running_server  # noqa: F401 (a fixture)
from tests.server.runs import TERMINAL, start_run, wait_for
from tests.server.test_cli_output import OUTCOMES
from tests.server.test_human_decisions import SHIP_NOW, start_waiting
from tests.server.test_includes import REVIEW
from tests.server.test_includes import SHIP as INCLUDING
from tests.server.test_session_record import Turn, reply

pytestmark = pytest.mark.timeout(120)

PIW = Path(sys.executable).parent / "piw"
GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("PIW_GOLDEN_UPDATE") == "1"

running = origin.running
ask_project = origin.ask_project
turn = test_session_record.turn

CHAIN = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="chain",
    start_at="fetch",
    nodes={
        "fetch": compute(lambda ctx: {"n": 1}),
        "shape": compute(lambda ctx: {"n": ctx.outputs["fetch"]["n"] + 1}),
        "store": compute(lambda ctx: {"stored": ctx.outputs["shape"]["n"]}),
    },
    edges=[{"from": "fetch", "to": "shape"}, {"from": "shape", "to": "store"}],
)
"""

LOOP = """
from pi_workflows import compute, define_workflow


def work(ctx):
    return {"n": (ctx.outputs.get("work") or {}).get("n", 0) + 1}


def check(ctx):
    n = ctx.outputs["work"]["n"]
    return {"state": "again" if n < 3 else ("ok" if ctx.input.get("ok", True) else "bad")}


workflow = define_workflow(
    name="loop",
    start_at="init",
    nodes={
        "init": compute(lambda ctx: {}),
        "work": compute(work),
        "check": compute(check),
        "done": compute(lambda ctx: {"n": ctx.outputs["work"]["n"]}),
        "give_up": compute(lambda ctx: {}),
    },
    edges=[
        {"from": "init", "to": "work"},
        {"from": "work", "to": "check"},
        {"from": "check", "switch": {"on": "$.state",
                                     "cases": {"again": "work", "ok": "done"},
                                     "default": "give_up"}},
    ],
)
"""

_TIME = re.compile(r" +(?:\d+\.\ds|\d+m\d\ds|\d+h\d\dm)")
_RUN_ID = re.compile(r"run-[0-9a-f]{32}")


def normalised(frame: str) -> str:
    """The frame with run IDs and times replaced, keeping every line's width."""
    frame = _RUN_ID.sub(lambda m: "run-" + "#" * (len(m.group()) - 4), frame)
    return _TIME.sub(lambda m: "<t>".rjust(len(m.group())), frame)


def piw(state_dir: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the `piw` program to completion (it exits by itself with --once)."""
    return subprocess.run(
        [str(PIW), "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PI_CODING_AGENT_DIR=str(state_dir.parent)),
        check=False,
    )


def check_golden(name: str, frame: str) -> None:
    lines = frame.split("\n")
    assert lines[-1] == "" and len(lines) == 41, "40 lines, each ended"
    assert all(len(line) == 120 for line in lines[:-1]), "120 columns each"
    path = GOLDEN / f"{name}.txt"
    text = normalised(frame)
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name}: the frame changed (PIW_GOLDEN_UPDATE=1 rewrites)"


@pytest.fixture
def client(running_server: WorkflowServer) -> Iterator[WorkflowClient]:  # noqa: F811
    with WorkflowClient(running_server.state_dir, autostart=False, timeout=30) as connected:
        yield connected


@pytest.fixture
def project(short_tmp: Path) -> Path:
    folder = short_tmp / "project"
    for name, source in (
        ("chain", CHAIN),
        ("loop", LOOP),
        ("review", REVIEW),
        ("ship", INCLUDING),
        ("outcomes", OUTCOMES),
        ("decide", SHIP_NOW.replace('name="ship"', 'name="decide"')),
    ):
        write_workflow(folder, name, source)
    return folder


def _settled_frame(client: WorkflowClient, project: Path, name: str, given: object) -> str:
    run_id = start_run(client, project, name, given)
    wait_for(client, run_id, TERMINAL)
    result = piw(client.state_dir, run_id, "--once")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert run_id in result.stdout.splitlines()[0]
    return result.stdout


@pytest.mark.parametrize(
    ("golden", "workflow", "given"),
    [
        ("chain", "chain", {}),
        ("loop", "loop", {}),
        ("include", "ship", {"n": 7}),
        ("failed", "outcomes", {"fail": True}),
        ("loop-default", "loop", {"ok": False}),
    ],
)
def test_once_prints_the_golden_frame_of_a_settled_run(
    client: WorkflowClient, project: Path, golden: str, workflow: str, given: object
) -> None:
    check_golden(golden, _settled_frame(client, project, workflow, given))


def test_once_prints_a_run_waiting_at_a_decision(client: WorkflowClient, project: Path) -> None:
    run_id = start_waiting(client, project, "decide")
    result = piw(client.state_dir, run_id, "--once")
    assert result.returncode == 0, result.stderr
    check_golden("decision", result.stdout)
    assert "status: waiting" in result.stdout and "waiting on: ask" in result.stdout


def test_the_frame_is_the_same_for_the_same_run(client: WorkflowClient, project: Path) -> None:
    run_id = start_run(client, project, "loop")
    wait_for(client, run_id, TERMINAL)
    first, second = (piw(client.state_dir, run_id, "--once") for _ in range(2))
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout, "a settled run's frame has no wall-clock text"


def test_a_missing_run_exits_1(client: WorkflowClient) -> None:
    result = piw(client.state_dir, "run-" + "0" * 32, "--once")
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("piw: no run") and result.stderr.count("\n") == 1


def test_no_server_that_can_start_exits_3(short_tmp: Path) -> None:
    blocked = short_tmp / "agent"
    blocked.write_text("not a folder")  # the state folder cannot be made: no server starts
    result = piw(blocked / "workflows", "run-" + "0" * 32, "--once")
    assert result.returncode == 3, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("piw: no workflow server")
    assert str(short_tmp) not in result.stderr, "no user path"


def test_no_view_within_the_timeout_exits_6(
    short_tmp: Path, state_dir: Path, processes: Processes
) -> None:
    """A server that accepts connections but never answers (stopped by SIGSTOP)."""
    server = _start_server(processes, state_dir)
    command = [str(PIW), "--state-dir", str(state_dir), "run-" + "0" * 32, "--once"]
    os.kill(server.pid, signal.SIGSTOP)
    child = subprocess.Popen(
        [*command, "--timeout", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PI_CODING_AGENT_DIR=str(state_dir.parent)),
        start_new_session=True,
    )
    processes.started.append(child)
    try:
        stdout, stderr = child.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):  # what it started to wake a server
            os.killpg(child.pid, signal.SIGKILL)
        os.kill(server.pid, signal.SIGCONT)
    assert child.returncode == 6, stderr
    assert stdout == ""
    assert stderr == "piw: no view of 'run-" + "0" * 32 + "' within 2 s\n"
    assert str(short_tmp) not in stderr


def test_once_through_the_relay_is_the_frame_a_local_viewer_prints(
    client: WorkflowClient, project: Path, processes: Processes
) -> None:
    """`piw --connect ws://…/ws` sees the same view as a local client (a settled run:
    one revision), through a real `piw serve` process."""
    run_id = start_run(client, project, "loop")
    wait_for(client, run_id, TERMINAL)
    _relay, url = _start_relay(processes, client.state_dir)
    local = piw(client.state_dir, run_id, "--once")
    relayed = piw(client.state_dir, "--connect", url, run_id, "--once")
    assert local.returncode == relayed.returncode == 0, relayed.stderr
    assert relayed.stdout == local.stdout
    check_golden("loop", relayed.stdout)


def test_once_through_a_relay_with_no_server_says_so(short_tmp: Path, processes: Processes) -> None:
    """A relay cannot start a server: exit 3 and one sentence, never a started server."""
    state_dir = short_tmp / "agent" / "workflows"
    _relay, url = _start_relay(processes, state_dir)
    result = piw(state_dir, "--connect", url, "run-" + "0" * 32, "--once", timeout=60)
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith("piw: ") and result.stderr.count("\n") == 1
    assert not (state_dir / "host" / "host.sock").exists(), "no server was started"


def conversation_events() -> list[dict[str, object]]:
    """A reply, a tool call and its long result, then the turn's last reply."""
    return [
        *reply(0, "Here is the plan.", "entry-a"),
        {"seq": 4, "type": "messageStart", "role": "assistant"},
        {"seq": 5, "type": "thinkingDelta", "contentIndex": 0, "delta": "Look first."},
        {
            "seq": 6,
            "type": "toolCallEnd",
            "contentIndex": 1,
            "toolCallId": "call-1",
            "name": "bash",
            "arguments": {"command": "ls"},
        },
        {"seq": 7, "type": "messageEnd", "entryId": "entry-b", "role": "assistant"},
        {"seq": 8, "type": "toolStart", "toolCallId": "call-1", "name": "bash"},
        {"seq": 9, "type": "toolEnd", "toolCallId": "call-1", "result": "a.txt " * 2000},
        *reply(10, "All files are listed.", "entry-c"),
    ]


def test_once_shows_the_newest_lines_of_a_recorded_conversation(turn: Turn) -> None:
    assert turn.record(conversation_events(), final={"count": 14})["outcome"] == "accepted"
    result = piw(turn.server.state_dir, turn.run_id, "--once")
    assert result.returncode == 0, result.stderr
    frame = result.stdout
    lines = frame.split("\n")
    assert len(lines) == 41 and all(len(line) == 120 for line in lines[:-1]), "120 × 40"
    assert lines[0].startswith(f"piw  {turn.run_id}  ask")
    assert "── conversation: 1 recorded turns ──" in frame
    assert "step ask, turn turn-1: capture complete" in frame
    assert "assistant:  Here is the plan." in frame
    assert "thinking: Look first." in frame
    assert 'assistant:  tool call bash {"command": "ls"}' in frame
    assert "→ done: a.txt a.txt" in frame
    assert "(12000 bytes in all)" in frame, "the long result is cut with its size"
    assert "assistant:  All files are listed." in frame
    assert "── last steps" in frame
