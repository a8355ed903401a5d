"""The one display-status rule of a run, shared by the run list and the run view.

Implements the six rules of workflow-server.md § Live run view, in order, over the few
facts they need. The run view passes what its snapshot read (the ambiguous effects, the
active runner epoch); the run list passes the same facts from its summary read, where
they are indexed EXISTS checks instead of loaded rows. So a run shows the same status in
both, e.g. a run paused after its effect became ambiguous is `ambiguous` in each.
`storage/_queries.py` `display_status_sql` is the same rule in SQL for the list's status
filter; a test checks they agree in every case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pi_workflows.storage import RunSummary

__all__ = ["TERMINAL_STATUSES", "StatusFacts", "display_status", "summary_status"]

TERMINAL_STATUSES: Final = frozenset({"completed", "failed", "timed_out", "cancelled"})


@dataclass(frozen=True, slots=True)
class StatusFacts:
    """What the six rules read."""

    run_status: str
    """`runs.status`."""
    paused: bool
    """The durable pause flag."""
    queue_state: str | None
    """`run_queue.state`, None without a queue row."""
    ambiguous_effect: bool
    """The run has an effect in state `ambiguous`."""
    runner_active: bool
    """The run has a starting or ready runner epoch."""
    turn_open: bool = False
    """An exact origin-session model turn of the run is open (`workflow_turns`)."""


def display_status(facts: StatusFacts) -> str:
    """The closed `display.status` of a run (client-protocol.md § Run and session views)."""
    if facts.run_status in TERMINAL_STATUSES:
        return facts.run_status  # 1: terminal, even while its runner reports or cleans up
    if facts.ambiguous_effect:
        return "ambiguous"  # 2: an ambiguous effect on a nonterminal run
    if facts.paused:
        return "paused"  # 3: only the durable pause flag
    if facts.turn_open:
        # 5 before 4: an exact origin-session turn shows its waiting step as running
        # (presentation only; the run stays waiting).
        return "running"
    if facts.run_status == "waiting":
        return "waiting"  # 4: a pending request (a checkpoint, a decision, a session step)
    if facts.queue_state in ("starting", "running") or facts.runner_active:
        return "running"  # 5: active supervised execution
    return "queued"  # 6: parked resumable work, or admitted work not started


def summary_status(summary: RunSummary) -> str:
    """The display status of a run-list summary row."""
    return display_status(
        StatusFacts(
            run_status=summary.status,
            paused=bool(summary.paused),
            queue_state=summary.queue_state,
            ambiguous_effect=bool(summary.ambiguous_effect),
            runner_active=bool(summary.runner_active),
            turn_open=bool(summary.turn_open),
        )
    )
