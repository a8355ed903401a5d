"""One scheduler, two kinds: with workflow runs and reconciles both queued and capacity 2,
the admissions alternate (workflow-server.md § Worker scheduling).

Every workflow node and every pass writes a `started-NAME` file and then waits for its
`go-NAME` file, so the test frees exactly one slot at a time and reads which kind took
it: the order is observed, never timed.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.domain import ApplyResource
from pi_workflows.testing import perform_with_calls
from tests.conftest import write_workflow
from tests.server.runs import start_run

pytestmark = pytest.mark.timeout(120)

WAIT_S = 60.0

GATED_WORKFLOW = """
import os, time

from pi_workflows import compute, define_workflow


def gated(ctx):
    folder, name = ctx.input["dir"], ctx.input["name"]
    # Written whole, then named: the test never reads a started file still empty.
    with open(os.path.join(folder, ".part-" + name), "w") as f:
        f.write("workflow")
    os.replace(os.path.join(folder, ".part-" + name), os.path.join(folder, "started-" + name))
    while not os.path.exists(os.path.join(folder, "go-" + name)):
        time.sleep(0.05)
    return {}


workflow = define_workflow(
    name="gated", start_at="wait", nodes={"wait": compute(gated, timeout=600)}
)
"""

GATED_MANAGER = """
import os, time
from pi_workflows.resource_managers import define_resource_manager


def reconcile(ctx):
    folder, name = ctx.resource.spec["dir"], ctx.resource.spec["name"]
    # Written whole, then named: the test never reads a started file still empty.
    with open(os.path.join(folder, ".part-" + name), "w") as f:
        f.write("resource")
    os.replace(os.path.join(folder, ".part-" + name), os.path.join(folder, "started-" + name))
    while not os.path.exists(os.path.join(folder, "go-" + name)):
        time.sleep(0.05)
    return ctx.settled(status={"done": True})


resource_manager = define_resource_manager(
    name="gated", initial_status=lambda spec: {}, reconcile=reconcile
)
"""


@pytest.fixture
def project(short_tmp: Path) -> Path:
    folder = short_tmp / "project"
    (folder / ".pi" / "resource-managers").mkdir(parents=True)
    write_workflow(folder, "gated", GATED_WORKFLOW)
    return folder


@pytest.fixture
def server(state_dir: Path) -> Iterator[WorkflowServer]:
    instance = WorkflowServer(
        state_dir,
        idle_exit_s=None,
        tick_s=0.05,
        execute_runs=True,
        max_workers=2,
        units=perform_with_calls,
    )
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown")


def _started(folder: Path) -> set[str]:
    return {path.name.removeprefix("started-") for path in folder.glob("started-*")}


def _wait_started(folder: Path, count: int) -> set[str]:
    """Wait until `count` gated things started; returns their names."""
    deadline = time.monotonic() + WAIT_S
    pause = threading.Event()
    while len(names := _started(folder)) < count:
        assert time.monotonic() < deadline, f"only {sorted(names)} started"
        pause.wait(0.05)
    return names


def _apply(server: WorkflowServer, project: Path, gates: Path, name: str) -> None:
    path = project / ".pi" / "resource-managers" / "gated.resource_manager.py"
    data = GATED_MANAGER.encode()
    path.write_bytes(data)
    server.call_database(
        ApplyResource(
            manager="gated",
            project_path=str(project),
            key=name,
            spec={"dir": str(gates), "name": name},
            initial_status={},
            source_identity={"kind": "file", "path": str(path)},
            source_digest="sha256:" + hashlib.sha256(data).hexdigest(),
        )
    )


def test_workflow_and_resource_admissions_alternate_when_both_wait(
    server: WorkflowServer, project: Path, short_tmp: Path
) -> None:
    gates = short_tmp / "gates"
    gates.mkdir()
    with WorkflowClient(server.state_dir, autostart=False, timeout=60) as client:

        def run(name: str) -> None:
            start_run(client, project, "gated", {"dir": str(gates), "name": name})

        # Two workflow runs hold both slots: everything queued next waits for a slot.
        run("b1")
        run("b2")
        assert _wait_started(gates, 2) == {"b1", "b2"}
        run("w1")
        run("w2")
        _apply(server, project, gates, "r1")
        _apply(server, project, gates, "r2")

        order: list[str] = []
        for release in ("b1", "b2", "r1", "w1"):  # one slot frees at a time
            before = _started(gates)
            (gates / f"go-{release}").touch()
            [admitted] = _wait_started(gates, len(before) + 1) - before
            order.append(admitted)
            assert len(_started(gates)) == len(before) + 1, "one freed slot, one admission"

    kinds = [(gates / f"started-{name}").read_text() for name in order]
    # The workflow blockers were admitted last, so a reconcile goes next; then the kinds
    # take turns while both wait (after r2 only w2 is left, which comes last).
    assert kinds == ["resource", "workflow", "resource", "workflow"], order
