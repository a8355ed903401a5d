"""Where the live state lives: re-exported from `pi_workflows._paths`.

Implements python-port.md § Names and places. The functions live at the package top
so runner and resolver children can find the agent directory without importing storage.
"""

from pi_workflows._paths import (
    AGENT_DIR_ENV,
    agent_dir,
    ensure_private_dir,
    state_db_path,
    workflows_dir,
)

__all__ = [
    "AGENT_DIR_ENV",
    "agent_dir",
    "ensure_private_dir",
    "state_db_path",
    "workflows_dir",
]
