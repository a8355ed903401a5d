"""`server status` when stopped, and help texts with defaults, exit codes and environment.

Issue 13, item 8: a stopped server is reported as stopped (exit code 3, `{"running":
false, ...}` with --json), never as zero counts; every command's --help gives its
option defaults, its exit codes and the environment variables it reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from pi_workflows import WorkflowServer
from pi_workflows.cli import main
from pi_workflows.cli._main import COMMAND_EXITS, EXIT_WORDS, env_words
from tests.conftest import Processes

pytestmark = pytest.mark.timeout(120)


def test_status_of_a_stopped_server_says_stopped_and_exits_3(
    processes: Processes, state_dir: Path
) -> None:
    text = processes.cli(state_dir, "server", "status")
    assert text.returncode == 3, text.stderr
    assert "server is stopped" in text.stdout
    assert "queued" not in text.stdout and "0" not in text.stdout  # no made-up counts
    document = processes.cli(state_dir, "server", "status", "--json")
    assert document.returncode == 3
    assert json.loads(document.stdout) == {"running": False, "state": "stopped"}
    assert not (state_dir / "host" / "host.sock").exists()  # status never starts one


def test_status_of_a_running_server_says_running(
    server: WorkflowServer, processes: Processes
) -> None:
    result = processes.cli(server.state_dir, "server", "status", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["running"] is True and document["state"] == "running"


def _help(processes: Processes, state_dir: Path, *args: str) -> str:
    """The help text with its line wrapping undone."""
    result = processes.cli(state_dir, *args, "--help")
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.split())


def test_help_gives_defaults_exit_codes_and_environment(
    processes: Processes, state_dir: Path
) -> None:
    stop = _help(processes, state_dir, "server", "stop")
    assert "[default: 30.0" in stop  # --drain
    assert "default: --drain plus 20" in stop  # --timeout
    assert "Exit codes:" in stop and "the server stopped, or none was running" in stop
    assert "PI_CODING_AGENT_DIR" in stop
    run = _help(processes, state_dir, "server", "run")
    for name in ("PI_WORKFLOWS_IDLE_EXIT_SECONDS", "PI_WORKFLOWS_MAX_WORKERS", "PI_WORKFLOWS_PI"):
        assert name in run
    assert "else 600" in run and "else 4" in run
    status = _help(processes, state_dir, "server", "status")
    assert "the server is stopped" in status
    wait = _help(processes, state_dir, "run", "wait")
    assert "6 --timeout passed first" in wait and "0 the run completed" in wait
    assert "default: never" in wait
    root = _help(processes, state_dir)
    for code, words in EXIT_WORDS.items():
        assert f"{code} {words}" in root


def _commands(
    group: click.Group, chain: tuple[tuple[str, click.Command], ...] = ()
) -> list[tuple[tuple[str, click.Command], ...]]:
    """Every command under `group`, as the chain of (name, command) from the root."""
    found: list[tuple[tuple[str, click.Command], ...]] = []
    for name, command in group.commands.items():
        found.append((*chain, (name, command)))
        if isinstance(command, click.Group):
            found.extend(_commands(command, (*chain, (name, command))))
    return found


def _help_of(chain: tuple[tuple[str, click.Command], ...]) -> str:
    context = click.Context(main, info_name="pi-workflows", show_default=True)
    for name, command in chain:
        context = click.Context(command, parent=context, info_name=name)
    return chain[-1][1].get_help(context)


def test_every_command_lists_its_exit_codes_and_environment() -> None:
    chains = _commands(main)
    assert len(chains) > 15
    paths = {" ".join(name for name, _ in chain) for chain in chains}
    assert {key for key in COMMAND_EXITS if key not in ("", "piw")} <= paths
    for chain in chains:
        path = " ".join(name for name, _ in chain)
        text = " ".join(_help_of(chain).split())
        if isinstance(chain[-1][1], click.Group):
            assert "Each command's --help lists its exit codes and environment." in text, path
            continue
        assert "Exit codes: 0 " in text, path
        assert "Environment: PI_" in text, path
    assert all(name.startswith("PI_") for name in env_words())
