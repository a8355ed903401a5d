"""Where the live state lives: `<agent dir>/workflows/state.sqlite`, folders 0700.

Implements python-port.md § Names and places: the agent directory honours Pi's
`PI_CODING_AGENT_DIR` and defaults to `~/.pi/agent`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "AGENT_DIR_ENV",
    "agent_dir",
    "ensure_private_dir",
    "state_db_path",
    "workflows_dir",
]

AGENT_DIR_ENV = "PI_CODING_AGENT_DIR"
"""Pi's environment variable naming its agent directory; tests point it at a tmp dir."""


def agent_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Return Pi's agent directory: `$PI_CODING_AGENT_DIR`, else `~/.pi/agent`."""
    env = os.environ if environ is None else environ
    configured = env.get(AGENT_DIR_ENV, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".pi" / "agent"


def workflows_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Return the workflow state directory, `<agent dir>/workflows`."""
    return agent_dir(environ) / "workflows"


def state_db_path(environ: Mapping[str, str] | None = None) -> Path:
    """Return the live database path, `<agent dir>/workflows/state.sqlite`."""
    return workflows_dir(environ) / "state.sqlite"


def ensure_private_dir(path: Path) -> None:
    """Create `path` and any missing parents with mode 0700.

    Folders that already exist keep their mode: the caller may have chosen it.
    """
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue
        folder.chmod(0o700)  # mkdir's mode is filtered by the umask
