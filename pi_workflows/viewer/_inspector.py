"""The inspector: Steps, Trace, Info and Conversation tabs of the selected run.

Steps shows one window of attempts: the view's newest, or an older `view.page` window
(`o` loads older, `n` newer); only that window is held, so memory does not grow with
the run's length. Selecting an attempt expands its complete output, error and traceback,
loaded and verified. Conversation is viewer/_conversation.py (the session record).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, DataTable, Static, TabbedContent, TabPane

from pi_workflows.viewer._browser import elapsed_words
from pi_workflows.viewer._conversation import ConversationPane

__all__ = ["Inspector", "StepWindow", "attempt_text", "info_text"]

SLIDE_MAX_ROWS = 4
"""The most rows the live window drops in place; a longer move refills the table."""


@dataclass(slots=True)
class StepWindow:
    """One window of a run's attempts, oldest first."""

    items: list[dict[str, Any]]
    first: int
    """Position of `items[0]` in the whole trace (0: the run's first attempt)."""
    count: int
    revision: int
    older: str | None
    """The cursor of the window before this one."""
    newer: str | None = None
    """The cursor of the window after this one (None from an older page: the view's)."""
    live: bool = True
    """The view's own newest window (it follows the view)."""

    @classmethod
    def of_view(cls, view: Mapping[str, Any]) -> StepWindow:
        trace = view.get("trace") or {}
        items = list(trace.get("items") or [])
        count = int(trace.get("count", len(items)))
        older = (trace.get("cursors") or {}).get("older")
        return cls(items, count - len(items), count, int(view["revision"]), older)

    @classmethod
    def of_page(cls, page: Mapping[str, Any]) -> StepWindow:
        items = list(page.get("items") or [])
        return cls(
            items,
            int(page.get("first", 0)),
            int(page.get("count", len(items))),
            int(page["revision"]),
            page.get("nextCursor"),
            page.get("previousCursor"),
            live=False,
        )


@dataclass(slots=True)
class Expanded:
    """The selected attempt and the complete texts loaded for it."""

    attempt_id: str
    texts: dict[str, str] = field(default_factory=dict)


