"""Resource passes that really run: a resource runner child per pass, the claim, the
deadline, crashes and backoff, through an embedded server and its database actor."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows import WorkflowServer
from pi_workflows.actors import RECONCILE_DEADLINE_ENV
from pi_workflows.domain import ApplyResource, DeleteResource, EnqueueResource, ResourceView
from pi_workflows.storage import ResourceNotFoundError
from pi_workflows.testing import perform_with_calls
from tests.server.runs import wait_fifo

pytestmark = pytest.mark.timeout(90)

WAIT_S = 45.0

GREET = """
from pi_workflows.resource_managers import condition_true, define_resource_manager

def reconcile(ctx):
    name = ctx.resource.spec["name"]
    return ctx.settled(
        status={"greeting": "hello " + name},
        conditions=[condition_true("Ready", "Greeted", "said hello")],
    )

resource_manager = define_resource_manager(
    name="greet", initial_status=lambda spec: {}, reconcile=reconcile
)
"""

POLLER = """
import os
from pi_workflows.resource_managers import condition_true, define_resource_manager

def reconcile(ctx):
    log = os.path.join(ctx.resource.spec["dir"], "passes")
    with open(log, "a") as f:
        f.write("pass\\n")
    with open(log) as f:
        count = len(f.readlines())
    if count < 2:
        return ctx.requeue_after(0.4)
    return ctx.settled(status={"passes": count}, conditions=[condition_true("Ready", "Polled")])

resource_manager = define_resource_manager(
    name="poller", initial_status=lambda spec: {}, reconcile=reconcile
)
"""

FLAKY = """
from pi_workflows.resource_managers import define_resource_manager

def reconcile(ctx):
    raise RuntimeError("private detail " + ctx.resource.spec["secret"])

resource_manager = define_resource_manager(
    name="flaky", initial_status=lambda spec: {}, reconcile=reconcile
)
"""

FOREVER = """
import os, time
from pi_workflows.resource_managers import define_resource_manager

def reconcile(ctx):
    with open(os.path.join(ctx.resource.spec["dir"], "pid"), "a") as f:
        f.write(f"{os.getpid()}\\n")
    while True:  # ignores ctx.deadline on purpose
        time.sleep(0.05)

resource_manager = define_resource_manager(
    name="forever", initial_status=lambda spec: {}, reconcile=reconcile
)
"""

BLOCKER = """
import os, time
from pi_workflows.resource_managers import condition_true, define_resource_manager

