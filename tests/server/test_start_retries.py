"""No workflow code for a retry (issue 11, item 10): `run.start` looks up its receipt first.

A retry with the same client ID, idempotency key and payload adopts the stored receipt
(the fingerprint covers the payload as sent, so it is known before resolving); another
payload under the same key is a conflict. Neither loads the workflow. The workflow
file appends a line to a file each time a process loads it, so the count is the number
of loads by any process. The runs are not executed (`--no-execute`): only resolver
children load the file.

The definition cache would also avoid a load, so each case proves the receipt path:
the cache is turned off (`PI_WORKFLOWS_DEFINITION_CACHE=0`), or it is on and the file is
edited before each retry (a cache miss, since the cache re-hashes every file).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient
from pi_workflows.server._definition_cache import CACHE_ENV
from tests.conftest import Processes, write_workflow

pytestmark = pytest.mark.timeout(180)

RETRIES = 20

COUNTED = """
from pathlib import Path

from pi_workflows import compute, define_workflow

with (Path(__file__).parent / "counted.loads").open("a") as loads:
    loads.write("loaded\\n")  # one line each time a process loads this workflow

workflow = define_workflow(
    name="counted",
    start_at="echo",
    input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
    nodes={"echo": compute(lambda ctx: {"echo": ctx.input})},
)
"""


@dataclass
class Daemon:
    state_dir: Path
    project: Path
    workflow: Path
    child: subprocess.Popen[str]

    def loads(self) -> int:
        path = self.workflow.parent / "counted.loads"
        return path.read_text().count("loaded") if path.exists() else 0

    def edit(self) -> None:
        """Change the file's bytes (not its behaviour): the definition cache misses."""
        with self.workflow.open("a") as file:
            file.write("# edited\n")


@pytest.fixture(params=["cache-off", "cache-on-file-edited"])
def daemon(
    request: pytest.FixtureRequest,
    processes: Processes,
    short_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Daemon]:
    monkeypatch.setenv(CACHE_ENV, "0" if request.param == "cache-off" else "1")
    state_dir = short_tmp / "agent" / "workflows"
    project = short_tmp / "project"
    workflow = write_workflow(project, "counted", COUNTED)
    child = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0", "--no-execute")
    assert child.stdout is not None
    line = child.stdout.readline()
    assert "running" in line, f"server did not start: {line!r}"
    yield Daemon(state_dir, project, workflow, child)


def _payload(daemon: Daemon, n: object) -> dict[str, object]:
    return {"workflow": "counted", "input": {"n": n}, "projectPath": str(daemon.project)}


def _retry(daemon: Daemon, client_id: str, key: str, n: object) -> list[dict[str, object]]:
    """`RETRIES` attempts, each on a new connection (a new request ID), as after a loss.

    The file is edited before each one, so none could be a definition cache hit.
    """
    answers = []
    for _ in range(RETRIES):
        daemon.edit()
        with WorkflowClient(daemon.state_dir, client_id=client_id, autostart=False) as client:
            answers.append(
                dict(client.request("run.start", _payload(daemon, n), idempotency_key=key))
            )
    return answers


def test_retries_of_a_start_adopt_its_receipt_and_load_no_workflow_code(daemon: Daemon) -> None:
    client_id = "retrying-client"
    with WorkflowClient(daemon.state_dir, client_id=client_id, autostart=False) as client:
        first = client.request("run.start", _payload(daemon, 1), idempotency_key="key-1")
    assert first["outcome"] == "accepted", first
    run_id = first["receipt"]["runId"]
    assert daemon.loads() == 1

    retries = _retry(daemon, client_id, "key-1", 1)
    assert {answer["outcome"] for answer in retries} == {"adopted"}
    assert {answer["receipt"]["runId"] for answer in retries} == {run_id}  # type: ignore[index]
    assert daemon.loads() == 1, "an adopted retry runs no workflow code"

    # Another payload under the same key: still a conflict, found without loading.
    with WorkflowClient(daemon.state_dir, client_id=client_id, autostart=False) as client:
        conflict = client.request("run.start", _payload(daemon, 2), idempotency_key="key-1")
        runs = client.call("run.list")["receipt"]["items"]
    assert conflict["outcome"] == "conflict", conflict
    assert conflict["error"]["code"] == "idempotencyConflict"
    assert [item["runId"] for item in runs] == [run_id], "exactly one run for the key"
    assert daemon.loads() == 1

    # The count is real: a new key resolves, and loads the (edited) file once more.
    with WorkflowClient(daemon.state_dir, client_id=client_id, autostart=False) as client:
        fresh = client.request("run.start", _payload(daemon, 1), idempotency_key="key-2")
    assert fresh["outcome"] == "accepted", fresh
    assert fresh["receipt"]["runId"] != run_id
    assert daemon.loads() == 2


def test_retries_of_a_refused_start_get_the_stored_refusal_without_loading(
    daemon: Daemon,
) -> None:
    client_id = "retrying-client"
    with WorkflowClient(daemon.state_dir, client_id=client_id, autostart=False) as client:
        first = client.request("run.start", _payload(daemon, "one"), idempotency_key="bad-1")
    assert first["outcome"] == "rejected", first
    assert first["error"]["code"] == "inputInvalid"
    assert daemon.loads() == 1

    retries = _retry(daemon, client_id, "bad-1", "one")
    assert {answer["outcome"] for answer in retries} == {"rejected"}
    assert all(answer["error"] == first["error"] for answer in retries)
    assert daemon.loads() == 1, "the stored refusal is the answer; no resolver ran"

    with WorkflowClient(daemon.state_dir, client_id=client_id, autostart=False) as client:
        conflict = client.request("run.start", _payload(daemon, 1), idempotency_key="bad-1")
    assert conflict["outcome"] == "conflict", conflict
    assert daemon.loads() == 1
