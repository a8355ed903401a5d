"""Installing a shipped example copies its files where discovery finds them, never
overwrites a file of the project, and the authoring guide shows the shipped code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import pi_workflows
from pi_workflows.engine import discover_managers
from pi_workflows.examples import EXAMPLES, ExampleExistsError, install_example

SHIPPED = Path(pi_workflows.__file__).parent / "examples"
AUTHORING = Path(__file__).resolve().parents[2] / "docs" / "authoring.md"


def test_install_copies_the_manager_and_workflow_where_discovery_finds_them(
    tmp_path: Path,
) -> None:
    installed = install_example("summaries", tmp_path)
    assert [(f.path.relative_to(tmp_path).as_posix(), f.changed) for f in installed] == [
        (".pi/resource-managers/summaries.resource_manager.py", True),
        (".pi/workflows/summarise.workflow.py", True),
    ]
    for file in installed:
        assert file.path.read_bytes() == (SHIPPED / "summaries" / file.path.name).read_bytes()
    found = discover_managers(tmp_path, tmp_path / "no-agent-dir")
    assert list(found) == ["summaries"]
    again = install_example("summaries", tmp_path)
    assert [f.changed for f in again] == [False, False], "the same content is left alone"


def test_install_refuses_to_overwrite_a_different_file_and_writes_nothing(
    tmp_path: Path,
) -> None:
    workflow = tmp_path / ".pi" / "workflows" / "summarise.workflow.py"
    workflow.parent.mkdir(parents=True)
    workflow.write_text("# mine\n")
    with pytest.raises(ExampleExistsError):
        install_example("summaries", tmp_path)
    assert workflow.read_text() == "# mine\n"
    assert not (tmp_path / ".pi" / "resource-managers").exists()


def test_every_listed_file_is_shipped() -> None:
    for name, files in EXAMPLES.items():
        for file in files:
            assert (SHIPPED / name / file).is_file(), (name, file)


def test_the_authoring_guide_shows_the_shipped_reconcile() -> None:
    guide = AUTHORING.read_text()
    shown = re.search(r"^def reconcile\(ctx: ReconcileContext\).*?^\n", guide, re.M | re.S)
    assert shown is not None, "the guide shows the example's reconcile"
    source = (SHIPPED / "summaries" / "summaries.resource_manager.py").read_text()
    assert shown.group(0).strip() in source
