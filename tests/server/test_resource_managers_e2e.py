"""Resource managers end to end: `apply` through the CLI, a pass in a resource runner
child of a real server, and the settled status read back through `get`.

A spec change raises the generation, and the next pass stamps its conditions with the
generation it read, so a condition never claims readiness for a spec it did not see.
Manager code runs only in resource runner children, one per pass.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowServer
from tests.conftest import Processes
from tests.server.conftest import running_server  # noqa: F401 (a fixture)
from tests.server.test_resource_ensure_e2e import _cli_json, _manager, _until

pytestmark = pytest.mark.timeout(120)

READY = textwrap.dedent(
    """\
    import os

    from pi_workflows.resource_managers import condition_true, define_resource_manager


    def reconcile(ctx):
        with open(ctx.resource.spec["marks"], "a") as marks:  # who runs manager code
            marks.write(f"{os.getpid()}\\n")
        seen = ctx.resource.spec["pr"]
        return ctx.settled(
            status={"phase": "reviewed", "pr": seen},
            conditions=[condition_true("Ready", "Reviewed", message=f"pr {seen}")],
        )


    resource_manager = define_resource_manager(
        name="review",
        initial_status=lambda spec: {"phase": "new", "pr": spec["pr"]},
        reconcile=reconcile,
        spec_schema={"type": "object", "required": ["pr"]},
    )
    """
)


def _get(processes: Processes, state_dir: Path, project: Path) -> dict[str, Any]:
    return _cli_json(
        processes, state_dir, "resource-manager", "get", "review", "pr", "--project", str(project)
    )


def test_apply_runs_a_pass_that_settles_and_a_new_spec_is_reconciled_again(
    running_server: WorkflowServer,  # noqa: F811
    processes: Processes,
    short_tmp: Path,
) -> None:
    state_dir, project = running_server.state_dir, (short_tmp / "project")
    _manager(project, "review", READY)

    marks = short_tmp / "reconciled-by"

    def apply(pr: int) -> None:
        spec = {"pr": pr, "marks": str(marks)}
        done = processes.cli(
            state_dir, "resource-manager", "apply", "review", "pr",
            "--spec-json", json.dumps(spec), "--project", str(project),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    def observed(generation: int) -> Callable[[], dict[str, Any] | None]:
        def check() -> dict[str, Any] | None:
            shown = _get(processes, state_dir, project)
            resource = shown["resource"]
            return shown if resource.get("observedGeneration") == generation else None

        return check

    apply(1)
    first = _until(observed(1), "the first pass")["resource"]
    assert first["status"] == {"phase": "reviewed", "pr": 1}
    [ready] = first["conditions"]
    assert (ready["type"], ready["status"], ready["observedGeneration"]) == ("Ready", "True", 1)

    apply(2)
    second = _until(observed(2), "the pass of the new spec")
    resource = second["resource"]
    assert resource["generation"] == 2 and resource["status"]["pr"] == 2
    assert [c["observedGeneration"] for c in resource["conditions"]] == [2]
    assert second["queue"] is None, "a settled resource leaves the queue"

    # Conformance bullet 33 for manager code: each pass ran in a child of its own, never
    # in the server (this test process hosts the embedded server).
    runners = [int(line) for line in marks.read_text().split()]
    assert len(runners) == 2 and len(set(runners)) == 2
    assert os.getpid() not in runners