def reconcile(ctx):
    folder = ctx.resource.spec["dir"]
    if os.path.exists(os.path.join(folder, "killed")):
        return ctx.settled(status={"after": "kill"}, conditions=[condition_true("Ready", "Ok")])
    with open(os.path.join(folder, "fifo"), "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(0.05)

resource_manager = define_resource_manager(
    name="blocker", initial_status=lambda spec: {}, reconcile=reconcile
)
"""

SLOW = """
import os, time
from pi_workflows.resource_managers import define_resource_manager

def reconcile(ctx):
    log = os.path.join(ctx.resource.spec["dir"], "passes")
    with open(log, "a") as f:
        f.write(f"enter {os.getpid()}\\n")
    time.sleep(0.2)
    with open(log, "a") as f:
        f.write(f"exit {os.getpid()}\\n")
    with open(log) as f:
        count = sum(1 for line in f if line.startswith("exit"))
    if count < 4:
        return ctx.requeue()
    return ctx.settled(status={"passes": count})

resource_manager = define_resource_manager(
    name="slow", initial_status=lambda spec: {}, reconcile=reconcile
)
"""

CLEANER = """
import os
from pi_workflows.resource_managers import condition_true, define_resource_manager

def reconcile(ctx):
    if ctx.resource.deletion_requested:
        with open(os.path.join(ctx.resource.spec["dir"], "cleanups"), "a") as f:
            f.write("cleanup\\n")
        ctx.remove_finalizer("worktree")
        return ctx.settled(status={"cleaned": True})
    ctx.add_finalizer("worktree")
    return ctx.settled(status={"made": True}, conditions=[condition_true("Ready", "Made")])

resource_manager = define_resource_manager(
    name="cleaner", initial_status=lambda spec: {}, reconcile=reconcile
)
"""


@pytest.fixture
def project(short_tmp: Path) -> Path:
    folder = short_tmp / "project"
    (folder / ".pi" / "resource-managers").mkdir(parents=True)
    return folder


@pytest.fixture
def reconciling_server(state_dir: Path) -> Iterator[WorkflowServer]:
    instance = WorkflowServer(
        state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True, units=perform_with_calls
    )
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown")


def write_manager(project: Path, name: str, source: str) -> tuple[Path, str]:
    path = project / ".pi" / "resource-managers" / f"{name}.resource_manager.py"
    data = source.encode()
    path.write_bytes(data)
    return path, "sha256:" + hashlib.sha256(data).hexdigest()


def apply(
    server: WorkflowServer, project: Path, name: str, spec: Any, source: tuple[Path, str]
) -> None:
    path, digest = source
    server.call_database(
        ApplyResource(
            manager=name,
            project_path=str(project),
            key="k1",
            spec=spec,
            initial_status={},
            source_identity={"kind": "file", "path": str(path)},
            source_digest=digest,
        )
    )


def view(server: WorkflowServer, project: Path, name: str) -> dict[str, Any]:
    return dict(server.call_database(ResourceView(name, str(project), "k1")))


def wait_view(
    server: WorkflowServer, project: Path, name: str, check: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Read the resource until `check` holds (each read is a committed state)."""
    deadline = time.monotonic() + WAIT_S
    pause = threading.Event()
    while True:
        current = view(server, project, name)
        if check(current):
            return current
        assert time.monotonic() < deadline, f"condition never held: {current}"
        pause.wait(0.05)


def outcomes(current: dict[str, Any]) -> list[tuple[str, str | None]]:
    """The passes, oldest first: (outcome, error class)."""
    return [(p["outcome"], p["errorClass"]) for p in reversed(current["recentPasses"])]


def test_a_pass_runs_in_a_child_and_its_settled_status_and_conditions_commit(
    reconciling_server: WorkflowServer, project: Path
) -> None:
    source = write_manager(project, "greet", GREET)
    apply(reconciling_server, project, "greet", {"name": "ada"}, source)
    current = wait_view(reconciling_server, project, "greet", lambda v: bool(v["recentPasses"]))
    resource = current["resource"]
    assert outcomes(current) == [("settled", None)]
    assert resource["status"] == {"greeting": "hello ada"}
    assert resource["observedGeneration"] == resource["generation"] == 1
    [ready] = resource["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Greeted")
    assert current["queue"] is None  # settled: nothing is due until a wake-up


def test_requeue_after_schedules_a_later_pass(
    reconciling_server: WorkflowServer, project: Path
) -> None:
    source = write_manager(project, "poller", POLLER)
    apply(reconciling_server, project, "poller", {"dir": str(project)}, source)
    current = wait_view(
        reconciling_server, project, "poller", lambda v: v["resource"]["status"] != {}
    )
    assert outcomes(current) == [("requeueAfter", None), ("settled", None)]
    first, second = reversed(current["recentPasses"])
    assert second["startedAt"] - (first["startedAt"] + first["durationMs"]) >= 400
    assert current["resource"]["status"] == {"passes": 2}


def test_a_manager_that_raises_backs_off_with_growing_gaps_and_no_message(
    reconciling_server: WorkflowServer, project: Path
) -> None:
    source = write_manager(project, "flaky", FLAKY)
    apply(reconciling_server, project, "flaky", {"secret": "hunter2"}, source)
    current = wait_view(reconciling_server, project, "flaky", lambda v: len(v["recentPasses"]) >= 3)
    passes = list(reversed(current["recentPasses"]))[:3]
    assert [p["errorClass"] for p in passes] == ["RuntimeError"] * 3
    # Equal-jitter backoff from 1 s: each delay is at least half its doubling ceiling.
    for earlier, later, at_least in ((passes[0], passes[1], 500), (passes[1], passes[2], 1000)):
        assert later["startedAt"] - (earlier["startedAt"] + earlier["durationMs"]) >= at_least
    assert current["queue"]["retries"] >= 3 or len(current["recentPasses"]) > 3
    assert "hunter2" not in repr(current["recentPasses"]) + repr(current["queue"])


def test_a_pass_that_ignores_its_deadline_is_killed_and_requeued(
    state_dir: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RECONCILE_DEADLINE_ENV, "2")
    source = write_manager(project, "forever", FOREVER)
    pids = project / "pid"
    with WorkflowServer(
        state_dir, idle_exit_s=None, tick_s=0.05, units=perform_with_calls
    ) as server:
        apply(server, project, "forever", {"dir": str(project)}, source)
        # On a loaded machine a pass may be stopped before its code even ran: the pass
        # that wrote its PID is stopped at its deadline too, whatever its code does.
        current = wait_view(
            server, project, "forever", lambda v: pids.exists() and bool(v["recentPasses"])
        )
        assert set(outcomes(current)) == {("error", "deadlineExceeded")}
        assert current["queue"] is not None and current["queue"]["retries"] >= 1
        pid = int(pids.read_text().split()[0])
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).wait(timeout=WAIT_S)  # stopped, whatever its code does


