"""`piw RUN_ID --once`: one plain-text frame of a run (not built yet)."""

from __future__ import annotations

import sys

from pi_workflows.viewer._target import Target

__all__ = ["print_once"]


def print_once(target: Target, run_id: str, *, timeout: float) -> int:
    """Print one 120 × 40 frame of `run_id`'s view; return the exit code."""
    del target, run_id, timeout
    sys.stderr.write("piw: --once is not built yet\n")
    return 2
