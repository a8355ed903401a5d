"""Resource-manager files: discovery, loading, `apply` resolution and the server's re-check."""

from __future__ import annotations

import hashlib
import os
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pi_workflows.engine import (
    MAX_SPEC_BYTES,
    ApplyProposal,
    ChildRun,
    ChildRunCall,
    InitialStatusError,
    ManagerSourceChangedError,
    ReconcileContext,
    Resource,
    ResourceManagerLoadError,
    ResourceManagerNotFoundError,
    SpecInvalidError,
    apply_answer,
    discover_managers,
    find_manager,
    finish_pass,
    load_manager,
    manager_search_dirs,
    resolve_manager_for_apply,
    resolve_manager_source,
    verify_manager_source,
)
from pi_workflows.wire.canonical import sha256_digest

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string", "minLength": 1}},
    "required": ["path"],
    "additionalProperties": False,
}


def manager(
    name: str, *, initial: str = "{'files': {}, 'root': spec['path']}", extra: str = ""
) -> str:
    """Source of a manager file named `name` with `SCHEMA` and the given initial status."""
    return textwrap.dedent(
        f"""\
        from pi_workflows.resource_managers import condition_true, define_resource_manager
        {extra}

        def initial_status(spec):
            return {initial}

        def reconcile(ctx):
            ready = condition_true("Ready", "Done")
            return ctx.settled(status=ctx.resource.status, conditions=[ready])

        resource_manager = define_resource_manager(
            name={name!r},
            initial_status=initial_status,
            reconcile=reconcile,
            spec_schema={SCHEMA!r},
        )
        """
    )


@dataclass
class Roots:
    project: Path
    agent: Path

    def folder(self, where: str) -> Path:
        base = self.project / ".pi" if where == "project" else self.agent
        return base / "resource-managers"

    def write(self, where: str, name: str, source: str) -> Path:
        folder = self.folder(where)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.resource_manager.py"
        path.write_text(source)
        return path


@pytest.fixture
def roots(tmp_path: Path) -> Roots:
    (tmp_path / "project").mkdir()
    (tmp_path / "agent").mkdir()
    return Roots(project=tmp_path / "project", agent=tmp_path / "agent")


# ---------------------------------------------------------------------------
# Discovery


def test_search_dirs_are_project_then_agent(roots: Roots) -> None:
    assert manager_search_dirs(roots.project, roots.agent) == [
        ("project", roots.folder("project")),
        ("agent", roots.folder("agent")),
    ]
    assert manager_search_dirs(None, roots.agent) == [("agent", roots.folder("agent"))]


def test_the_project_wins_over_the_agent_dir(roots: Roots) -> None:
    roots.write("agent", "shared", manager("shared"))
    roots.write("project", "shared", manager("shared"))
    roots.write("agent", "only-agent", manager("only-agent"))
    found = discover_managers(roots.project, roots.agent)
    assert list(found) == ["only-agent", "shared"]
    assert found["shared"].origin == "project"
    assert found["shared"].path == (roots.folder("project") / "shared.resource_manager.py")
    assert found["only-agent"].origin == "agent"
    assert discover_managers(None, roots.agent)["shared"].origin == "agent"


def test_only_well_named_regular_files_count(roots: Roots) -> None:
    folder = roots.folder("agent")
    folder.mkdir(parents=True)
    for file_name in [
        "ok-name_1.resource_manager.py",
        "dot.ted.resource_manager.py",
        "has space.resource_manager.py",
        "-lead.resource_manager.py",
        ".resource_manager.py",
        "x.workflow.py",
        "plain.py",
    ]:
        (folder / file_name).write_text("resource_manager = None\n")
    (folder / "dir.resource_manager.py").mkdir()
    (folder / "linked.resource_manager.py").symlink_to(folder / "ok-name_1.resource_manager.py")
    assert set(discover_managers(None, roots.agent)) == {"ok-name_1", "linked"}


def test_workflow_folders_are_not_searched(roots: Roots) -> None:
    workflows = roots.project / ".pi" / "workflows"
    workflows.mkdir(parents=True)
    (workflows / "m.resource_manager.py").write_text(manager("m"))
    assert discover_managers(roots.project, roots.agent) == {}


