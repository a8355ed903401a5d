"""`pi-workflows resource-manager` and the `resourceManager.*` operations, end to end.

A real server (its socket, database actor and resolver children), the CLI as a child
process, and real manager files in a temporary project: apply (through the resolver
child), get, list, reconcile, delete; the same spec is a no-op and another raises the
generation; refusals name the rule, never the value or a path; a retried command adopts
its receipt; and the server's own source check refuses a file changed after resolution.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.cli._resource_manager import show_rich
from pi_workflows.domain import OperationContext, OperationError, apply_spec, resource_ref
from pi_workflows.domain._resource_ops import apply_resource_manager
from pi_workflows.engine import MAX_SPEC_BYTES, apply_answer
from pi_workflows.storage import Database, get_resource
from pi_workflows.wire.protocol import CLIENT_SCHEMA
from tests.conftest import Processes

pytestmark = pytest.mark.timeout(120)

SCHEMA = {
    "type": "object",
    "required": ["pr"],
    "properties": {"pr": {"type": "integer"}},
    "additionalProperties": False,
}


def manager_source(name: str, marker: str = "") -> str:
    return textwrap.dedent(
        f"""\
        from pi_workflows.resource_managers import condition_true, define_resource_manager
        # {marker}

        def initial_status(spec):
            return {{"phase": "new", "pr": spec["pr"]}}

        def reconcile(ctx):
            return ctx.settled(status=ctx.resource.status, conditions=[])

        resource_manager = define_resource_manager(
            name={name!r},
            initial_status=initial_status,
            reconcile=reconcile,
            spec_schema={SCHEMA!r},
        )
        """
    )


def write_manager(project: Path, name: str, marker: str = "") -> Path:
    folder = project / ".pi" / "resource-managers"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.resource_manager.py"
    path.write_text(manager_source(name, marker))
    return path


@pytest.fixture
def rm_project(short_tmp: Path) -> Path:
    project = short_tmp / "project"
    write_manager(project, "review")
    return project.resolve()


def cli(processes: Processes, server: WorkflowServer, project: Path, *args: str) -> Any:
    return processes.cli(server.state_dir, "resource-manager", *args, "--project", str(project))


def cli_json(processes: Processes, server: WorkflowServer, project: Path, *args: str) -> Any:
    done = cli(processes, server, project, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_apply_get_list_through_the_cli(
    server: WorkflowServer, processes: Processes, rm_project: Path
) -> None:
    applied = cli(
        processes, server, rm_project, "apply", "review", "pr-1", "--spec-json", '{"pr": 1}'
    )
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.strip() == "review/pr-1 generation 1 version 1 (created)"

    view = cli_json(processes, server, rm_project, "get", "review", "pr-1")
    resource = view["resource"]
    assert (resource["generation"], resource["resourceVersion"]) == (1, 1)
    assert resource["spec"] == {"pr": 1}
    assert resource["status"] == {"phase": "new", "pr": 1}
    assert resource["sourceDigest"].startswith("sha256:")
    assert view["queue"] is not None  # a new resource is queued for its first pass

    # The same spec again is a no-op: same version, same generation.
    again = cli_json(
        processes, server, rm_project, "apply", "review", "pr-1", "--spec-json", '{"pr": 1}'
    )
    assert (again["resourceVersion"], again["generation"], again["changed"]) == (1, 1, False)

    # Another spec raises the generation.
    changed = cli_json(
        processes, server, rm_project, "apply", "review", "pr-1", "--spec-json", '{"pr": 2}'
    )
    assert changed["generation"] == 2 and changed["specChanged"] is True
    assert changed["resourceVersion"] > 1

    listed = cli_json(processes, server, rm_project, "list")
    (item,) = listed["resources"]
    assert (item["manager"], item["key"], item["generation"]) == ("review", "pr-1", 2)
    plain = cli(processes, server, rm_project, "list")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.startswith("review/pr-1  gen 2 (observed 0)")

    shown = cli(processes, server, rm_project, "get", "review", "pr-1")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "resource review/pr-1"
    assert "  generation: 2 (observed 0)" in lines
    assert '  spec: {"pr": 2}' in lines
    assert "conditions: none" in lines and "recent passes: none" in lines


def test_refusals_name_the_rule_and_the_names_that_exist(
    server: WorkflowServer, processes: Processes, rm_project: Path
) -> None:
    bad = cli(
        processes, server, rm_project, "apply", "review", "k", "--spec-json", '{"pr": "x-secret"}'
    )
    assert bad.returncode == 1
    assert "specInvalid" not in bad.stdout
    assert "rejected: spec of resource manager 'review' is invalid at /pr" in bad.stderr
    assert "x-secret" not in bad.stderr and str(rm_project) not in bad.stderr

    unknown = cli(processes, server, rm_project, "apply", "nope", "k", "--spec-json", "{}")
    assert unknown.returncode == 1
    assert "resource manager 'nope'" in unknown.stderr
    assert "available: review" in unknown.stderr

    not_json = cli(processes, server, rm_project, "apply", "review", "k", "--spec-json", "{")
    assert not_json.returncode == 2 and "the spec is not valid JSON" in not_json.stderr
    neither = cli(processes, server, rm_project, "apply", "review", "k")
    assert (
        neither.returncode == 2 and "exactly one of --spec-json and --spec-file" in neither.stderr
    )

    # A spec over the limit is refused before it is sent, by its size and the rule.
    big = rm_project / "big.json"
    big.write_text(json.dumps({"pr": 1, "pad": "x" * (1100 * 1024)}))
    too_big = cli(processes, server, rm_project, "apply", "review", "k", "--spec-file", str(big))
    assert too_big.returncode == 2
    assert "bytes of JSON; apply sends at most" in too_big.stderr and "xxx" not in too_big.stderr
    small = rm_project / "small.json"
    small.write_text('{"pr": 7}')
    from_file = cli(
        processes, server, rm_project, "apply", "review", "f", "--spec-file", str(small)
    )
    assert from_file.returncode == 0, from_file.stderr

    missing = cli(processes, server, rm_project, "get", "review", "absent")
    assert missing.returncode == 1
    assert "notFound: no resource has this manager and key in this project" in missing.stderr
    assert cli(processes, server, rm_project, "reconcile", "review", "absent").returncode == 1


def test_an_edited_manager_applied_again_records_its_new_digest(
    server: WorkflowServer, processes: Processes, rm_project: Path
) -> None:
    cli_json(processes, server, rm_project, "apply", "review", "k", "--spec-json", '{"pr": 1}')
    before = cli_json(processes, server, rm_project, "get", "review", "k")["resource"]
    write_manager(rm_project, "review", marker="edited")
    after_apply = cli_json(
        processes, server, rm_project, "apply", "review", "k", "--spec-json", '{"pr": 1}'
    )
    assert after_apply["changed"] is True and after_apply["specChanged"] is False
    after = cli_json(processes, server, rm_project, "get", "review", "k")["resource"]
    assert after["sourceDigest"] != before["sourceDigest"]
    assert after["generation"] == before["generation"]
    assert after["resourceVersion"] == before["resourceVersion"] + 1


def test_reconcile_enqueues_and_delete_removes(
    server: WorkflowServer, processes: Processes, rm_project: Path
) -> None:
    cli_json(processes, server, rm_project, "apply", "review", "k", "--spec-json", '{"pr": 1}')
    queued = cli(processes, server, rm_project, "reconcile", "review", "k")
    assert queued.returncode == 0, queued.stderr
    assert queued.stdout.startswith("review/k queued, due ")
    view = cli_json(processes, server, rm_project, "get", "review", "k")
    assert view["queue"] is not None and view["queue"]["availableAt"] > 0

    deleted = cli(processes, server, rm_project, "delete", "review", "k")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.strip() == "review/k deleted"
    assert cli(processes, server, rm_project, "get", "review", "k").returncode == 1
    assert cli_json(processes, server, rm_project, "list")["resources"] == []


def test_a_retried_apply_adopts_its_receipt(client: WorkflowClient, rm_project: Path) -> None:
    payload = {"manager": "review", "key": "k", "projectPath": str(rm_project), "spec": {"pr": 3}}
    first = client.request("resourceManager.apply", payload, idempotency_key="apply-once")
    assert first["outcome"] == "accepted", first
    second = client.request("resourceManager.apply", payload, idempotency_key="apply-once")
    assert second["outcome"] == "adopted"
    assert second["receipt"] == first["receipt"]
    other = {**payload, "spec": {"pr": 4}}
    conflict = client.request("resourceManager.apply", other, idempotency_key="apply-once")
    assert conflict["outcome"] == "conflict"
    reconcile = {"manager": "review", "key": "k", "projectPath": str(rm_project)}
    once = client.request("resourceManager.reconcile", reconcile, idempotency_key="wake-1")
    twice = client.request("resourceManager.reconcile", reconcile, idempotency_key="wake-1")
    assert (once["outcome"], twice["outcome"]) == ("accepted", "adopted")
    assert twice["receipt"] == once["receipt"]


def test_get_renders_with_rich_and_manager_code_runs_only_in_children(
    client: WorkflowClient, rm_project: Path
) -> None:
    """The terminal form of `get` renders every section; and the manager file, which
    records the PID of every process that imports it, was never imported by the server
    (this process hosts the embedded server): only by its resolver child."""
    marks = rm_project / "imported-by"
    path = rm_project / ".pi" / "resource-managers" / "review.resource_manager.py"
    path.write_text(
        f"import os\nwith open({str(marks)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\n"
        + manager_source("review")
    )
    payload = {"manager": "review", "key": "k", "projectPath": str(rm_project), "spec": {"pr": 5}}
    assert client.call("resourceManager.apply", payload)["receipt"]["generation"] == 1
    importers = {int(line) for line in marks.read_text().split()}
    assert importers and os.getpid() not in importers

    del payload["spec"]
    view = client.call("resourceManager.get", payload)["receipt"]
    console = Console(record=True, width=120, force_terminal=False)
    show_rich(view, console)
    text = console.export_text()
    assert "resource review/k" in text
    assert "generation" in text and "conditions: none" in text


def test_bad_requests_get_one_clear_error(client: WorkflowClient, rm_project: Path) -> None:
    base: dict[str, Any] = {"manager": "review", "key": "k", "projectPath": str(rm_project)}
    cases: list[tuple[dict[str, Any], str]] = [
        ({**base, "manager": "../x", "spec": {}}, "managerInvalid"),
        ({**base, "key": "", "spec": {}}, "keyInvalid"),
        ({**base, "projectPath": "relative", "spec": {}}, "projectPathInvalid"),
        (base, "specRequired"),
    ]
    for payload, code in cases:
        answer = client.request("resourceManager.apply", payload)
        assert answer["outcome"] == "rejected", payload
        assert answer["error"]["code"] == code
        assert str(rm_project) not in answer["error"]["message"]
    assert client.call("server.status")["outcome"] == "accepted"


def test_the_server_refuses_a_spec_over_one_mebibyte_by_its_size() -> None:
    ctx = OperationContext(epoch=1, owner_id="test", agent_dir=Path("/nowhere"))
    payload = {"manager": "m", "key": "k", "spec": "x" * (MAX_SPEC_BYTES + 1)}
    request = _request("resourceManager.apply", payload)
    assert resource_ref(request, ctx).project_path == "/nowhere"
    with pytest.raises(OperationError) as caught:
        apply_spec(request)
    assert caught.value.code == "specTooLarge"
    assert str(caught.value).endswith(f"a spec is at most {MAX_SPEC_BYTES} bytes")
    assert "xxx" not in str(caught.value)


def _request(operation: str, payload: dict[str, Any]) -> Any:
    return {
        "schema": CLIENT_SCHEMA,
        "type": "request",
        "requestId": "r-1",
        "clientId": "test",
        "operation": operation,
        "idempotencyKey": "k-1",
        "payload": payload,
    }


def test_a_manager_file_changed_after_resolution_is_refused(db: Database, short_tmp: Path) -> None:
    """The server's check in the commit's transaction: the resolver's proposal names the
    digest of the bytes it ran; the file edited before the commit is refused
    (`sourceChanged`, a conflict that stores no receipt) and nothing is written."""
    project = short_tmp / "project"
    path = write_manager(project, "review")
    agent = short_tmp / "agent"
    # The resolver child's answer, computed here (a test process may run manager code).
    resolved = apply_answer(project, agent, "review", {"pr": 1})
    assert resolved["ok"] is True
    path.write_text(manager_source("review", marker="changed after resolution"))
    ctx = OperationContext(epoch=1, owner_id="test", agent_dir=agent)
    payload = {"manager": "review", "key": "k", "projectPath": str(project), "spec": {"pr": 1}}
    answer = apply_resource_manager(db, _request("resourceManager.apply", payload), ctx, resolved)
    assert answer["outcome"] == "conflict"
    assert answer["error"]["code"] == "sourceChanged"
    assert "changed since it was resolved" in answer["error"]["message"]
    assert str(project) not in answer["error"]["message"]
    assert get_resource(db, "review", str(project), "k") is None
    # Resolved again, the same request commits (the refusal stored no receipt).
    fresh = apply_answer(project, agent, "review", {"pr": 1})
    answer = apply_resource_manager(db, _request("resourceManager.apply", payload), ctx, fresh)
    assert answer["outcome"] == "accepted", answer
    assert answer["receipt"]["generation"] == 1
