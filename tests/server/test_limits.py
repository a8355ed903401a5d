"""Memory and process limits, through a real server, runner and commands (issue 11 item 11).

A node over its limit fails with `resourceLimit`, a class of its own: not `nodeFailed`,
not a crash. Memory is the data rlimit in the runner and every command it starts; the
process count is the runner's live descendants, counted through its subreaper.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.engine._limits import MEMORY_ENV, PROCESSES_ENV, Limits
from pi_workflows.server._server import ServerStartError
from tests.conftest import write_workflow
from tests.server.runs import TERMINAL, start_run, wait_for
from tests.server.test_escapes import assert_gone

pytestmark = pytest.mark.timeout(120)

GIB = 1024 * 1024 * 1024

MEMORY = """
from pi_workflows import compute, define_workflow

def grab(ctx):
    block = bytearray({size})  # zero-filled: every page is really mapped
    return {{"bytes": len(block)}}

workflow = define_workflow(
    name="memory", start_at="grab", nodes={{"grab": compute(grab{limits})}}
)
"""


def _attempt_errors(state_dir: Path, run_id: str) -> list[tuple[str, str | None]]:
    database = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        return [
            (str(status), error)
            for status, error in database.execute(
                "SELECT status, error FROM node_attempts WHERE run_id = ? ORDER BY started_at",
                (run_id,),
            )
        ]
    finally:
        database.close()


def _run(server: WorkflowServer, project: Path, name: str) -> dict[str, Any]:
    with WorkflowClient(server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, name, {})
        return wait_for(client, run_id, TERMINAL)


def _assert_resource_limit(server: WorkflowServer, view: dict[str, Any], words: str) -> None:
    assert view["display"]["status"] == "failed", view
    assert view["failureClass"] == "resourceLimit", view
    assert words in view["failureReason"], view["failureReason"]
    ((status, error),) = _attempt_errors(server.state_dir, view["runId"])
    assert status == "failed" and error is not None
    assert error.startswith("resourceLimit: "), error


def test_a_compute_node_over_its_memory_limit_fails_with_resource_limit(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    limits = ', limits={"memory_mb": 200}'
    write_workflow(project, "memory", MEMORY.format(size=GIB, limits=limits))
    view = _run(running_server, project, "memory")
    _assert_resource_limit(running_server, view, "memory_mb=200")


def test_a_node_within_its_memory_limit_completes(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    limits = ', limits={"memory_mb": 200}'
    write_workflow(project, "memory", MEMORY.format(size=64 * 1024 * 1024, limits=limits))
    view = _run(running_server, project, "memory")
    assert view["display"]["status"] == "completed", view
    assert "failureClass" not in view


def test_a_runner_allocating_4_gib_without_a_limit_is_bounded_by_the_server_default(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    # The built-in default is half the memory, at most 4 GiB; the runner's own data
    # comes on top of the 4 GiB asked for, so this fails on any machine.
    assert running_server.default_limits.memory_mb is not None
    assert running_server.default_limits.memory_mb <= 4096
    project = short_tmp / "project"
    write_workflow(project, "memory", MEMORY.format(size=4 * GIB, limits=""))
    view = _run(running_server, project, "memory")
    _assert_resource_limit(
        running_server, view, f"memory_mb={running_server.default_limits.memory_mb}"
    )


def test_the_server_default_is_configurable_and_a_node_limit_overrides_it(
    state_dir: Path, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MEMORY_ENV, "100")
    project = short_tmp / "project"
    write_workflow(project, "small", MEMORY.format(size=300 * 1024 * 1024, limits=""))
    limits = ', limits={"memory_mb": 600}'
    write_workflow(project, "large", MEMORY.format(size=300 * 1024 * 1024, limits=limits))
    with WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05) as server:
        assert server.default_limits.memory_mb == 100
        _assert_resource_limit(server, _run(server, project, "small"), "memory_mb=100")
        assert _run(server, project, "large")["display"]["status"] == "completed"


@pytest.mark.parametrize("value", ["-1", "lots", "5"])
def test_a_bad_server_default_refuses_to_start(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(PROCESSES_ENV if value == "-1" else MEMORY_ENV, value)
    with pytest.raises(ServerStartError, match="PI_WORKFLOWS_DEFAULT_"):
        WorkflowServer(state_dir, idle_exit_s=None)


SHELL_MEMORY = """
from pi_workflows import compute, define_workflow, shell

