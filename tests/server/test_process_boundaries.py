"""Workflow code runs only in children, and only the server opens the live database.

workflow-server.md § Conformance: "the extension and server run no workflow or
resource manager code in their own event loops" and "the server is the only production
process that opens live SQLite state". The server here is embedded in the test process,
so "the server" is this PID; its children (zygote, resolvers, runners) are real
processes, inspected while a run is in the middle of a node.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.conftest import write_workflow
from tests.server.runs import TERMINAL, start_run, wait_fifo, wait_for

pytestmark = pytest.mark.timeout(120)

PACKAGE = Path(__file__).resolve().parents[2] / "pi_workflows"

MARKED = """
import os
from pathlib import Path

from pi_workflows import compute, define_workflow

MARKS = Path({marks!r})
(MARKS / f"import-{{os.getpid()}}").touch()  # who loads this file


def hold(ctx):
    (MARKS / f"node-{{os.getpid()}}").touch()  # who runs the node
    with open(ctx.input["ready"], "w") as ready:
        ready.write("in node")
    with open(ctx.input["release"]) as release:  # blocks until the test writes
        release.read()
    return {{"ok": True}}


workflow = define_workflow(name="marked", start_at="hold", nodes={{"hold": compute(hold)}})
"""


def _marks(folder: Path, kind: str) -> set[int]:
    return {int(path.name.split("-", 1)[1]) for path in folder.glob(f"{kind}-*")}


def _open_state_files(process: psutil.Process, state_dir: Path) -> list[str]:
    try:
        paths = [entry.path for entry in process.open_files()]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
    return [path for path in paths if path.startswith(str(state_dir / "state.sqlite"))]


def test_workflow_code_runs_only_in_children_and_only_the_server_opens_the_database(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project, marks = short_tmp / "project", short_tmp / "marks"
    marks.mkdir()
    write_workflow(project, "marked", MARKED.format(marks=str(marks)))
    ready, release = short_tmp / "ready.fifo", short_tmp / "release.fifo"
    os.mkfifo(ready)
    os.mkfifo(release)
    state_dir = running_server.state_dir
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        gate = {"ready": str(ready), "release": str(release)}
        run_id = start_run(client, project, "marked", gate)
        assert wait_fifo(ready) == "in node"
        server = psutil.Process()
        children = server.children(recursive=True)
        assert _open_state_files(server, state_dir), "the server holds the live database"
        holders = {child.pid: _open_state_files(child, state_dir) for child in children}
        assert not any(holders.values()), f"a child opened the live database: {holders}"
        runner = _marks(marks, "node")
        assert len(runner) == 1 and runner <= {child.pid for child in children}
        with open(release, "w") as gate_file:
            gate_file.write("go")
        assert wait_for(client, run_id, TERMINAL)["display"]["status"] == "completed"
    importers = _marks(marks, "import")
    assert importers, "the workflow file was loaded (by the start's resolver and the runner)"
    assert os.getpid() not in importers | runner, "the server never loads workflow code"


def test_no_module_outside_storage_opens_sqlite_except_the_backup_check() -> None:
    """By construction: `sqlite3` is imported by `storage` and by `state verify --backup`,
    which opens an inactive copy read-only; no TypeScript part mentions SQLite at all."""
    importers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"^\s*(import sqlite3|from sqlite3 )", path.read_text(), re.MULTILINE)
    )
    outside = [name for name in importers if not name.startswith("storage/")]
    assert outside == ["cli/_backup.py"], outside
    typescript = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.ts")
        if re.search(r"sqlite3?['\"]|better-sqlite|node:sqlite", path.read_text())
    ]
    assert typescript == [], typescript


SERVE_ONE_RUN = """
import sys
import threading
import time
from pathlib import Path

from pi_workflows import WorkflowClient, WorkflowServer

state_dir, project = Path(sys.argv[1]), sys.argv[2]
TERMINAL = {"completed", "failed", "cancelled", "timed_out"}
server = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
server.start()
try:
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        run_id = client.call("run.start", {"workflow": "echo", "projectPath": project})[
            "receipt"]["runId"]
        deadline = time.monotonic() + 60
        while True:  # a condition, polled: this process has no test helpers
            status = client.call("run.get", run_id=run_id)["receipt"]
            if status["display"]["status"] in TERMINAL or time.monotonic() > deadline:
                break
            threading.Event().wait(0.05)
finally:
    server.stop("done")
executing = sorted(m for m in ("pi_workflows.engine.runner", "pi_workflows.engine._pi_child",
                               "pi_workflows.engine._warm") if m in sys.modules)
print(status["display"]["status"], executing)
"""


def test_a_server_process_completes_a_run_without_loading_the_node_executor(
    short_tmp: Path,
) -> None:
    """Conformance 34: no embedded execution fallback. A fresh process that embeds the
    server and completes a run never imports the modules that execute nodes; only its
    runner children do."""
    project = short_tmp / "project"
    write_workflow(project, "echo")
    done = subprocess.run(
        [sys.executable, "-c", SERVE_ONE_RUN, str(short_tmp / "agent" / "workflows"), str(project)],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
        env=dict(os.environ, PI_CODING_AGENT_DIR=str(short_tmp / "agent")),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["completed", "[]"], done.stdout
