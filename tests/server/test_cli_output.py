"""CLI output that scripts and people can trust, through a real server and the CLI.

Every command that creates or controls a run prints the bare run ID on stdout and its
words on stderr (`R=$(pi-workflows run restart RUN)` holds the ID alone), or one JSON
document with --json; `run start --wait` starts and waits with `run wait`'s exit codes;
`server status` shows the server's PID; completion offers only runs that allow the
command; help states only exit codes that can happen.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.cli import main
from pi_workflows.cli._main import COMMAND_EXITS, EXIT_UNAVAILABLE, STARTS_NO_SERVER
from tests.conftest import Processes, write_workflow
from tests.server.runs import start_run
from tests.server.test_cli_completion import complete

pytestmark = pytest.mark.timeout(180)

CLI = [sys.executable, "-m", "pi_workflows.cli"]

OUTCOMES = """
from pi_workflows import compute, define_workflow


def work(ctx):
    if ctx.input.get("fail"):
        raise RuntimeError("asked to fail")
    if ctx.input.get("block"):
        with open(ctx.input["block"]) as gate:  # a FIFO nobody opens for writing
            gate.read()
    return {"doubled": 2 * ctx.input.get("n", 0)}


workflow = define_workflow(
    name="outcomes", start_at="work", nodes={"work": compute(work, timeout=600)}
)
"""


def _shell(state_dir: Path, script: str) -> subprocess.CompletedProcess[str]:
    """Run `script` in bash with `piw` as the CLI for this state folder."""
    prefix = f'piw() {{ {shlex.join(CLI)} --state-dir {shlex.quote(str(state_dir))} "$@"; }}\n'
    return subprocess.run(
        ["bash", "-c", "set -e\n" + prefix + script],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PI_CODING_AGENT_DIR=str(state_dir.parent)),
        check=False,
    )


def test_control_commands_print_the_bare_run_id_for_the_next_command(
    server: WorkflowServer, client: WorkflowClient, project: Path, processes: Processes
) -> None:
    state_dir = server.state_dir
    run_id = start_run(client, project, "hello")
    for verb, done in (("pause", "paused"), ("resume", "resumed"), ("cancel", "cancelled")):
        result = processes.cli(state_dir, "run", verb, run_id)
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"{run_id}\n", (verb, result.stdout)
        assert result.stderr == f"{done} {run_id}\n", (verb, result.stderr)
    again = processes.cli(state_dir, "run", "cancel", run_id)
    assert again.returncode == 1, "a cancelled run cannot be cancelled again"
    assert again.stdout == ""

    # As a script writes it: the restart's output is the next command's argument.
    script = _shell(state_dir, f'R=$(piw run restart {run_id})\necho "R=$R"\npiw run status "$R"')
    assert script.returncode == 0, script.stderr
    lines = script.stdout.splitlines()
    restarted = lines[0].removeprefix("R=")
    assert restarted.startswith("run-") and restarted != run_id, lines
    assert lines[1].startswith(f"{restarted}  queued  hello"), lines
    assert f"restarted {run_id} as {restarted}" in script.stderr

    as_json = processes.cli(state_dir, "run", "cancel", restarted, "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["runId"] == restarted, "one JSON document"
    assert as_json.stderr == ""


def test_run_start_wait_exits_as_run_wait(
    processes: Processes, running_server: WorkflowServer, short_tmp: Path
) -> None:
    state_dir = running_server.state_dir
    project = short_tmp / "project"
    write_workflow(project, "outcomes", OUTCOMES)
    start = ("run", "start", "outcomes", "--project", str(project), "--wait")

    completed = processes.cli(state_dir, *start, "--input-json", '{"n": 21}', "--timeout", "90")
    assert completed.returncode == 0, completed.stderr
    run_id, line, output = completed.stdout.splitlines()
    assert run_id.startswith("run-") and line == f"{run_id}  completed", completed.stdout
    assert output == 'output: {"doubled": 42}'

    failed = processes.cli(state_dir, *start, "--input-json", '{"fail": true}', "--timeout", "90")
    assert failed.returncode == 1, failed.stderr
    run_id = failed.stdout.splitlines()[0]
    assert failed.stdout.splitlines()[1].startswith(f"{run_id}  failed")

    as_json = processes.cli(state_dir, *start, "--json", "--timeout", "90")
    assert as_json.returncode == 0, as_json.stderr
    view = json.loads(as_json.stdout)  # one document: the settled run view
    assert (
        view["display"]["status"] == "completed" and view["lineage"]["rootRunId"] == view["runId"]
    )

    gate = short_tmp / "gate.fifo"
    os.mkfifo(gate)
    blocked = processes.cli(
        state_dir, *start, "--input-json", json.dumps({"block": str(gate)}), "--timeout", "2"
    )
    assert blocked.returncode == 6, blocked.stderr
    assert "did not settle within 2 s" in blocked.stderr
    blocked_id = blocked.stdout.splitlines()[0]
    assert processes.cli(state_dir, "run", "cancel", blocked_id).returncode == 0

    misuse = processes.cli(state_dir, "run", "start", "outcomes", "--timeout", "5")
    assert misuse.returncode == 2 and "--wait" in misuse.stderr and misuse.stdout == ""


def test_server_status_shows_the_pid_of_the_server(processes: Processes, state_dir: Path) -> None:
    started = processes.cli(state_dir, "server", "start")
    assert started.returncode == 0, started.stderr
    pid = int((state_dir / "host" / "server.lock").read_text().strip())
    processes.adopt(pid)
    document = processes.cli(state_dir, "server", "status", "--json")
    assert document.returncode == 0, document.stderr
    assert json.loads(document.stdout)["pid"] == pid
    text = processes.cli(state_dir, "server", "status")
    assert f"pid: {pid}" in text.stdout
    assert processes.cli(state_dir, "server", "stop").returncode == 0


def test_completion_offers_only_runs_that_allow_the_command(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    queued, cancelled, paused = (start_run(client, project, "hello") for _ in range(3))
    client.call("run.cancel", run_id=cancelled)
    client.call("run.pause", run_id=paused)

    def offered(command: str) -> set[str]:
        return set(complete(server.state_dir, f"{command} ")[0])

    assert offered("run cancel") == {queued, paused}, "no finished run"
    assert offered("run pause") == {queued}
    assert offered("run resume") == {paused}, "a queued run not parked cannot resume"
    assert offered("run restart") == {cancelled}, "only finished runs restart"
    assert offered("run answer") == set() and offered("run recover") == set()
    assert offered("run show") == {queued, cancelled, paused}, "any run can be shown"
    assert offered("run wait") == {queued, cancelled, paused}


def _help(*args: str) -> str:
    """One command's --help, rendered in this process (it depends on the code only)."""
    result = CliRunner().invoke(main, [*args, "--help"], prog_name="pi-workflows")
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_help_states_only_exit_codes_that_can_happen() -> None:
    stop = _help("server", "stop")
    assert "or started" not in stop and "never starts a server" in stop
    for path in STARTS_NO_SERVER - {"", "piw"}:
        if EXIT_UNAVAILABLE in COMMAND_EXITS.get(path, ()):
            assert "could be reached or started" not in _help(*path.split()), path
    assert "6 with --wait: --timeout passed first" in _help("run", "start")
    for args in (("run", "list"), ("run", "logs"), ("run", "show")):
        text = _help(*args)
        assert text.count("Exit codes") == 1, args  # the epilog only, no second list
