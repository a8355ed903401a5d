"""Command-line entry points: `pi-workflows` and the `piw` viewer."""

from pi_workflows.cli._main import main, piw_main

__all__ = ["main", "piw_main"]
