"""Loading workflow files: identity hashes, changed sources, includes and mounted maps."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from pi_workflows.engine import (
    BUILTINS_DIR,
    EngineContext,
    InputInvalidError,
    SourceChangedError,
    SourceIdentity,
    WorkflowDefinitionError,
    WorkflowLoadError,
    definition_digest,
    include_entry_output,
    include_exit_output,
    load_verified,
    load_workflow,
    next_node,
    project_scope,
    verify_mounted,
    verify_source,
)
from pi_workflows.wire.canonical import dumps, sha256_digest

from .conftest import Roots, linear

MARKER = """
import pathlib
pathlib.Path({marker!r}).write_text("ran")
"""


def sha(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def parent_source(include: str, name: str = "parent") -> str:
    return f"""
        from pi_workflows import compute, define_workflow, include_workflow
        workflow = define_workflow(
            name={name!r},
            start_at="prep",
            nodes={{"prep": compute(lambda ctx: {{"n": 1}}), "after": compute(lambda ctx: {{}})}},
            includes={{"child": include_workflow({include!r}, input=lambda ctx: {{"n": 5}})}},
            edges=[{{"from": "prep", "to": "child"}}, {{"from": "child.done", "to": "after"}}],
        )
    """


def child_source(name: str = "kid", extra: str = "") -> str:
    return linear(name, "x", "y", extra=extra, exits='{"done": {"from": "y"}}')


def test_identity_of_a_plain_file(roots: Roots) -> None:
    path = roots.write("project", "plain", linear("plain", "a", "b"))
    loaded = load_workflow(path)
    assert loaded.identity.root.kind == "file"
    assert loaded.identity.root.path == str(path.resolve())
    assert loaded.identity.root.hash == sha(path)
    assert loaded.identity.mounted == ()
    assert loaded.command_name == "plain"
    assert loaded.digest == sha256_digest(loaded.snapshot)
    assert loaded.digest == definition_digest(loaded.definition)
    wire = loaded.identity.to_wire()
    assert wire == {
        "root": {"kind": "file", "path": str(path.resolve()), "hash": sha(path)},
        "mounted": [],
    }
    assert SourceIdentity.from_wire(wire) == loaded.identity
    dumps(wire)  # canonical-JSON-able


def test_builtin_identity() -> None:
    loaded = load_workflow(BUILTINS_DIR / "hello.workflow.py")
    assert loaded.identity.root.kind == "builtin"
    assert list(loaded.definition.nodes) == ["greet", "shout", "count"]


def test_editing_the_file_changes_the_hash_and_verify_refuses(roots: Roots) -> None:
    path = roots.write("project", "edit", linear("edit", "a"))
    loaded = load_workflow(path)
    verify_source(loaded.identity)  # unchanged: fine
    marker = roots.project / "ran.txt"
    path.write_text(linear("edit", "a", extra=MARKER.format(marker=str(marker))))
    assert sha(path) != loaded.identity.root.hash
    with pytest.raises(SourceChangedError) as caught:
        verify_source(loaded.identity.to_wire())
    assert caught.value.path == str(path.resolve())
    assert caught.value.park_reason == "workflowSourceChanged"
    assert "changed since the run started" in caught.value.reason
    with pytest.raises(SourceChangedError):
        load_verified(loaded.identity, project=roots.project, agent_dir=roots.agent)
    with pytest.raises(SourceChangedError):  # the hash is enforced on the bytes executed too
        load_workflow(path, expected=loaded.identity)
    assert not marker.exists()  # the edited code never ran
    assert load_workflow(path).identity.root.hash == sha(path)
    assert marker.exists()


def test_deleted_file_is_a_source_change(roots: Roots) -> None:
    path = roots.write("project", "gone", linear("gone", "a"))
    identity = load_workflow(path).identity
    path.unlink()
    with pytest.raises(SourceChangedError, match="can no longer be read"):
        verify_source(identity)


def test_include_by_name_records_mounted_files_and_paths(roots: Roots) -> None:
    child = roots.write("agent", "kid", child_source())
    root = roots.write("project", "parent", parent_source("kid"))
    loaded = load_workflow(root, project=roots.project, agent_dir=roots.agent)
    (mounted,) = loaded.identity.mounted
    assert mounted.mount == "child"
    assert mounted.path == str(child.resolve())
    assert mounted.hash == sha(child)
    assert mounted.kind == "file"
    assert mounted.workflow == "kid"
    assert loaded.identity.to_wire()["mounted"] == [
        {
            "mount": "child",
            "kind": "file",
            "path": str(child.resolve()),
            "hash": sha(child),
            "workflow": "kid",
        }
    ]
    compiled = loaded.compiled
    assert set(compiled.nodes) == {
        "prep",
        "after",
        "child",
        "child/x",
        "child/y",
        "child/__piw_exit_done",
    }
    snap = loaded.snapshot
    assert snap["mounts"]["child"] == {
        "mountPath": ["child"],
        "workflow": "kid",
        "entry": "child",
        "startAt": "child/x",
        "exits": {"done": "child/__piw_exit_done"},
        "maxSteps": 100,
        "inputSchema": None,
    }
    assert snap["nodes"]["child"]["includeTransition"] == "entry"
    assert snap["nodes"]["child/y"] == {
        "kind": "compute",
        "timeoutMs": 900_000,
        "mountPath": ["child"],
        "localNodeId": "y",
    }
    assert {"from": "child/y", "to": "child/__piw_exit_done"} in snap["edges"]
    assert {"from": "child/__piw_exit_done", "to": "after"} in snap["edges"]
    assert next_node(compiled, "child/y", {}, "completed") == "child/__piw_exit_done"
    verify_mounted(loaded.identity, loaded)
    assert load_verified(loaded.identity, project=roots.project, agent_dir=roots.agent).digest == (
        loaded.digest
    )


def test_nested_and_relative_includes(roots: Roots) -> None:
    roots.write("agent", "inner", child_source("inner-wf"))
    middle = """
        from pi_workflows import compute, define_workflow, include_workflow
        workflow = define_workflow(
            name="middle",
            start_at="inner",
            nodes={"m": compute(lambda ctx: {})},
            includes={"inner": include_workflow("inner")},
            edges=[{"from": "inner.done", "to": "m"}],
            exits={"done": {"from": "m"}},
        )
    """
    roots.write("project", "middle", middle)
    root = roots.write("project", "top", parent_source("middle.workflow.py", name="top"))
    loaded = load_workflow(root, project=roots.project, agent_dir=roots.agent)
    assert [m.mount for m in loaded.identity.mounted] == ["child", "child/inner"]
    assert [m.workflow for m in loaded.identity.mounted] == ["middle", "inner-wf"]
    assert "child/inner/y" in loaded.compiled.nodes
    assert loaded.compiled.nodes["child/inner/y"].mount_path == ("child", "inner")
    assert loaded.compiled.outgoing["child"].target == "child/inner"
    assert loaded.compiled.outgoing["child/inner"].target == "child/inner/x"
    assert loaded.compiled.outgoing["child/inner/__piw_exit_done"].target == "child/m"


def test_editing_an_included_file_is_a_source_change(roots: Roots) -> None:
    child = roots.write("agent", "kid", child_source())
    root = roots.write("project", "parent", parent_source("kid"))
    loaded = load_workflow(root, project=roots.project, agent_dir=roots.agent)
    marker = roots.project / "child-ran.txt"
    child.write_text(child_source(extra=MARKER.format(marker=str(marker))))
    with pytest.raises(SourceChangedError) as caught:
        verify_source(loaded.identity)
    assert caught.value.mount == "child"
    with pytest.raises(SourceChangedError):
        load_workflow(root, project=roots.project, agent_dir=roots.agent, expected=loaded.identity)
    assert not marker.exists()


def test_a_shadowing_include_changes_the_mounted_map(roots: Roots) -> None:
    roots.write("agent", "kid", child_source())
    root = roots.write("project", "parent", parent_source("kid"))
    loaded = load_workflow(root, project=roots.project, agent_dir=roots.agent)
    roots.write("project", "kid", child_source())  # same bytes, now found first
    verify_source(loaded.identity)  # every saved file is unchanged...
    reloaded = load_workflow(root, project=roots.project, agent_dir=roots.agent)
    with pytest.raises(SourceChangedError, match="changed 'child'"):
        verify_mounted(loaded.identity, reloaded)  # ...but the map is not
    with pytest.raises(SourceChangedError, match="does not list"):
        load_verified(loaded.identity, project=roots.project, agent_dir=roots.agent)


def test_same_stem_in_two_folders_do_not_collide(roots: Roots) -> None:
    state = """
        COUNTER = []
        COUNTER.append(1)
        import dataclasses
        @dataclasses.dataclass
        class Box:
            value: int
    """
    a = roots.write("project", "same", linear("from-project", "a", extra=state))
    b = roots.write("agent", "same", linear("from-agent", "b", extra=state))
    before = set(sys.modules)
    first = load_workflow(a)
    second = load_workflow(b)
    again = load_workflow(a)
    assert first.definition.name == "from-project"
    assert second.definition.name == "from-agent"
    assert first.definition is not again.definition
    assert first.definition.nodes["a"].fn is not again.definition.nodes["a"].fn  # type: ignore[union-attr]
    assert first.definition.nodes["a"].fn.__globals__["COUNTER"] == [1]  # type: ignore[union-attr]
    assert set(sys.modules) == before


@pytest.mark.parametrize(
    ("source", "phrase"),
    [
        ("raise RuntimeError('boom at import')\n", "raised RuntimeError: boom at import"),
        ("x = 1\n", "no module attribute 'workflow'"),
        ("workflow = 42\n", "is a int, not a define_workflow(...) result"),
        ("def broken(:\n", "syntax error at line 1"),
        ("import sys\nsys.exit(3)\n", "raised SystemExit: 3"),
        (
            "from pi_workflows import compute, define_workflow\n"
            "workflow = define_workflow(name='w', start_at='a', nodes={'a': compute(print)},"
            " edges=[{'from': 'a', 'to': 'zzz'}])\n",
            "node 'a': routes to unknown target 'zzz'",
        ),
    ],
)
def test_load_errors(roots: Roots, source: str, phrase: str) -> None:
    path = roots.write("project", "bad", source)
    with pytest.raises(WorkflowLoadError) as caught:
        load_workflow(path)
    assert caught.value.code == "definitionInvalid"
    assert phrase in str(caught.value)
    assert str(path.resolve()) in str(caught.value)


def test_include_cycle_and_unknown_include(roots: Roots) -> None:
    roots.write("project", "loop-a", parent_source("loop-b", name="a"))
    loop_b = """
        from pi_workflows import compute, define_workflow, include_workflow
        workflow = define_workflow(
            name="b", start_at="child", nodes={"z": compute(lambda ctx: {})},
            includes={"child": include_workflow("loop-a")},
            edges=[{"from": "child.done", "to": "z"}], exits={"done": {"from": "z"}},
        )
    """
    roots.write("project", "loop-b", loop_b)
    with pytest.raises(WorkflowDefinitionError, match="cycle"):
        load_workflow(
            roots.project_workflows / "loop-a.workflow.py",
            project=roots.project,
            agent_dir=roots.agent,
        )
    missing = roots.write("project", "lonely", parent_source("nobody"))
    with pytest.raises(WorkflowDefinitionError, match="no workflow named 'nobody'") as caught:
        load_workflow(missing, project=roots.project, agent_dir=roots.agent)
    assert caught.value.node == "child"


def test_edge_from_an_exit_the_named_child_lacks(roots: Roots) -> None:
    roots.write("agent", "kid", child_source())
    root = roots.write(
        "project", "parent", parent_source("kid").replace('"child.done"', '"child.finished"')
    )
    with pytest.raises(WorkflowDefinitionError, match="has exits \\['done'\\]") as caught:
        load_workflow(root, project=roots.project, agent_dir=roots.agent)
    assert caught.value.node == "child.finished"


def test_include_entry_and_exit_outputs(roots: Roots) -> None:
    kid = """
        from pi_workflows import compute, define_workflow
        workflow = define_workflow(
            name="kid", start_at="x",
            nodes={"x": compute(lambda ctx: {"twice": ctx.input["n"] * 2})},
            input_schema={"type": "object", "required": ["n"]},
            exits={"done": {"from": "x", "validate": lambda out: {**out, "checked": True}}},
        )
    """
    roots.write("agent", "kid", kid)
    root = roots.write("project", "parent", parent_source("kid"))
    compiled = load_workflow(root, project=roots.project, agent_dir=roots.agent).compiled
    entry = compiled.nodes["child"]
    parent_ctx = EngineContext(input={"ignored": True}, outputs={"prep": {"n": 1}})
    out = include_entry_output(entry, parent_ctx, invocation=1)
    assert out == {"schema": "pi-workflows.include-entry.v1", "invocation": 1, "input": {"n": 5}}
    child_ctx = EngineContext(input=out["input"], outputs={"x": {"twice": 10}})
    exit_node = compiled.nodes["child/__piw_exit_done"]
    assert include_exit_output(exit_node, child_ctx) == {
        "exit": "done",
        "output": {"twice": 10, "checked": True},
    }
    assert project_scope(
        {"prep": 1, "child": 2, "child/x": 3, "child/__piw_exit_done": 4, "child/inner/y": 5},
        "child",
    ) == {"x": 3}
    assert project_scope({"prep": 1, "child": 2, "child/x": 3}, "") == {"prep": 1, "child": 2}
    bad = roots.write("project", "badparent", parent_source("kid").replace('{"n": 5}', '{"m": 5}'))
    compiled = load_workflow(bad, project=roots.project, agent_dir=roots.agent).compiled
    with pytest.raises(InputInvalidError, match="at /n: is required"):
        include_entry_output(compiled.nodes["child"], parent_ctx, invocation=2)