def test_an_unknown_name_lists_the_known_ones_without_echoing_it(roots: Roots) -> None:
    roots.write("agent", "known", manager("known"))
    with pytest.raises(ResourceManagerNotFoundError) as caught:
        find_manager("secret-name", roots.project, roots.agent)
    assert caught.value.code == "resourceManagerNotFound"
    assert caught.value.available == ["known"]
    assert "secret-name" not in str(caught.value)
    assert "available: known" in str(caught.value)


def test_resolve_source_gives_the_path_and_a_stable_digest(roots: Roots) -> None:
    path = roots.write("project", "m", manager("m"))
    first = resolve_manager_source("m", roots.project, roots.agent)
    assert first.path == str(path.resolve())
    assert first.digest == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert resolve_manager_source("m", roots.project, roots.agent) == first
    path.write_text(manager("m") + "# an edit\n")
    assert resolve_manager_source("m", roots.project, roots.agent).digest != first.digest


# ---------------------------------------------------------------------------
# Loading


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("x = 1\n", "has no module attribute 'resource_manager'"),
        ("resource_manager = 3\n", "is a int, not a define_resource_manager"),
        ("def broken(:\n", "syntax error at line 1"),
        (
            "raise RuntimeError('/home/someone/secret')\n",
            "raised RuntimeError while it was imported",
        ),
        (
            "from pi_workflows.resource_managers import define_resource_manager\n"
            "resource_manager = define_resource_manager(name='m', initial_status=1, "
            "reconcile=print)\n",
            "initial_status must be a function",
        ),
    ],
)
def test_load_errors_are_clear_and_path_free(roots: Roots, source: str, problem: str) -> None:
    path = roots.write("agent", "m", source)
    with pytest.raises(ResourceManagerLoadError) as caught:
        load_manager("m", path)
    message = str(caught.value)
    assert problem in message
    assert message.startswith("resource manager 'm': ")
    assert str(roots.agent) not in message
    assert "/home/someone" not in message
    assert caught.value.code == "definitionInvalid"


def test_the_definition_name_must_be_the_file_name(roots: Roots) -> None:
    path = roots.write("agent", "m", manager("other"))
    with pytest.raises(ResourceManagerLoadError, match="defines 'other'; a manager's name"):
        load_manager("m", path)


def test_an_unreadable_file_is_a_load_error(roots: Roots) -> None:
    with pytest.raises(ResourceManagerLoadError, match="cannot be read"):
        load_manager("m", roots.agent / "missing.resource_manager.py")


def test_load_with_a_saved_digest_runs_no_other_bytes(roots: Roots, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = roots.write("agent", "m", manager("m"))
    digest = load_manager("m", path).digest
    assert load_manager("m", path, expected_digest=digest).digest == digest
    path.write_text(manager("m", extra=f"open({str(marker)!r}, 'w').close()"))
    with pytest.raises(ManagerSourceChangedError, match="changed since it was applied"):
        load_manager("m", path, expected_digest=digest)
    assert not marker.exists()


# ---------------------------------------------------------------------------
# Resolution for apply


def test_apply_resolution_with_a_valid_spec(roots: Roots) -> None:
    path = roots.write("project", "m", manager("m"))
    proposal = resolve_manager_for_apply(roots.project, roots.agent, "m", {"path": "docs"})
    assert proposal.manager == "m"
    assert proposal.path == str(path.resolve())
    assert proposal.source_digest == resolve_manager_source("m", roots.project, roots.agent).digest
    assert proposal.spec == {"path": "docs"}
    assert proposal.spec_hash == sha256_digest({"path": "docs"})
    assert proposal.initial_status == {"files": {}, "root": "docs"}
    wire = proposal.to_wire()
    assert set(wire) == {"manager", "path", "sourceDigest", "spec", "specHash", "initialStatus"}
    assert ApplyProposal.from_wire(wire) == proposal
    same = resolve_manager_for_apply(roots.project, roots.agent, "m", {"path": "docs"})
    assert same.spec_hash == proposal.spec_hash
    other = resolve_manager_for_apply(roots.project, roots.agent, "m", {"path": "src"})
    assert other.spec_hash != proposal.spec_hash


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({}, "at /path: is required"),
        ({"path": ""}, "at /path: must be at least 1 character"),
        ({"path": "p", "private-key": "sk-123"}, "the schema does not allow"),
        ("sk-123", "at / \\(the whole spec\\)"),
        ({"path": {1, 2}}, "is not plain JSON"),
        ({"path": "x" * MAX_SPEC_BYTES}, "at most 1048576"),
    ],
)
def test_an_invalid_spec_is_refused_without_quoting_it(
    roots: Roots, spec: Any, problem: str
) -> None:
    roots.write("agent", "m", manager("m"))
    with pytest.raises(SpecInvalidError, match=problem) as caught:
        resolve_manager_for_apply(None, roots.agent, "m", spec)
    assert "sk-123" not in str(caught.value)
    assert "private-key" not in str(caught.value)
    assert caught.value.code == "specInvalid"