class Inspector(Vertical):
    """The tabs; the app feeds it views and the answers of the loads it asks for."""

    class PageWanted(Message):
        """Load the window at `cursor` (a `view.page` of list `trace`)."""

        def __init__(self, cursor: str, revision: int) -> None:
            super().__init__()
            self.cursor = cursor
            self.revision = revision

    class AttemptSelected(Message):
        """Load the complete content of one attempt."""

        def __init__(self, item: dict[str, Any]) -> None:
            super().__init__()
            self.item = item

    DEFAULT_CSS = """
    Inspector { height: 1fr; }
    Inspector #steps-table { height: 1fr; min-height: 5; }
    Inspector #steps-nav { height: 1; }
    Inspector #steps-nav Button { margin: 0 1 0 0; }
    Inspector #steps-detail { height: 1fr; border-top: solid $primary; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.view: dict[str, Any] | None = None
        self.window: StepWindow | None = None
        self.expanded: Expanded | None = None
        self.selected_item: dict[str, Any] | None = None

    def compose(self) -> ComposeResult:
        with TabbedContent(initial="steps", id="tabs"):
            with TabPane("Steps", id="steps"):
                with Horizontal(id="steps-nav"):
                    yield Button("Load older \\[o]", id="steps-older", compact=True)
                    yield Button("Newer \\[n]", id="steps-newer", compact=True)
                    yield Static("", id="steps-where")
                yield DataTable[str](id="steps-table", cursor_type="row", zebra_stripes=True)
                with VerticalScroll(id="steps-detail"):
                    yield Static("Select a step to expand it.", id="steps-text")
            with TabPane("Trace", id="trace"), VerticalScroll():
                yield Static("", id="trace-text")
            with TabPane("Info", id="info"), VerticalScroll():
                yield Static("", id="info-text")
            with (
                TabPane("Conversation", id="conversation", disabled=True),
                VerticalScroll(id="conversation-scroll"),
            ):
                yield ConversationPane(id="conversation-text")

    @property
    def active(self) -> str:
        """The open tab's ID."""
        return self.query_one(TabbedContent).active

    @active.setter
    def active(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def on_mount(self) -> None:
        table = self.steps_table
        table.add_column("#", key="position", width=6)
        table.add_column("node", key="node", width=18)
        table.add_column("kind", key="kind", width=10)
        table.add_column("visit", key="visit", width=7)
        table.add_column("outcome", key="outcome", width=11)
        table.add_column("time", key="time", width=8)

    @property
    def steps_table(self) -> DataTable[str]:
        return self.query_one("#steps-table", DataTable)

    @property
    def conversation(self) -> ConversationPane:
        return self.query_one(ConversationPane)

    # --- feeding -----------------------------------------------------------------------

    def clear_run(self) -> None:
        self.view, self.window, self.expanded, self.selected_item = None, None, None, None
        self.steps_table.clear()
        self.query_one("#steps-text", Static).update("Select a step to expand it.")
        self.query_one("#trace-text", Static).update("")
        self.query_one("#info-text", Static).update("")
        self.query_one("#steps-where", Static).update("")
        self.conversation.clear_run()
        self._offer_conversation(False)

    def show_view(self, view: dict[str, Any]) -> None:
        """A new view of the selected run: the live window follows it, older ones stay."""
        self.view = view
        if self.window is None or self.window.live:
            self._show_window(StepWindow.of_view(view))
        self.query_one("#info-text", Static).update(info_text(view))
        self._show_trace()
        self._offer_conversation("sessionRecord" in view)
        self.conversation.show_view(view)

    def _offer_conversation(self, recorded: bool) -> None:
        """The Conversation tab opens only for a run with a session record."""
        pane = self.query_one("#conversation", TabPane)
        if pane.disabled == recorded:
            pane.disabled = not recorded
            if not recorded and self.active == "conversation":
                self.active = "steps"

    def show_page(self, page: Mapping[str, Any]) -> None:
        """An older or newer window arrived (only its own window is kept)."""
        self._show_window(StepWindow.of_page(page))

    def go_live(self) -> None:
        if self.view is not None:
            self._show_window(StepWindow.of_view(self.view))

    def show_expanded(self, attempt_id: str, texts: Mapping[str, str]) -> None:
        """The complete content of an attempt, loaded and verified."""
        if self.expanded is None or self.expanded.attempt_id != attempt_id:
            return
        self.expanded.texts.update(texts)
        if self.selected_item is not None:
            self.query_one("#steps-text", Static).update(
                attempt_text(self.selected_item, self.expanded.texts)
            )
            self._show_trace()

    def select_attempt(self, attempt_id: str) -> bool:
        """Move the cursor to `attempt_id` if it is in the window shown (the replay)."""
        if self.window is None:
            return False
        for index, item in enumerate(self.window.items):
            if item["attemptId"] == attempt_id:
                self.steps_table.move_cursor(row=index, animate=False)
                return True
        return False

    # --- actions -----------------------------------------------------------------------

    def load_older(self) -> None:
        if self.active == "conversation":
            self.conversation.load_older()
            return
        window = self.window
        if window is not None and window.older is not None:
            self.post_message(self.PageWanted(window.older, window.revision))

    def load_newer(self) -> None:
        if self.active == "conversation":
            self.conversation.load_newer()
            return
        window = self.window
        if window is None or window.live:
            return
        if window.newer is None:
            self.go_live()
        else:
            self.post_message(self.PageWanted(window.newer, window.revision))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "steps-older":
            event.stop()
            self.load_older()
        elif event.button.id == "steps-newer":
            event.stop()
            self.load_newer()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id != "steps-table" or self.window is None:
            return
        event.stop()
        attempt_id = event.row_key.value
        item = next((i for i in self.window.items if i["attemptId"] == attempt_id), None)
        if item is None:
            return
        self.selected_item = item
        self.expanded = Expanded(str(attempt_id))
        self.conversation.select_node(str(item.get("node")))
        self.query_one("#steps-text", Static).update(attempt_text(item, {}))
        self._show_trace()
        self.post_message(self.AttemptSelected(item))

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self._show_trace()
        self.conversation.set_open(self.active == "conversation")

    # --- rendering ---------------------------------------------------------------------

    def _show_window(self, window: StepWindow) -> None:
        previous = self.window
        self.window = window
        if previous is None or not (previous.live and window.live) or not self._slide(previous):
            self._fill(window, previous)
        last = window.first + len(window.items)
        where = f"steps {window.first + 1 if window.items else 0}-{last} of {window.count}"
        self.query_one("#steps-where", Static).update(where + ("" if window.live else " (older)"))

    def _fill(self, window: StepWindow, previous: StepWindow | None) -> None:
        table = self.steps_table
        keep = table.cursor_row if previous is not None and previous.first == window.first else None
        table.clear()
        for offset, item in enumerate(window.items):
            table.add_row(*_cells(window.first + offset, item), key=str(item["attemptId"]))
        if keep is not None and 0 <= keep < len(window.items):
            table.move_cursor(row=keep, animate=False)

    def _slide(self, previous: StepWindow) -> bool:
        """Move the live window on in place (drop the oldest rows, change the rows that
        changed, add the newest); False when the windows do not line up."""
        window = self.window
        assert window is not None
        table = self.steps_table
        shown = {str(item["attemptId"]): item for item in previous.items}
        wanted = [str(item["attemptId"]) for item in window.items]
        kept = [key for key in shown if key in set(wanted)]
        if wanted[: len(kept)] != kept or len(shown) - len(kept) > SLIDE_MAX_ROWS:
            return False  # a row removal costs a pass over the table: refill instead
        for key in shown:
            if key not in kept:
                table.remove_row(key)
        for offset, item in enumerate(window.items):
            key = wanted[offset]
            if key not in shown:
                table.add_row(*_cells(window.first + offset, item), key=key)
            elif shown[key] != item:
                cells = _cells(window.first + offset, item)
                table.update_cell(key, "outcome", cells[4])
                table.update_cell(key, "time", cells[5])
        return True

    def _show_trace(self) -> None:
        if self.active != "trace":
            return  # rendered when the tab is opened: a whole view is large
        text = self.query_one("#trace-text", Static)
        if self.selected_item is not None:
            shown = dict(self.selected_item)
            if self.expanded is not None:
                shown.update({f"{k} (complete)": v for k, v in self.expanded.texts.items()})
            text.update(_json(shown))
        elif self.view is not None:
            text.update(_json(self.view))


def _cells(position: int, item: Mapping[str, Any]) -> tuple[str, ...]:
    """One attempt's row: position (from 1), node, kind, visit.attempt, outcome, time."""
    return (
        str(position + 1),
        str(item.get("node", "")),
        str(item.get("kind", "")),
        f"{item.get('visit', '')}.{item.get('attempt', '')}",
        str(item.get("outcome", "")),
        elapsed_words(item.get("startedAt"), item.get("finishedAt")),
    )


def _json(value: Any) -> str:
    from rich.markup import escape  # noqa: PLC0415

    return escape(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True))