workflow = define_workflow(
    name="shellmem",
    start_at="limit",
    nodes={{
        "limit": shell(lambda ctx: ["sh", "-c", "ulimit -d"], limits={{"memory_mb": 200}}),
        "grab": shell(
            lambda ctx: [{python!r}, "-c", "bytearray(1 << 30)"], limits={{"memory_mb": 200}}
        ),
        "after": compute(lambda ctx: {{"limit": ctx.outputs["limit"]["stdout"].strip(),
                                      "grab": ctx.outputs["grab"]["exitCode"],
                                      "err": ctx.outputs["grab"]["stderr"][-200:]}}),
    }},
    edges=[{{"from": "limit", "to": "grab"}}, {{"from": "grab", "to": "after"}}],
)
"""


def test_a_shell_command_runs_under_its_node_memory_limit(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "shellmem", SHELL_MEMORY.format(python=sys.executable))
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "shellmem", {})
        view = wait_for(client, run_id, TERMINAL)
        assert view["display"]["status"] == "completed", view
    result = _output(running_server.state_dir, run_id, "after")
    assert result["limit"] == str(200 * 1024)  # `ulimit -d` counts KiB
    assert result["grab"] != 0 and "MemoryError" in result["err"]


# The node starts `count` sleeps (in sessions of their own) and waits for them; the cap
# stops them all, so the node ends early with resourceLimit.
PROCESSES = """
import subprocess, time
from pathlib import Path
from pi_workflows import compute, define_workflow, shell

PIDS = Path({pids!r})
# Each PID is written as soon as it exists: the cap may stop the node mid-loop.
SCRIPT = 'for i in 1 2 3 4 5 6; do sleep 600 & echo $! >> {pids}; done; wait'

def spawn(ctx):
    children = []
    for _ in range({count}):
        children.append(subprocess.Popen(["setsid", "sleep", "600"]))
        with PIDS.open("a") as pids:
            pids.write(f"{{children[-1].pid}} ")
    return {{"codes": [c.wait() for c in children]}}

nodes = {{
    "compute": compute(spawn, limits={{"processes": 3}}),
    "shell": shell(
        lambda ctx: ["sh", "-c", SCRIPT],
        limits={{"processes": 3}},
    ),
}}
workflow = define_workflow(name="procs", start_at={start!r}, nodes={{{start!r}: nodes[{start!r}]}})
"""


@pytest.fixture
def pid_file(short_tmp: Path) -> Iterator[Path]:
    path = short_tmp / "pids"
    try:
        yield path
    finally:
        with contextlib.suppress(OSError, ValueError):
            for pid in map(int, path.read_text().split()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("start", ["compute", "shell"])
def test_a_node_with_more_live_processes_than_its_limit_fails_with_resource_limit(
    running_server: WorkflowServer, short_tmp: Path, pid_file: Path, start: str
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "procs", PROCESSES.format(pids=str(pid_file), count=6, start=start))
    view = _run(running_server, project, "procs")
    _assert_resource_limit(running_server, view, "processes=3")
    started = pid_file.read_text().split() if pid_file.exists() else []
    assert_gone([int(pid) for pid in started])  # every process it started, however few


def test_a_node_within_its_process_limit_completes(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    source = PROCESSES.replace('"sleep", "600"', '"true"')
    write_workflow(
        project, "procs", source.format(pids=str(short_tmp / "p"), count=2, start="compute")
    )
    view = _run(running_server, project, "procs")
    assert view["display"]["status"] == "completed", view


RLIMIT = """
import resource
from pi_workflows import compute, define_workflow

def limit(ctx):
    return list(resource.getrlimit(resource.RLIMIT_DATA))

workflow = define_workflow(
    name="rlimit",
    start_at="own",
    nodes={
        "own": compute(limit, limits={"memory_mb": 600}),
        "inherited": compute(limit),
        "after": compute(lambda ctx: {k: ctx.outputs[k] for k in ("own", "inherited")}),
    },
    edges=[{"from": "own", "to": "inherited"}, {"from": "inherited", "to": "after"}],
    limits={"memory_mb": 300},
)
"""


def _output(state_dir: Path, run_id: str, node: str) -> Any:
    database = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        (output,) = database.execute(
            "SELECT b.content FROM node_attempts AS a JOIN blobs AS b ON b.digest = a.output_hash "
            "WHERE a.run_id = ? AND a.node_path = ?",
            (run_id, node),
        ).fetchone()
    finally:
        database.close()
    return json.loads(output)


@pytest.mark.parametrize("defaults", [Limits(), Limits(memory_mb=100)])
def test_the_runner_sets_each_nodes_data_rlimit(
    state_dir: Path, short_tmp: Path, defaults: Limits
) -> None:
    """Soft: the node's own limit over its workflow's; hard: the largest any node needs.
    The server default fills only what neither sets (here, nothing)."""
    project = short_tmp / "project"
    write_workflow(project, "rlimit", RLIMIT)
    mib = 1024 * 1024
    with WorkflowServer(
        state_dir, idle_exit_s=None, tick_s=0.05, default_limits=defaults
    ) as server:
        view = _run(server, project, "rlimit")
        assert view["display"]["status"] == "completed", view
        result = _output(server.state_dir, view["runId"], "after")
    assert result == {"own": [600 * mib, 600 * mib], "inherited": [300 * mib, 600 * mib]}
