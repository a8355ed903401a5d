"""Shell completion of `pi-workflows` through click's completion protocol, in a subprocess.

Each case runs the CLI as the shell script would (`_PI_WORKFLOWS_COMPLETE=bash_complete`
with `COMP_WORDS`/`COMP_CWORD`, or `zsh_complete`/`fish_complete`): commands, workflow
names from discovery, run IDs from a real server's `run.list`. Without a server (none,
a stale socket, a listener that never answers) it completes nothing, quickly, and
starts no server. `pi-workflows completion SHELL` prints each shell's script.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.wire.client import socket_path_for
from tests.conftest import write_workflow
from tests.server.runs import start_run

pytestmark = pytest.mark.timeout(120)

# As the console script runs it: the program name decides the completion variable.
CLI = "from pi_workflows.cli import main; main(prog_name='pi-workflows')"


def complete(
    state_dir: Path, words: str, *, cwd: Path | None = None, shell: str = "bash"
) -> tuple[list[str], float]:
    """Completion values for the command line `words` (completing its last word)."""
    line = f"pi-workflows --state-dir {state_dir} {words}"
    # fish passes the word being completed; bash and zsh pass its index.
    cword = line.rsplit(" ", maxsplit=1)[-1] if shell == "fish" else str(line.count(" "))
    env = dict(
        os.environ,
        PI_CODING_AGENT_DIR=str(state_dir.parent),
        _PI_WORKFLOWS_COMPLETE=f"{shell}_complete",
        COMP_WORDS=line,
        COMP_CWORD=cword,
    )
    if shell != "bash":
        env["_TYPE_COMPLETIONS"] = "1"
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", CLI],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=30,
        check=False,
    )
    elapsed = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line]  # nothing: one empty line
    values = [line.split(",", 1)[1] for line in lines] if shell == "bash" else lines
    return values, elapsed


def test_commands_complete(state_dir: Path) -> None:
    assert complete(state_dir, "ru")[0] == ["run"]
    assert complete(state_dir, "comp")[0] == ["completion"]
    shown, _ = complete(state_dir, "run ")
    assert {"start", "list", "status", "wait", "cancel"} <= set(shown)


def test_workflow_names_complete_from_discovery(short_tmp: Path, state_dir: Path) -> None:
    project = short_tmp / "project"
    write_workflow(project, "hello")
    write_workflow(project, "help-me")
    write_workflow(project, "other")
    assert complete(state_dir, "run start ", cwd=project)[0] == ["hello", "help-me", "other"]
    assert complete(state_dir, "run start hel", cwd=project)[0] == ["hello", "help-me"]
    assert complete(state_dir, "run list --workflow o", cwd=project)[0] == ["other"]
    assert not socket_path_for(state_dir).exists(), "discovery needs no server"


def test_run_ids_complete_from_a_running_server(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    runs = [start_run(client, project, "hello") for _ in range(3)]
    shown, _ = complete(server.state_dir, "run show ")
    assert shown == list(reversed(runs)), "newest first"
    prefix = runs[1][: len(runs[1]) - 1]
    assert runs[1] in complete(server.state_dir, f"run cancel {prefix}")[0]
    assert complete(server.state_dir, "run status no-such-")[0] == []


def test_zsh_and_fish_get_run_ids_with_their_workflow_and_status(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    run_id = start_run(client, project, "hello")
    zsh, _ = complete(server.state_dir, "run wait ", shell="zsh")
    assert zsh[:3] == ["plain", run_id, "hello queued"], zsh
    fish, _ = complete(server.state_dir, "run wait ", shell="fish")
    assert fish == [f"plain,{run_id}\thello queued"], fish


def test_without_a_server_run_ids_complete_nothing_and_start_none(state_dir: Path) -> None:
    shown, elapsed = complete(state_dir, "run show ")
    assert shown == []
    assert elapsed < 15
    assert not socket_path_for(state_dir).exists(), "completion never starts a server"


def test_a_stale_socket_completes_nothing(short_tmp: Path, state_dir: Path) -> None:
    path = socket_path_for(state_dir)
    path.parent.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays; nobody listens
    assert complete(state_dir, "run show ")[0] == []


def test_a_listener_that_never_answers_does_not_hang_completion(state_dir: Path) -> None:
    path = socket_path_for(state_dir)
    path.parent.mkdir(parents=True)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(path))
    silent.listen(8)
    try:
        shown, elapsed = complete(state_dir, "run show ")
    finally:
        silent.close()
    assert shown == []
    assert elapsed < 20, "bounded by the completion budget, not the request timeout"


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_completion_command_prints_each_shells_script(state_dir: Path, shell: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CLI, "completion", shell],
        capture_output=True,
        text=True,
        env=dict(os.environ, PI_CODING_AGENT_DIR=str(state_dir.parent)),
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "_PI_WORKFLOWS_COMPLETE" in done.stdout
    assert f"{shell}_complete" in done.stdout
    assert not socket_path_for(state_dir).exists()


def test_an_unknown_shell_is_a_usage_error(state_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CLI, "completion", "tcsh"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "tcsh" in done.stderr
