"""The graph pane: the run's whole definition as a layered layout of cards (stub).

Contract (kept by the real implementation): `GraphView.show_run(view, definition,
replay_attempt=None)` draws `definition` (a `pi-workflows.definition-snapshot.v1`,
verified from the view's `graph.definition` content reference) with each node's state
from the run view; `replay_attempt` (an `attemptId` of the trace) shows the run as it
was at that attempt, marked as a replay. Keys: arrows/hjkl pan, `f` follow, `z` compact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from textual.widgets import Static

__all__ = ["GraphView"]


class GraphView(Static):
    """Stub: lists the definition's nodes until the layout lands."""

    def show_run(
        self,
        view: Mapping[str, Any] | None,
        definition: Mapping[str, Any] | None,
        *,
        replay_attempt: str | None = None,
    ) -> None:
        """Draw `definition` with the states of `view` (see the module docstring)."""
        del replay_attempt
        nodes = sorted((definition or {}).get("nodes", {}))
        current = ((view or {}).get("display") or {}).get("currentNode")
        self.update("\n".join(f"{'>' if n == current else ' '} {n}" for n in nodes) or "(no graph)")