def _value_text(value: Any) -> str:
    if not isinstance(value, Mapping):
        return json.dumps(value)
    if "value" in value:
        return json.dumps(value["value"], indent=2, ensure_ascii=False)
    if "unavailable" in value:
        return f"(unavailable: {value['unavailable']})"
    if "preview" in value:
        return f"{value['preview']} … (loading the complete value)"
    return json.dumps(value)


def attempt_text(item: Mapping[str, Any], texts: Mapping[str, str]) -> str:
    """An attempt, expanded: timings, output, error and traceback (complete when loaded)."""
    from rich.markup import escape  # noqa: PLC0415

    lines = [
        f"{item.get('node')}  ({item.get('kind')})  visit {item.get('visit')} "
        f"attempt {item.get('attempt')}  generation {item.get('generation')}",
        f"outcome: {item.get('outcome')}   {_times(item)}",
    ]
    if item.get("next"):
        lines.append(f"next: {item['next']}")
    if "output" in item or "output" in texts:
        lines += ["", "output:", texts.get("output") or _value_text(item.get("output"))]
    if "error" in item or "error" in texts:
        lines += ["", "error:", texts.get("error") or str(item.get("error"))]
    traceback = item.get("traceback")
    if traceback is not None or "traceback" in texts:
        shown = texts.get("traceback") or (traceback or {}).get("text")
        if shown is None:
            shown = (traceback or {}).get("unavailable") or "(loading the traceback)"
        lines += ["", "traceback:", str(shown)]
    if "problem" in texts:
        lines += ["", f"could not load the complete content: {texts['problem']}"]
    return escape("\n".join(lines))


def _times(item: Mapping[str, Any]) -> str:
    started = item.get("startedAt")
    finished = item.get("finishedAt")
    if not isinstance(started, int):
        return ""
    words = f"started {_clock(started)}"
    if isinstance(finished, int):
        words += f", finished {_clock(finished)} ({elapsed_words(started, finished)})"
    return words


def _clock(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def info_text(view: Mapping[str, Any]) -> str:
    """Run metadata, lineage, output, follow-ups and counts."""
    from rich.markup import escape  # noqa: PLC0415

    display = view.get("display") or {}
    lines = [
        f"run: {view.get('runId')}",
        f"workflow: {view.get('workflow')}",
    ]
    if view.get("title"):
        lines.append(f"title: {view['title']}")
    lines.append(f"status: {display.get('status')}")
    for key in ("reasonText", "action", "question"):
        if display.get(key):
            lines.append(f"{key}: {display[key]}")
    for key in ("executionMode", "generation", "failureClass"):
        if key in view:
            lines.append(f"{key}: {view[key]}")
    for key in ("createdAt", "updatedAt", "finishedAt"):
        if isinstance(view.get(key), int):
            lines.append(f"{key}: {_clock(view[key])}")
    lineage = view.get("lineage") or {}
    lines += ["", "lineage:"]
    for key in ("rootRunId", "parentRunId", "restartOf", "continuationOf"):
        if lineage.get(key):
            lines.append(f"  {key}: {lineage[key]}")
    lines += ["", "follow-ups:"]
    follow = [(k, lineage.get(k) or []) for k in ("restartedBy", "continuedBy")]
    lines += [f"  {key}: {', '.join(map(str, ids))}" for key, ids in follow if ids] or ["  none"]
    result = view.get("result")
    lines += ["", "output:"]
    lines.append(_value_text(result.get("output")) if isinstance(result, Mapping) else "  none yet")
    trace = view.get("trace") or {}
    graph = view.get("graph") or {}
    lines += [
        "",
        "counts:",
        f"  attempts: {trace.get('count', 0)}",
        f"  graph steps: {(graph.get('steps') or {}).get('count', 0)}",
        f"  nodes: {(graph.get('nodes') or {}).get('count', '?')}",
        f"  edges: {(graph.get('edges') or {}).get('count', '?')}",
        f"  ambiguous effects: {len(view.get('ambiguousEffects') or [])}",
    ]
    return escape("\n".join(lines))
