"""The textual app of `piw` (not built yet)."""

from __future__ import annotations

import sys

from pi_workflows.viewer._target import Target

__all__ = ["run_app"]


def run_app(target: Target, run_id: str | None, *, theme: str | None) -> int:
    """Run the viewer until the user quits; return the exit code."""
    del target, run_id, theme
    sys.stderr.write("piw: the viewer is not built yet\n")
    return 2
