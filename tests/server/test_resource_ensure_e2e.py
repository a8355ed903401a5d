"""`ctx.workflows.ensure` and `ctx.effects.ensure` end to end: a manager's pass in a
resource runner child of a real server asks over its private channel.

A child run is reserved and queued in one transaction, runs through the normal queue
and runners, and its completion enqueues the parent again, whose next pass reads the
child's output; a later pass finds the same run ID. An effect is recorded before it is
applied: a resource runner killed after `apply` wrote its line leaves the effect in
flight, and the next pass observes it first, so the ledger holds exactly one line.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowServer
from tests.conftest import Processes, write_workflow
from tests.server.conftest import running_server  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(150)

WAIT_S = 90.0

DOUBLE = """\
from pi_workflows import compute, define_workflow


workflow = define_workflow(
    name="double",
    start_at="work",
    nodes={"work": compute(lambda ctx: {"doubled": 2 * ctx.input["n"]})},
)
"""

PARENT = textwrap.dedent(
    """\
    from pi_workflows.resource_managers import define_resource_manager


    def reconcile(ctx):
        n = ctx.resource.spec["n"]
        child = ctx.workflows.ensure(
            request_key=f"double/{ctx.resource.generation}", workflow="double", input={"n": n}
        )
        if not child.finished:
            # The child's completion enqueues this resource again.
            return ctx.settled(status={"phase": "waiting", "runId": child.run_id})
        return ctx.settled(
            status={"phase": child.state, "runId": child.run_id, "output": child.output}
        )


    resource_manager = define_resource_manager(
        name="parent",
        initial_status=lambda spec: {"phase": "new"},
        reconcile=reconcile,
    )
    """
)

LEDGER = textwrap.dedent(
    """\
    import os
    import time

    from pi_workflows.resource_managers import NOT_APPLIED, define_resource_manager

    LEDGER = __LEDGER__
    PID = __PID__


    def apply(key, request):
        first = not os.path.exists(LEDGER)
        with open(LEDGER, "a") as ledger:
            ledger.write(key + "\\n")
        if first:  # the test kills this resource runner here, before the settlement
            with open(PID + ".tmp", "w") as out:
                out.write(str(os.getpid()))
            os.rename(PID + ".tmp", PID)
            time.sleep(300)
        return {"line": key}


    def observe(key, request):
        with open(LEDGER) as ledger:
            lines = ledger.read().split()
        return {"line": key, "observed": True} if key in lines else NOT_APPLIED


    def reconcile(ctx):
        effect = ctx.effects.ensure(
            key="note/1", kind="ledger.write", request={"line": 1}, observe=observe, apply=apply
        )
        return ctx.settled(status={"effect": effect.state, "result": effect.result})


    resource_manager = define_resource_manager(
        name="ledger",
        initial_status=lambda spec: {"effect": None},
        reconcile=reconcile,
    )
    """
)


def _manager(project: Path, name: str, source: str) -> None:
    folder = project / ".pi" / "resource-managers"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.resource_manager.py").write_text(source)


def _cli_json(processes: Processes, state_dir: Path, *args: str) -> dict[str, Any]:
    done = processes.cli(state_dir, *args, "--json")
    assert done.returncode == 0, done.stderr
    shown: dict[str, Any] = json.loads(done.stdout)
    return shown


def _until(check: Callable[[], dict[str, Any] | None], what: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while (found := check()) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)  # polling the CLI, a separate process, for a condition
    return found


def test_a_child_run_completes_and_wakes_its_parent_which_settles_with_its_output(
    running_server: WorkflowServer,  # noqa: F811
    processes: Processes,
    short_tmp: Path,
) -> None:
    state_dir, project = running_server.state_dir, short_tmp / "project"
    write_workflow(project, "double", DOUBLE)
    _manager(project, "parent", PARENT)

    def get() -> dict[str, Any]:
        return _cli_json(
            processes, state_dir, "resource-manager", "get", "parent", "k", "--project",
            str(project),
        )  # fmt: skip

    def apply() -> None:
        done = processes.cli(
            state_dir, "resource-manager", "apply", "parent", "k", "--spec-json",
            json.dumps({"n": 21}), "--project", str(project),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    apply()
    done = _until(
        lambda: shown if (shown := get())["resource"]["status"].get("phase") == "done" else None,
        "the parent to settle with its child's output",
    )
    status = done["resource"]["status"]
    assert status["output"] == {"doubled": 42}
    [child] = done["childRuns"]
    assert child["runId"] == status["runId"] and child["status"] == "completed"
    runs = _cli_json(processes, state_dir, "run", "list")
    assert [item["runId"] for item in runs["items"]] == [child["runId"]], "one real run"
    view = _cli_json(processes, state_dir, "run", "show", child["runId"])
    assert view["parentResource"] == {"manager": "parent", "key": "k", "requestKey": "double/1"}

    passes = len(done["recentPasses"])
    done2 = processes.cli(
        state_dir, "resource-manager", "reconcile", "parent", "k", "--project", str(project)
    )
    assert done2.returncode == 0, done2.stderr
    again = _until(
        lambda: shown if len((shown := get())["recentPasses"]) > passes else None,
        "another pass",
    )
    assert [c["runId"] for c in again["childRuns"]] == [child["runId"]], "the same run"
    assert again["resource"]["status"]["runId"] == child["runId"]
    runs = _cli_json(processes, state_dir, "run", "list")
    assert len(runs["items"]) == 1, "a repeated pass starts no second child"


def test_a_killed_resource_runner_leaves_its_effect_observed_first_never_applied_twice(
    running_server: WorkflowServer,  # noqa: F811
    processes: Processes,
    short_tmp: Path,
) -> None:
    state_dir, project = running_server.state_dir, short_tmp / "project"
    ledger, pid_file = short_tmp / "ledger.txt", short_tmp / "runner.pid"
    source = LEDGER.replace("__LEDGER__", repr(str(ledger))).replace("__PID__", repr(str(pid_file)))
    _manager(project, "ledger", source)
    done = processes.cli(
        state_dir, "resource-manager", "apply", "ledger", "k", "--spec-json", "{}",
        "--project", str(project),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    deadline = time.monotonic() + WAIT_S
    while not pid_file.exists():
        assert time.monotonic() < deadline, "apply never ran"
        time.sleep(0.05)  # the manager's apply announces itself through a file
    os.kill(int(pid_file.read_text()), signal.SIGKILL)

    def settled() -> dict[str, Any] | None:
        shown = _cli_json(
            processes, state_dir, "resource-manager", "get", "ledger", "k", "--project",
            str(project),
        )  # fmt: skip
        return shown if shown["resource"]["status"].get("effect") == "applied" else None

    shown = _until(settled, "a pass that observes the effect")
    assert shown["resource"]["status"]["result"] == {"line": "note/1", "observed": True}
    assert ledger.read_text().split() == ["note/1"], "apply ran exactly once"
    [effect] = shown["effects"]
    assert (effect["key"], effect["state"]) == ("note/1", "applied")
    errors = [p["errorClass"] for p in shown["recentPasses"] if p["outcome"] == "error"]
    assert errors, "the killed pass is an error pass"
