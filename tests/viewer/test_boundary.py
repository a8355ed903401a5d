"""The viewer and its relay reach the server only through the client protocol.

Conformance bullets 43 and 44, read for this project: `piw` shows the runs of a server
only through `pi-workflows.client.v1`, and no viewer path opens SQLite or reads the
state folder. By construction here: the viewer package and `piw serve` import nothing
that holds SQL, runs the server or runs workflow code. The processes themselves are
checked while connected in tests/viewer/test_terminal.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import click
import pytest

from pi_workflows.cli import piw_main

pytestmark = pytest.mark.timeout(30)

PACKAGE = Path(__file__).resolve().parents[2] / "pi_workflows"
VIEWER_FILES = [*sorted((PACKAGE / "viewer").glob("*.py")), PACKAGE / "cli" / "_relay.py"]
ALLOWED = ("pi_workflows.wire", "pi_workflows.errors", "pi_workflows._version",
           "pi_workflows.viewer")  # fmt: skip
"""What viewer code may import from the package: the protocol's client side."""


def _package_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [name for name in found if name == "sqlite3" or name.startswith("pi_workflows")]


def test_viewer_code_imports_only_the_client_side_of_the_protocol() -> None:
    assert len(VIEWER_FILES) > 3
    climbing = {
        str(path.relative_to(PACKAGE)): name
        for path in VIEWER_FILES
        for name in _package_imports(path)
        if not name.startswith(ALLOWED)
    }
    assert climbing == {}, f"viewer code reaching past the protocol: {climbing}"


def test_piw_offers_no_database_or_state_file_mode() -> None:
    """No option of `piw` or its subcommands takes a file: the one path option,
    `--state-dir`, is a folder that only locates the server's socket."""
    commands = [piw_main, *piw_main.commands.values()]
    paths = {
        (command.name, param.name): param.type.file_okay
        for command in commands
        for param in command.params
        if isinstance(param.type, click.Path)
    }
    assert paths, "piw has a --state-dir option"
    assert set(paths) <= {(command.name, "state_dir") for command in commands}, paths
    assert not any(paths.values()), "a file-taking path option"
