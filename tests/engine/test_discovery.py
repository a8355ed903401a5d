"""Discovery: project, then agent dir, then built-ins; the file stem is the command name."""

from __future__ import annotations

from pathlib import Path

import pytest

from pi_workflows.engine import (
    BUILTINS_DIR,
    WorkflowNotFoundError,
    discover,
    find_workflow,
    search_dirs,
)

from .conftest import Roots, linear


def test_order_is_project_then_agent_then_builtins(roots: Roots) -> None:
    roots.write("project", "shared", linear("from-project", "a"))
    roots.write("agent", "shared", linear("from-agent", "a"))
    roots.write("agent", "only-agent", linear("x", "a"))
    roots.write("project", "only_project", linear("y", "a"))
    found = discover(roots.project, roots.agent)
    assert found["shared"].origin == "project"
    assert found["shared"].path == (roots.project_workflows / "shared.workflow.py").resolve()
    assert found["only-agent"].origin == "agent"
    assert found["only_project"].origin == "project"
    assert found["hello"].origin == "builtin"
    assert found["hello"].kind == "builtin"
    assert found["shared"].kind == "file"
    names = list(found)
    assert names.index("only_project") < names.index("only-agent") < names.index("hello")


def test_builtin_is_found_last_and_can_be_shadowed(roots: Roots) -> None:
    assert find_workflow("hello", None, roots.agent).path == BUILTINS_DIR / "hello.workflow.py"
    roots.write("agent", "hello", linear("mine", "a"))
    assert find_workflow("hello", None, roots.agent).origin == "agent"
    roots.write("project", "hello", linear("ours", "a"))
    assert find_workflow("hello", roots.project, roots.agent).origin == "project"


def test_command_name_rules(roots: Roots) -> None:
    folder = roots.agent_workflows
    folder.mkdir(parents=True)
    for file_name in [
        "ok-name_1.workflow.py",
        "has space.workflow.py",
        "dot.ted.workflow.py",
        "plain.py",
        ".workflow.py",
        "notes.workflow.txt",
    ]:
        (folder / file_name).write_text("workflow = None\n")
    (folder / "folder.workflow.py").mkdir()
    (folder / "state.sqlite").write_bytes(b"")
    found = {n for n, s in discover(None, roots.agent).items() if s.origin == "agent"}
    assert found == {"ok-name_1"}


def test_symlinked_file_counts(roots: Roots, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.py"
    target.write_text(linear("linked", "a"))
    roots.agent_workflows.mkdir(parents=True)
    (roots.agent_workflows / "linked.workflow.py").symlink_to(target)
    assert discover(None, roots.agent)["linked"].path == target.resolve()


def test_missing_folders_contribute_nothing(tmp_path: Path) -> None:
    found = discover(tmp_path / "no-project", tmp_path / "no-agent")
    assert {s.origin for s in found.values()} == {"builtin"}


def test_unknown_name_lists_the_available_ones(roots: Roots) -> None:
    roots.write("project", "deploy", linear("d", "a"))
    with pytest.raises(WorkflowNotFoundError) as caught:
        find_workflow("depoly", roots.project, roots.agent)
    assert caught.value.code == "workflowNotFound"
    assert "deploy" in str(caught.value)
    assert "hello" in caught.value.available


def test_agent_dir_defaults_to_pi_coding_agent_dir(
    roots: Roots, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(roots.agent))
    roots.write("agent", "envfound", linear("e", "a"))
    assert discover(None)["envfound"].origin == "agent"
    assert search_dirs(roots.project) == [
        ("project", roots.project / ".pi" / "workflows"),
        ("agent", roots.agent / "workflows"),
        ("builtin", BUILTINS_DIR),
    ]
