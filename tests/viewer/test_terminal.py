"""`piw RUN_ID` in a real terminal (tmux), against a server process that is killed.

Following a run, the captured screens show its node go from running to completed. A
SIGKILL of the server turns the screen to "reconnecting" (never current); after a new
server starts, the run is shown current again and completes. While connected, the
viewer holds no file of the state folder (bullets 43 and 44: the protocol only). `q`
quits, and nothing of the viewer is left running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pi_workflows import WorkflowClient
from tests.conftest import Processes, write_workflow
from tests.server.runs import start_run
from tests.viewer.tmux_piw import TmuxPane

pytestmark = pytest.mark.timeout(240)

PIW = Path(sys.executable).parent / "piw"
WAIT_S = 60.0

GATED = """
import time
from pathlib import Path

from pi_workflows import compute, define_workflow


def hold(ctx):
    gate = Path(ctx.input["release"])
    while not gate.exists():  # the test opens the gate; a re-run after a crash waits again
        time.sleep(0.05)
    return {"held": True}


workflow = define_workflow(
    name="gated",
    start_at="first",
    nodes={
        "first": compute(lambda ctx: {"ok": True}),
        "hold": compute(hold),
        "last": compute(lambda ctx: {"done": True}),
    },
    edges=[{"from": "first", "to": "hold"}, {"from": "hold", "to": "last"}],
)
"""


def _start_server(processes: Processes, state_dir: Path) -> subprocess.Popen[str]:
    server = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0")
    assert server.stdout is not None
    line = server.stdout.readline()
    assert "running" in line, f"the server did not start: {line!r}"
    for child in psutil.Process(server.pid).children(recursive=True):
        processes.adopt(child.pid)  # the zygote and runners outlive a SIGKILLed server
    return server


def _card_state(screen: str, node: str) -> str:
    """The state line under node `node`'s card header, or ''."""
    lines = screen.splitlines()
    for index, line in enumerate(lines[:-1]):
        if f"│{node} " in line:
            column = line.index(f"│{node} ")
            return lines[index + 1][column : column + 22]
    return ""


@pytest.fixture
def pane(short_tmp: Path) -> Iterator[TmuxPane]:
    terminal = TmuxPane(short_tmp / "tmux", columns=160, lines=50)
    terminal.root.mkdir()
    try:
        yield terminal
    finally:
        terminal.close()


def test_piw_follows_a_run_through_a_server_crash_and_quits_cleanly(
    pane: TmuxPane, processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    project, release = short_tmp / "project", short_tmp / "release"
    write_workflow(project, "gated", GATED)
    server = _start_server(processes, state_dir)
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        run_id = start_run(client, project, "gated", {"release": str(release)})
    home = short_tmp / "home"
    home.mkdir()
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
        "PI_CODING_AGENT_DIR": str(state_dir.parent),
        "PIW_CONFIG_PATH": str(home / "piw.toml"),
    }
    viewer = pane.launch([str(PIW), "--state-dir", str(state_dir), run_id], env)

    pane.wait_screen(lambda s: "running" in _card_state(s, "hold"), "node hold running")
    assert "completed" in _card_state(pane.screen(), "first")
    held = [entry.path for entry in viewer.open_files() if entry.path.startswith(str(state_dir))]
    assert held == [], f"piw opened state files: {held}"

    os.kill(server.pid, signal.SIGKILL)
    server.wait(30)
    pane.wait_screen(lambda s: "reconnecting" in s, "reconnecting after the server died")

    _start_server(processes, state_dir)
    pane.wait_screen(lambda s: "reconnecting" not in s and "connected" in s, "current again")
    release.touch()
    pane.wait_screen(
        lambda s: "completed" in _card_state(s, "last") and "completed" in _card_state(s, "hold"),
        "the run completed",
    )

    children = viewer.children(recursive=True)
    pane.keys("q")
    pane.wait_screen(lambda _: pane.pane_dead(), "piw quit", timeout=WAIT_S)
    assert not viewer.is_running() or viewer.status() == psutil.STATUS_ZOMBIE
    _gone, alive = psutil.wait_procs(children, timeout=WAIT_S)
    assert alive == [], f"left running after piw quit: {alive}"
