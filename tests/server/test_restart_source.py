"""`run restart` of a finished run runs the workflow's current source (issue 24 item 2).

A failed run advises "fix the workflow, then restart": after the file is fixed, the
restart that `run show` printed, run as printed, makes a new run from the start whose
source identity is the fixed file's, and it completes with the fixed code; the failed
run keeps the identity it ran. The restart resolves the source the way `run.start` does
(a resolver child, or the definition cache), so a source that no longer loads, or no
longer exists, is refused and commits no run. Real server, runners and CLI processes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.conftest import Processes, write_workflow
from tests.server.runs import TERMINAL, start_run, wait_for

pytestmark = pytest.mark.timeout(120)

PIW = Path(sys.executable).parent / "pi-workflows"
RUN_ID = re.compile(r"\brun-[0-9a-f]{32}\b")

BROKEN = """
from pi_workflows import compute, define_workflow

def build(ctx):
    raise RuntimeError("the build script has a typo")

workflow = define_workflow(
    name="release", start_at="build", nodes={"build": compute(build)},
)
"""

FIXED = """
from pi_workflows import compute, define_workflow

def build(ctx):
    return {"built": ctx.input["version"], "fixed": True}

workflow = define_workflow(
    name="release", start_at="build", nodes={"build": compute(build)},
)
"""


def _identity(state_dir: Path, run_id: str) -> tuple[Any, str]:
    db = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        ((identity, digest),) = db.execute(
            "SELECT source_identity, definition_digest FROM runs WHERE run_id = ?", (run_id,)
        ).fetchall()
    finally:
        db.close()
    return json.loads(identity), str(digest)


def _advised(shown: str) -> list[str]:
    """The commands `run show` printed, one a line, as printed."""
    return [line.strip() for line in shown.splitlines() if line.strip().startswith("pi-workflows ")]


def _run_as_printed(state_dir: Path, command: str) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(command)
    assert argv[0] == "pi-workflows"
    return subprocess.run(
        [str(PIW), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PI_CODING_AGENT_DIR": str(state_dir.parent)},
    )


def test_a_restart_after_fixing_the_file_runs_the_fixed_code_as_the_failed_run_advised(
    running_server: WorkflowServer, short_tmp: Path, processes: Processes
) -> None:
    state_dir = running_server.state_dir
    project = short_tmp / "project"
    write_workflow(project, "release", BROKEN)
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        failed = start_run(client, project, "release", {"version": "1.2.0"})
        view = wait_for(client, failed, TERMINAL)
    assert view["display"]["status"] == "failed", view["display"]
    assert "a restart runs the current source" in view["display"]["action"]
    old_identity, old_digest = _identity(state_dir, failed)

    shown = processes.cli(state_dir, "run", "show", failed)
    assert shown.returncode == 0, shown.stderr
    restart = f"pi-workflows run restart {failed}"
    assert restart in _advised(shown.stdout), shown.stdout

    write_workflow(project, "release", FIXED)
    done = _run_as_printed(state_dir, restart)
    assert done.returncode == 0, done.stderr
    (new,) = [found for found in RUN_ID.findall(done.stdout) if found != failed]
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        finished = wait_for(client, new, TERMINAL)
        assert finished["display"]["status"] == "completed", finished["display"]
        assert finished["result"]["output"]["value"] == {"built": "1.2.0", "fixed": True}
        assert finished["lineage"]["restartOf"] == failed
        assert client.call("run.get", run_id=failed)["receipt"]["lineage"]["restartedBy"] == [new]
    new_identity, new_digest = _identity(state_dir, new)
    assert new_identity["root"]["path"] == old_identity["root"]["path"]
    assert new_identity["root"]["hash"] != old_identity["root"]["hash"], "the fixed file's"
    assert new_digest == old_digest, "the same graph: only the function's code changed"
    assert _identity(state_dir, failed) == (old_identity, old_digest), "the old run keeps its own"


def test_a_restart_refuses_a_source_that_no_longer_loads_and_commits_no_run(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    state_dir = running_server.state_dir
    project = short_tmp / "project"
    write_workflow(project, "release", FIXED)
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        done = start_run(client, project, "release", {"version": "1"})
        assert wait_for(client, done, TERMINAL)["display"]["status"] == "completed"

        write_workflow(project, "release", "this is not python(")
        broken = client.request("run.restart", run_id=done)
        assert broken["outcome"] == "rejected", broken
        assert broken["error"]["code"] == "definitionInvalid"

        (project / ".pi" / "workflows" / "release.workflow.py").unlink()
        missing = client.request("run.restart", run_id=done)
        assert missing["outcome"] == "rejected", missing
        assert missing["error"]["code"] == "workflowNotFound"

        write_workflow(
            project,
            "release",
            FIXED.replace(
                'name="release",',
                'name="release", input_schema={"type": "object", "required": ["v"]},',
            ),
        )
        refused = client.request("run.restart", run_id=done)
        assert refused["outcome"] == "rejected", refused
        assert refused["error"]["code"] == "inputInvalid", "the old input, checked anew"

        runs = [item["runId"] for item in client.call("run.list")["receipt"]["items"]]
        assert runs == [done], "no refused restart made a run"
        again = client.request("run.restart", run_id=done, idempotency_key="k")
        repeat = client.request("run.restart", run_id=done, idempotency_key="k")
        assert (again["outcome"], repeat["outcome"]) == ("rejected", "rejected")
        assert repeat["error"] == again["error"], "a retry gets the stored refusal"


def test_a_restart_of_an_unfinished_or_missing_run_is_refused(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    state_dir = running_server.state_dir
    project = short_tmp / "project"
    write_workflow(
        project,
        "wait",
        "from pi_workflows import checkpoint, define_workflow\n"
        "workflow = define_workflow(name='wait', start_at='ask', "
        "nodes={'ask': checkpoint(summary='Go?')})\n",
    )
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        waiting = start_run(client, project, "wait")
        assert wait_for(client, waiting, {"waiting"} | TERMINAL)["display"]["status"] == "waiting"
        refused = client.request("run.restart", run_id=waiting)
        assert (refused["outcome"], refused["error"]["code"]) == ("rejected", "runNotTerminal")
        missing = client.request("run.restart", run_id="run-" + "0" * 32)
        assert (missing["outcome"], missing["error"]["code"]) == ("notFound", "runNotFound")
        no_id = client.request("run.restart", {})
        assert no_id["outcome"] == "rejected"
