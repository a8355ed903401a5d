"""The run browser: every run, newest first, from the run-list pages.

It shows only what the run list carries (status, title or workflow, elapsed time) and
never reads a run's history. Selecting a row posts `RunBrowser.Selected`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from textual.message import Message
from textual.widgets import DataTable

__all__ = ["RunBrowser", "elapsed_words", "ticking"]


def elapsed_words(
    started_ms: int | None,
    finished_ms: int | None,
    now_ms: int | None = None,
    *,
    seconds: bool = True,
) -> str:
    """`1h 02m`, `3m 04s`, `5s`: from start to finish (or to now). Without `seconds`
    (a run that is not running), a minute is the finest step: `3m`, so an idle screen
    changes once a minute."""
    if started_ms is None:
        return ""
    end = finished_ms if finished_ms is not None else (now_ms or time.time_ns() // 1_000_000)
    total = max(0, end - started_ms) // 1000
    if total >= 3600:
        return f"{total // 3600}h {total % 3600 // 60:02d}m"
    if total >= 60:
        return f"{total // 60}m {total % 60:02d}s" if seconds else f"{total // 60}m"
    return f"{total}s" if seconds or finished_ms is not None else "<1m"


def ticking(status: object) -> bool:
    """Whether an unfinished run's elapsed time is shown to the second (it runs)."""
    return status == "running"


class RunBrowser(DataTable[str]):
    """A table of runs; its row keys are run IDs."""

    class Selected(Message):
        def __init__(self, run_id: str) -> None:
            super().__init__()
            self.run_id = run_id

    DEFAULT_CSS = """
    RunBrowser { width: 48; border-right: solid $primary; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.run_ids: list[str] = []

    def on_mount(self) -> None:
        self.add_column("status", key="status", width=10)
        self.add_column("run", key="run", width=24)
        self.add_column("elapsed", key="elapsed", width=8)

    def show(self, items: Sequence[Mapping[str, Any]], selected: str | None) -> None:
        """Replace the rows with `items` (newest first), keeping the selected run's row."""
        now_ms = time.time_ns() // 1_000_000
        self.clear()
        self.run_ids = []
        for item in items:
            run_id = str(item["runId"])
            title = str(item.get("title") or item.get("workflow") or run_id)
            self.add_row(
                str(item["display"]["status"]),
                title,
                elapsed_words(
                    item.get("createdAt"),
                    item.get("finishedAt"),
                    now_ms,
                    seconds=ticking(item["display"]["status"]),
                ),
                key=run_id,
            )
            self.run_ids.append(run_id)
        if selected in self.run_ids:
            self.move_cursor(row=self.run_ids.index(selected), animate=False)

    def tick(self, items: Sequence[Mapping[str, Any]]) -> None:
        """Move the elapsed time of unfinished runs on (their rows stay where they are)."""
        now_ms = time.time_ns() // 1_000_000
        for item in items:
            run_id = str(item["runId"])
            if item.get("finishedAt") is None and run_id in self.rows:
                seconds = ticking(item["display"]["status"])
                words = elapsed_words(item.get("createdAt"), None, now_ms, seconds=seconds)
                self.update_cell(run_id, "elapsed", words)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.Selected(str(event.row_key.value)))