@pytest.mark.parametrize(
    ("initial", "problem"),
    [
        ("int(spec['path'])", "initial_status\\(spec\\) raised ValueError"),
        ("{1, 2}", "returned a value that is not plain JSON"),
        ("'x' * (1024 * 1024)", "at most 1048576"),
    ],
)
def test_initial_status_errors(roots: Roots, initial: str, problem: str) -> None:
    roots.write("agent", "m", manager("m", initial=initial))
    with pytest.raises(InitialStatusError, match=problem) as caught:
        resolve_manager_for_apply(None, roots.agent, "m", {"path": "secret-value"})
    assert "secret-value" not in str(caught.value)
    assert caught.value.code == "initialStatusInvalid"


def test_initial_status_gets_a_copy_of_the_spec(roots: Roots) -> None:
    roots.write("agent", "m", manager("m", initial="spec.pop('path')"))
    proposal = resolve_manager_for_apply(None, roots.agent, "m", {"path": "docs"})
    assert proposal.initial_status == "docs"
    assert proposal.spec == {"path": "docs"}


def test_an_unknown_manager_is_not_found(roots: Roots) -> None:
    with pytest.raises(ResourceManagerNotFoundError):
        resolve_manager_for_apply(roots.project, roots.agent, "m", {"path": "p"})


def test_a_malformed_proposal_is_refused() -> None:
    good = {
        "manager": "m",
        "path": "/x/m.resource_manager.py",
        "sourceDigest": "sha256:" + "0" * 64,
        "spec": {"path": "p"},
        "specHash": sha256_digest({"path": "p"}),
        "initialStatus": {},
    }
    ApplyProposal.from_wire(good)
    for change in (
        {"manager": "a.b"},
        {"path": "relative.py"},
        {"sourceDigest": "sha256:xyz"},
        {"specHash": sha256_digest({"path": "q"})},
        {"spec": float("nan")},
    ):
        with pytest.raises(ValueError, match="malformed apply proposal"):
            ApplyProposal.from_wire({**good, **change})
    with pytest.raises(ValueError, match="a field is missing"):
        ApplyProposal.from_wire({"manager": "m"})


# ---------------------------------------------------------------------------
# The server's re-check


def test_verify_accepts_an_unchanged_source(roots: Roots) -> None:
    roots.write("agent", "m", manager("m"))
    proposal = resolve_manager_for_apply(roots.project, roots.agent, "m", {"path": "p"})
    verify_manager_source(roots.project, roots.agent, "m", proposal.path, proposal.source_digest)


def test_verify_detects_an_edit(roots: Roots) -> None:
    path = roots.write("agent", "m", manager("m"))
    proposal = resolve_manager_for_apply(roots.project, roots.agent, "m", {"path": "p"})
    path.write_text(manager("m") + "\n")
    with pytest.raises(ManagerSourceChangedError, match="changed since it was resolved") as caught:
        verify_manager_source(
            roots.project, roots.agent, "m", proposal.path, proposal.source_digest
        )
    assert caught.value.code == "sourceChanged"
    assert str(roots.agent) not in str(caught.value)


