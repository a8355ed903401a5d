"""`/resource-manager` in the real `pi --mode rpc` with the extension, against a real
server (issue 28, item 9): a resource applied from Pi is the server's resource of Pi's
project, as the CLI sees it, and `/resource-manager list` and `get` show it.

One real pi; the manager is a real file in the project's `.pi/resource-managers/`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowServer
from pi_workflows.testing import FakeProvider
from tests.conftest import Processes
from tests.pi.agents import running_server
from tests.pi.test_extension_commands import Rig
from tests.server.test_resource_manager_cli import write_manager

pytestmark = pytest.mark.timeout(120)

SECRET = "spec-value-never-shown"


@pytest.fixture
def rig(pi_binary: Path, provider: FakeProvider, pi_slot: None, short_tmp: Path) -> Iterator[Rig]:
    for folder in ("project", "tmp"):
        (short_tmp / folder).mkdir()
    provider.write_agent_dir(short_tmp / "agent")
    provider.script()  # no model turn is expected: commands never prompt the model
    write_manager(short_tmp / "project", "review")
    setup = Rig(short_tmp, provider, pi_binary, [])
    try:
        yield setup
    finally:
        for child in setup.children:
            child.stop()  # by PID: pi's keeper and its group


@pytest.fixture
def server(rig: Rig) -> Iterator[WorkflowServer]:
    with running_server(rig.state_dir) as instance:
        yield instance


def _cli_json(processes: Processes, rig: Rig, *args: str) -> Any:
    done = processes.cli(rig.state_dir, "resource-manager", *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_resource_manager_applies_in_pis_project_and_lists_it(
    rig: Rig, server: WorkflowServer, processes: Processes
) -> None:
    origin = rig.spawn()
    project = str(rig.project.resolve())

    applied = origin.notice('/resource-manager apply review pr-7 {"pr": 7}', level="info")
    assert applied == "review/pr-7 generation 1 version 1 (created)"

    # The server holds it, in Pi's project, as the CLI in that project names it.
    view = _cli_json(processes, rig, "get", "review", "pr-7", "--project", project)
    resource = view["resource"]
    assert (resource["project"], resource["spec"], resource["generation"]) == (
        project,
        {"pr": 7},
        1,
    )
    assert resource["status"] == {"phase": "new", "pr": 7}

    listed = origin.notice("/resource-manager list", level="info")
    assert re.fullmatch(
        r"review/pr-7  gen 1 \(observed [01]\)  Ready not reported  updated \S+ \S+Z  .+",
        listed,
    ), listed
    everywhere = origin.notice("/resource-manager list all", level="info")
    assert everywhere.startswith("review/pr-7  gen 1") and everywhere.endswith(f"  in {project}")

    shown = origin.notice("/resource-manager get review pr-7", level="info").splitlines()
    assert re.fullmatch(r"review/pr-7  gen 1 \(observed [01]\)  version \d+", shown[0]), shown
    assert "conditions: none" in shown and "child runs: none" in shown, shown

    # A new spec raises the generation; the same spec again changes nothing.
    changed = origin.notice('/resource-manager apply review pr-7 {"pr": 8}', level="info")
    assert re.fullmatch(r"review/pr-7 generation 2 version \d+ \(new spec\)", changed), changed
    again = origin.notice('/resource-manager apply review pr-7 {"pr": 8}', level="info")
    assert re.fullmatch(r"review/pr-7 generation 2 version \d+ \(unchanged\)", again), again

    # Refusals are clear and never show the spec: bad JSON here, the schema at the server.
    bad = origin.notice(f'/resource-manager apply review pr-7 {{"pr": "{SECRET}"', level="error")
    assert bad.startswith("The spec is not valid JSON") and SECRET not in bad, bad
    refused = origin.notice(
        f'/resource-manager apply review pr-7 {{"pr": "{SECRET}"}}', level="error"
    )
    assert refused.startswith("review/pr-7: rejected (specInvalid)") and SECRET not in refused
    missing = origin.notice("/resource-manager get review pr-9", level="error")
    assert missing.startswith("review/pr-9: notFound (resourceNotFound)"), missing

    queued = origin.notice("/resource-manager reconcile review pr-7", level="info")
    assert re.fullmatch(r"review/pr-7 queued, due \S+ \S+Z", queued), queued
    assert origin.notice("/resource-manager delete review pr-7", level="info") == (
        "review/pr-7 deleted"  # the manager has no finalizer: removed at once
    )
    assert _cli_json(processes, rig, "list")["resources"] == []
    assert origin.notice("/resource-manager list", level="info").startswith("No resources")
