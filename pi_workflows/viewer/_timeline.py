"""The timeline: the run's status and elapsed time, the connection's state, and the
step replay track (previous/next `[`/`]`, play at 1/2/5/10× with Space, Live `L`).

A replayed step never looks live: the line says REPLAY, in its own colour, with the
step's position, and a view that is not current says RECONNECTING or DISCONNECTED.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from rich.markup import escape
from textual.widgets import Static

from pi_workflows.viewer._browser import elapsed_words, ticking

__all__ = ["SPEEDS", "Replay", "Timeline", "timeline_text"]

SPEEDS: Final = (1, 2, 5, 10)
"""Play speeds in steps per second, in Space's cycle order."""


@dataclass(frozen=True, slots=True)
class Replay:
    """The replayed step: its attempt, its position in the window and the window's size."""

    attempt_id: str
    node: str
    position: int
    """1-based position in the whole trace."""
    count: int


def timeline_text(
    view: Mapping[str, Any] | None,
    *,
    connection: str,
    replay: Replay | None,
    speed: int | None,
) -> str:
    """The one line of the timeline (rich markup)."""
    parts: list[str] = []
    if connection == "reconnecting":
        parts.append("[b reverse $warning] RECONNECTING [/] not current")
    elif connection == "disconnected":
        parts.append("[b reverse $error] DISCONNECTED [/] not current")
    if view is None:
        parts.append("no run selected")
        return "  ".join(parts)
    display = view.get("display") or {}
    parts.append(f"[b]{escape(str(display.get('status')))}[/b]")
    node = display.get("currentNode") or display.get("waitingOn")
    if node:
        parts.append(f"at {escape(str(node))}")
    seconds = ticking(display.get("status"))
    parts.append(elapsed_words(view.get("createdAt"), view.get("finishedAt"), seconds=seconds))
    if replay is None:
        parts.append("[b $success]LIVE[/]" if connection == "connected" else "")
    else:
        parts.append(
            f"[b reverse $accent] REPLAY [/] step {replay.position}/{replay.count} "
            f"{escape(replay.node)}"
        )
    if speed is not None:
        parts.append(f"▶ {speed}×")
    parts.append("[dim]\\[ ] step · space play · L live[/dim]")
    return "  ".join(part for part in parts if part)


class Timeline(Static):
    DEFAULT_CSS = """
    Timeline { height: 1; background: $panel; padding: 0 1; }
    """
