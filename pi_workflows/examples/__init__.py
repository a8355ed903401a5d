"""Examples shipped with pi-workflows: manager and workflow files to copy into a project.

Each example is a folder of files that discovery loads by path once they sit in a
project's `.pi/` (never imported from here). `install_example` copies one, and
`python -m pi_workflows.examples NAME --project DIR` does the same from a shell.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

__all__ = ["EXAMPLES", "ExampleExistsError", "InstalledFile", "install_example"]

EXAMPLES: dict[str, tuple[str, ...]] = {
    "summaries": ("summaries.resource_manager.py", "summarise.workflow.py"),
}
"""Each example's name and its files (in `pi_workflows/examples/NAME/`)."""

_FOLDERS = {".resource_manager.py": "resource-managers", ".workflow.py": "workflows"}
"""Where discovery looks for a file, by how its name ends (under `<project>/.pi/`)."""


class ExampleExistsError(Exception):
    """A file of the example already exists in the project with other content."""


@dataclass(frozen=True, slots=True)
class InstalledFile:
    """One file of an example as `install_example` left it."""

    path: Path
    changed: bool
    """False when the project already held the same content."""


def install_example(name: str, project: Path) -> list[InstalledFile]:
    """Copy example `name` into `<project>/.pi/` (managers and workflows where discovery
    finds them). A file already there with the same content is left alone.

    Raises:
        KeyError: no example of that name.
        ExampleExistsError: a file is already there with other content (nothing is
            written then: delete or rename it first).
    """
    planned = [(_target(project, file), _source(name, file)) for file in EXAMPLES[name]]
    for target, content in planned:
        if target.exists() and target.read_bytes() != content:
            raise ExampleExistsError(f"{target} already exists with other content")
    installed = []
    for target, content in planned:
        changed = not target.exists()
        if changed:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        installed.append(InstalledFile(target, changed))
    return installed


def _source(name: str, file: str) -> bytes:
    return files(__name__).joinpath(name, file).read_bytes()


def _target(project: Path, file: str) -> Path:
    folder = next(folder for ending, folder in _FOLDERS.items() if file.endswith(ending))
    return project / ".pi" / folder / file
