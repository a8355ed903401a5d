"""Discovery: which `NAME.workflow.py` file a command name refers to.

Implements python-port.md § Names and places: `<project>/.pi/workflows/`, then
`<agent dir>/workflows/`, then the built-ins; the file stem is the command name and
the first file found wins.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from pi_workflows._paths import agent_dir as default_agent_dir
from pi_workflows.engine._errors import WorkflowNotFoundError

__all__ = [
    "BUILTINS_DIR",
    "COMMAND_NAME_PATTERN",
    "WORKFLOW_SUFFIX",
    "WorkflowSource",
    "discover",
    "find_workflow",
    "first_found",
    "search_dirs",
]

WORKFLOW_SUFFIX = ".workflow.py"
COMMAND_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
"""Command names (file stems): letters, digits, `-` and `_`; other files are ignored."""

BUILTINS_DIR = Path(__file__).resolve().parent / "builtins"
"""Built-in workflows shipped with the package (found last)."""

_COMMAND_NAME = re.compile(COMMAND_NAME_PATTERN)

Origin = Literal["project", "agent", "builtin"]
OriginT = TypeVar("OriginT", bound=str)


@dataclass(frozen=True, slots=True)
class WorkflowSource:
    """A discovered workflow file."""

    name: str
    """The command name (the file stem without `.workflow.py`)."""
    path: Path
    """Absolute, resolved path of the file."""
    origin: Origin
    """Where it was found: the project, the agent directory, or the built-ins."""

    @property
    def kind(self) -> Literal["file", "builtin"]:
        """The source identity kind: `builtin` for shipped workflows, else `file`."""
        return "builtin" if self.origin == "builtin" else "file"


def search_dirs(project: Path | None, agent_dir: Path | None = None) -> list[tuple[Origin, Path]]:
    """Return the folders searched, in precedence order.

    Args:
        project: the project folder (its `.pi/workflows/` is searched), or `None`.
        agent_dir: Pi's agent folder; `None` means `$PI_CODING_AGENT_DIR` or `~/.pi/agent`.
    """
    dirs: list[tuple[Origin, Path]] = []
    if project is not None:
        dirs.append(("project", Path(project) / ".pi" / "workflows"))
    agent = Path(agent_dir) if agent_dir is not None else default_agent_dir()
    dirs.append(("agent", agent / "workflows"))
    dirs.append(("builtin", BUILTINS_DIR))
    return dirs


def command_name(path: Path) -> str | None:
    """Return the command name of a workflow file, or `None` if it is not one."""
    file_name = path.name
    if not file_name.endswith(WORKFLOW_SUFFIX):
        return None
    stem = file_name[: -len(WORKFLOW_SUFFIX)]
    return stem if _COMMAND_NAME.match(stem) else None


def discover(project: Path | None, agent_dir: Path | None = None) -> dict[str, WorkflowSource]:
    """Return every discovered workflow by command name, first found winning.

    Only regular files (or links to them) directly inside each folder count; a missing
    or unreadable folder contributes nothing. Within one folder names are sorted.
    """
    return {
        name: WorkflowSource(name=name, path=path, origin=origin)
        for name, (origin, path) in first_found(
            search_dirs(project, agent_dir), command_name
        ).items()
    }


def first_found(
    folders: list[tuple[OriginT, Path]], name_of: Callable[[Path], str | None]
) -> dict[str, tuple[OriginT, Path]]:
    """The discovery rule shared by workflows and resource managers: scan `folders` in
    precedence order; a file counts when `name_of` names it and it is a regular file (or a
    link to one) directly inside the folder; the first file of a name wins. A missing or
    unreadable folder contributes nothing. Returns name → (origin, resolved path)."""
    found: dict[str, tuple[OriginT, Path]] = {}
    for origin, folder in folders:
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            name = name_of(entry)
            if name is None or name in found:
                continue
            try:
                if not entry.is_file():
                    continue
                resolved = entry.resolve()
            except OSError:
                continue
            found[name] = (origin, resolved)
    return found


def find_workflow(name: str, project: Path | None, agent_dir: Path | None = None) -> WorkflowSource:
    """Return the workflow a command name refers to.

    Raises:
        WorkflowNotFoundError: listing the names that do exist.
    """
    found = discover(project, agent_dir)
    source = found.get(name)
    if source is None:
        raise WorkflowNotFoundError(name, sorted(found))
    return source
