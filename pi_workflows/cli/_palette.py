"""One colour per status for every terminal renderer: `run list`, `run show`, `run watch`
(and the `piw` viewer once it is built), so one status never looks two ways.

It covers the closed display statuses (`wire.protocol.DISPLAY_STATUSES`) and an
attempt's outcomes in the trace. `ambiguous` stands out most: an operator must act.
"""

from __future__ import annotations

from typing import Final

from rich.text import Text

__all__ = ["STATUS_STYLES", "status_style", "styled"]

STATUS_STYLES: Final[dict[str, str]] = {
    "queued": "blue",
    "running": "cyan",
    "waiting": "bold yellow",  # someone must answer
    "paused": "yellow",
    "completed": "green",
    "failed": "red",
    "timed_out": "red",
    "cancelled": "dim",
    # Nothing proves whether an effect applied: the run stays until an operator checks
    # the external system and recovers it (`run recover`, `channel recover`).
    "ambiguous": "bold white on red",
    "interrupted": "magenta",  # an attempt's outcome only: its runner was lost
}
"""The rich style of each display status and attempt outcome."""


def status_style(status: str) -> str:
    """The style of `status` (none for a status this version does not know)."""
    return STATUS_STYLES.get(status, "")


def styled(status: str) -> Text:
    """`status` as rich text in its colour."""
    return Text(status, style=status_style(status))