def test_verify_detects_a_shadowing_file_and_a_removal(roots: Roots) -> None:
    agent_file = roots.write("agent", "m", manager("m"))
    proposal = resolve_manager_for_apply(roots.project, roots.agent, "m", {"path": "p"})
    project_file = roots.write("project", "m", agent_file.read_text())
    with pytest.raises(ManagerSourceChangedError, match="discovery now finds another file"):
        verify_manager_source(
            roots.project, roots.agent, "m", proposal.path, proposal.source_digest
        )
    # Without the project, discovery still finds the agent's file.
    verify_manager_source(None, roots.agent, "m", proposal.path, proposal.source_digest)
    project_file.unlink()
    os.unlink(agent_file)
    with pytest.raises(ManagerSourceChangedError, match="no longer discovered"):
        verify_manager_source(
            roots.project, roots.agent, "m", proposal.path, proposal.source_digest
        )


def test_verify_refuses_a_name_discovery_would_never_find(roots: Roots) -> None:
    with pytest.raises(ManagerSourceChangedError, match="no longer discovered"):
        verify_manager_source(roots.project, roots.agent, "../m", "/x", "sha256:" + "0" * 64)


def test_verify_runs_no_code(roots: Roots, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    roots.write("agent", "m", manager("m", extra=f"open({str(marker)!r}, 'w').close()"))
    ref = resolve_manager_source("m", None, roots.agent)
    verify_manager_source(None, roots.agent, "m", ref.path, ref.digest)
    assert not marker.exists()


def test_apply_answer_is_the_resolver_response(roots: Roots) -> None:
    roots.write("agent", "m", manager("m"))
    answer = apply_answer(None, roots.agent, "m", {"path": "p"})
    assert answer["ok"] is True
    assert ApplyProposal.from_wire(answer).initial_status == {"files": {}, "root": "p"}
    refused = apply_answer(None, roots.agent, "m", {"path": 1})
    assert refused == {
        "ok": False,
        "code": "specInvalid",
        "message": "spec of resource manager 'm' is invalid at /path: must be string",
    }
    missing = apply_answer(None, roots.agent, "nope\n", {})
    assert missing["code"] == "resourceManagerNotFound"
    assert "\n" not in missing["message"]
    (roots.folder("agent") / "bad.resource_manager.py").write_text("raise ValueError('x')\n")
    assert apply_answer(None, roots.agent, "bad", {})["code"] == "definitionInvalid"


def test_the_documented_example_resolves_and_reconciles(roots: Roots) -> None:
    """The shipped example the authoring guide documents (docs/authoring.md § Resource
    managers shows its `reconcile`) loads, applies and passes."""
    shipped = Path(__file__).parents[2] / "pi_workflows" / "examples" / "summaries"
    code = (shipped / "summaries.resource_manager.py").read_text()
    roots.write("project", "summaries", code)
    folder = roots.project / "notes"
    folder.mkdir()
    (folder / "a.md").write_text("hello")
    proposal = resolve_manager_for_apply(
        roots.project, roots.agent, "summaries", {"folder": str(folder)}
    )
    assert proposal.initial_status == {"summarised": {}}
    with pytest.raises(SpecInvalidError, match="at /folder: is required"):
        resolve_manager_for_apply(roots.project, roots.agent, "summaries", {})

    class Children:
        def ensure_child(self, call: ChildRunCall) -> ChildRun:
            return ChildRun(call.request_key, "run-1", "running")

    definition = load_manager("summaries", proposal.path).definition
    resource = Resource(
        manager="summaries",
        key="notes",
        uid="res-1",
        generation=1,
        resource_version=1,
        spec=proposal.spec,
        status=proposal.initial_status,
    )
    ctx = ReconcileContext(resource, deadline=time.monotonic() + 60, workflows=Children())
    result = finish_pass(ctx, definition.reconcile(ctx))
    assert result.outcome == "settled"
    assert [(c.type, c.status, c.observed_generation) for c in result.conditions] == [
        ("Ready", "False", 1)
    ]
