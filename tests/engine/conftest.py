"""Helpers for engine tests: project and agent folders with real workflow files."""

from __future__ import annotations

import itertools
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class Roots:
    """A project folder and an agent folder, with helpers to write workflow files."""

    project: Path
    agent: Path

    @property
    def project_workflows(self) -> Path:
        return self.project / ".pi" / "workflows"

    @property
    def agent_workflows(self) -> Path:
        return self.agent / "workflows"

    def write(self, where: str, name: str, source: str) -> Path:
        """Write `NAME.workflow.py` into `project` or `agent` workflows; return its path."""
        folder = self.project_workflows if where == "project" else self.agent_workflows
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.workflow.py"
        path.write_text(textwrap.dedent(source))
        return path


@pytest.fixture
def roots(tmp_path: Path) -> Roots:
    project = tmp_path / "project"
    agent = tmp_path / "agent"
    project.mkdir()
    agent.mkdir()
    return Roots(project=project, agent=agent)


def linear(name: str, *node_ids: str, extra: str = "", exits: str = "None") -> str:
    """Source of a workflow file whose compute nodes run in a line, each returning its id."""
    nodes = ", ".join(f'"{n}": compute(lambda ctx: {{"node": "{n}"}})' for n in node_ids)
    edges = ", ".join(f'{{"from": "{a}", "to": "{b}"}}' for a, b in itertools.pairwise(node_ids))
    return (
        "from pi_workflows import compute, define_workflow, include_workflow\n"
        f"{textwrap.dedent(extra)}\n"
        f"workflow = define_workflow(name={name!r}, start_at={node_ids[0]!r},\n"
        f"    nodes={{{nodes}}}, edges=[{edges}], exits={exits})\n"
    )
