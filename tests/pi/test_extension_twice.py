"""`pi -e "$(pi-workflows pi-extension path)"` beside the installed extension (issue 24,
item 12): Pi loads both copies; the second finds the first in the same Pi and registers
nothing, so Pi reports no `Tool "workflow" conflicts` and every command works, also
after `/reload` in the terminal UI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows.engine._pi_child import PiChild, PiLaunch, pi_environment
from pi_workflows.testing import FakeProvider
from tests.pi.tmux_pi import TmuxPi, use_fake_model

pytestmark = pytest.mark.timeout(180)


def _cli(agent: Path, *args: str) -> str:
    env = dict(os.environ, PI_CODING_AGENT_DIR=str(agent))
    done = subprocess.run(
        [sys.executable, "-m", "pi_workflows.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def installed(pi_binary: Path, pi_slot: None, short_tmp: Path) -> Iterator[tuple[Path, Path]]:
    """An agent dir with the extension installed; (agent dir, the `-e` path printed)."""
    agent = short_tmp / "agent"
    with FakeProvider() as provider:
        provider.write_agent_dir(agent)
    use_fake_model(agent)
    _cli(agent, "pi-extension", "install")
    for folder in ("project", "tmp"):
        (short_tmp / folder).mkdir()
    yield agent, Path(_cli(agent, "pi-extension", "path"))


def test_pi_e_beside_the_installed_extension_loads_one_working_copy(
    installed: tuple[Path, Path], pi_binary: Path, short_tmp: Path
) -> None:
    agent, path = installed
    argv = (str(pi_binary), "--mode", "rpc", "--no-session", "--offline", "-e", str(path))
    env = pi_environment(os.environ, agent_dir=agent, tmpdir=short_tmp / "tmp")
    log = short_tmp / "pi.log"
    child = PiChild.spawn(PiLaunch(argv, env, short_tmp / "project", log))
    try:
        child.wait_ready(60)
        commands = child.command({"type": "get_commands"}, 30)["commands"]
    finally:
        child.stop()
    ours = [c for c in commands if c["source"] == "extension"]
    assert sorted(c["name"] for c in ours) == ["piw", "resource-manager", "workflow"], (
        "one copy registered"
    )
    # The -e copy loads first and is the one that runs.
    assert {c["sourceInfo"]["path"] for c in ours} == {str(path)}
    assert "conflicts" not in log.read_text(errors="replace")


def test_the_terminal_ui_runs_workflow_commands_with_both_copies_also_after_reload(
    installed: tuple[Path, Path], pi_binary: Path, short_tmp: Path
) -> None:
    agent, path = installed
    pi = TmuxPi(short_tmp, pi_binary, agent, short_tmp / "project")
    try:
        pi.launch(["-e", str(path)])
        assert "conflicts" not in pi.screen()
        pi.type("/workflow list")
        # No server runs here: the command answers, naming the command that starts one.
        pi.find(r"The workflow server is not running", "the command's answer")
        pi.type("/reload")
        pi.type("/workflow help")
        pi.find(r"/workflow adopt RUN_ID", "the usage after /reload")
        assert "conflicts" not in pi.screen()
    finally:
        pi.close()