def test_a_runner_killed_mid_pass_fails_that_pass_and_the_next_one_settles(
    reconciling_server: WorkflowServer, project: Path
) -> None:
    os.mkfifo(project / "fifo")
    source = write_manager(project, "blocker", BLOCKER)
    apply(reconciling_server, project, "blocker", {"dir": str(project)}, source)
    pid = int(wait_fifo(project / "fifo", timeout=WAIT_S))
    (project / "killed").touch()
    os.kill(pid, signal.SIGKILL)
    current = wait_view(
        reconciling_server, project, "blocker", lambda v: bool(v["resource"]["conditions"])
    )
    assert outcomes(current) == [("error", "runnerExited"), ("settled", None)]
    assert current["resource"]["status"] == {"after": "kill"}


def test_two_passes_of_one_key_never_run_at_once(
    reconciling_server: WorkflowServer, project: Path
) -> None:
    source = write_manager(project, "slow", SLOW)
    apply(reconciling_server, project, "slow", {"dir": str(project)}, source)
    for _ in range(5):  # wake-up hints while passes run: they never start a second pass
        reconciling_server.call_database(EnqueueResource("slow", str(project), "k1", "test"))
    wait_view(reconciling_server, project, "slow", lambda v: v["resource"]["status"] != {})
    lines = (project / "passes").read_text().split()
    events = list(zip(lines[::2], lines[1::2], strict=True))
    assert len(events) >= 8
    for index in range(0, len(events), 2):
        (enter, pid_in), (leave, pid_out) = events[index], events[index + 1]
        assert (enter, leave) == ("enter", "exit") and pid_in == pid_out


def test_a_manager_file_changed_after_apply_refuses_to_run(
    reconciling_server: WorkflowServer, project: Path
) -> None:
    path, digest = write_manager(project, "greet", GREET)
    path.write_text(GREET.replace("hello", "goodbye"))
    apply(reconciling_server, project, "greet", {"name": "ada"}, (path, digest))
    current = wait_view(reconciling_server, project, "greet", lambda v: bool(v["recentPasses"]))
    assert outcomes(current)[0] == ("error", "sourceChanged")
    assert current["resource"]["status"] == {}


def test_a_pass_cut_by_a_server_stop_runs_again_after_the_restart(
    state_dir: Path, project: Path
) -> None:
    os.mkfifo(project / "fifo")
    source = write_manager(project, "blocker", BLOCKER)
    with WorkflowServer(
        state_dir, idle_exit_s=None, tick_s=0.05, units=perform_with_calls
    ) as first:
        apply(first, project, "blocker", {"dir": str(project)}, source)
        pid = int(wait_fifo(project / "fifo", timeout=WAIT_S))
        (project / "killed").touch()  # the next pass settles
    # The stop killed the child and left its claim; recovery step 7 returns it.
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    with WorkflowServer(
        state_dir, idle_exit_s=None, tick_s=0.05, units=perform_with_calls
    ) as second:
        current = wait_view(second, project, "blocker", lambda v: bool(v["resource"]["conditions"]))
        assert outcomes(current) == [("settled", None)]
        assert current["resource"]["status"] == {"after": "kill"}


def test_a_resource_past_one_frame_is_an_error_pass_not_a_crash(
    reconciling_server: WorkflowServer, project: Path
) -> None:
    path, digest = write_manager(project, "greet", GREET)
    reconciling_server.call_database(
        ApplyResource(
            manager="greet",
            project_path=str(project),
            key="k1",
            spec={"name": "x" * 600_000},
            initial_status={"blob": "y" * 600_000},
            source_identity={"kind": "file", "path": str(path)},
            source_digest=digest,
        )
    )
    current = wait_view(reconciling_server, project, "greet", lambda v: bool(v["recentPasses"]))
    assert outcomes(current)[0] == ("error", "resourceTooLarge")
    assert reconciling_server.running


def test_deletion_with_a_finalizer_runs_the_cleanup_pass_once_then_removes_the_resource(
    reconciling_server: WorkflowServer, project: Path, state_dir: Path
) -> None:
    source = write_manager(project, "cleaner", CLEANER)
    apply(reconciling_server, project, "cleaner", {"dir": str(project)}, source)
    made = wait_view(reconciling_server, project, "cleaner", lambda v: bool(v["recentPasses"]))
    assert made["resource"]["finalizers"] == ["worktree"]
    log = state_dir / "logs" / "resource-runners" / f"{made['resource']['uid']}.log"
    assert log.exists()
    reconciling_server.call_database(DeleteResource("cleaner", str(project), "k1"))
    deadline = time.monotonic() + WAIT_S
    pause = threading.Event()
    while True:  # marked for deletion, then removed by the cleanup pass's commit
        try:
            view(reconciling_server, project, "cleaner")
        except ResourceNotFoundError:
            break
        assert time.monotonic() < deadline, "the resource was never removed"
        pause.wait(0.05)
    assert (project / "cleanups").read_text().split() == ["cleanup"]
    assert not log.exists(), "a removed resource's pass log goes with it"
