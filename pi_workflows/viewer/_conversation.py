"""The inspector's Conversation tab: the selected run's recorded Pi session, folded.

It holds one window of consecutive session-event pages (the newest with its replay
checkpoint first, older ones on demand, at most `HELD_PAGES`), replays them with
wire/session_fold.py and shows each turn's capture status and messages, each text
bounded. A window that reaches the newest event follows the run as its record grows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from textual.content import Content
from textual.message import Message
from textual.widgets import Static

from pi_workflows.wire.conversation import (
    SESSION_LIST,
    ConversationLine,
    SessionPage,
    conversation_rows,
    cut_at,
    pages_conversation,
)

__all__ = ["HEAD_CHARS", "HELD_PAGES", "ConversationPane", "SessionWindow", "conversation_content"]

HELD_PAGES: Final = 8
"""The most session-event pages the tab holds (each at most 256 events and 512 KiB)."""
HEAD_CHARS: Final = 2000
"""The most characters of one text, arguments or tool result the tab shows."""

STYLES: Final[Mapping[str, str]] = {
    "summary": "bold",
    "note": "dim italic",
    "step": "bold $accent",
    "text": "",
    "thinking": "dim italic",
    "toolCall": "$secondary",
    "toolResult": "$success",
    "toolError": "$error",
}
"""Each kind of line's style (textual theme variables: the theme picker applies)."""


@dataclass(slots=True)
class SessionWindow:
    """Consecutive session-event pages of one run, oldest first."""

    pages: list[SessionPage] = field(default_factory=list)
    live: bool = False
    """The window reaches the newest event the server had when its last page came."""

    @property
    def first(self) -> int:
        return self.pages[0].first if self.pages else 0

    @property
    def end(self) -> int:
        return self.pages[-1].end if self.pages else 0

    def add(self, page: SessionPage) -> None:
        """Take `page` in: it replaces the held page it grew from, or joins either end
        (past `HELD_PAGES`, the page at the other end goes); any other page starts
        the window again."""
        held = [p.first for p in self.pages]
        if page.first in held:
            index = held.index(page.first)
            self.pages[index : index + 1] = [page]
        elif self.pages and page.end == self.first:
            self.pages.insert(0, page)
            if len(self.pages) > HELD_PAGES:
                self.pages.pop()
                self.live = False
            return
        elif self.pages and page.first == self.end:
            self.pages.append(page)
            if len(self.pages) > HELD_PAGES:
                self.pages.pop(0)
        else:
            self.pages = [page]
        if page is self.pages[-1]:
            self.live = page.newer is None


def _head(text: str) -> str:
    if len(text) <= HEAD_CHARS:
        return text
    return f"{text[:HEAD_CHARS]} … (cut: {len(text.encode('utf-8'))} bytes in all)"


def conversation_content(
    view: Mapping[str, Any],
    window: SessionWindow,
    *,
    node: str | None = None,
    until_ms: int | None = None,
) -> Content:
    """The tab's text: where the window is, then each turn and its messages."""
    pages = cut_at(window.pages, until_ms)
    messages = pages_conversation(pages)
    record = view.get("sessionRecord") or {}
    parts: list[Content] = [Content.styled(_where(record, window, until_ms), "dim")]
    if any(page.checkpoint_missing for page in pages):
        parts.append(
            Content.styled("a replay checkpoint is missing: a message may start late", "$warning")
        )
    if node is not None and not any(s.get("node") == node for s in record.get("segments", [])):
        node = None  # the step selected in Steps recorded nothing: every turn
    rows = conversation_rows(view, messages, _head, first=window.first, node=node)
    parts += [_line(row) for row in rows]
    return Content("\n").join(parts)


def _where(record: Mapping[str, Any], window: SessionWindow, until_ms: int | None) -> str:
    count = int(record.get("eventCount", 0))
    if not window.pages:
        return f"{count} events recorded; loading the newest page"
    words = f"events {window.first + 1}-{window.end} of {count}"
    if window.first > 0:
        words += " · o: older"
    if not window.live:
        words += " · n: newer"
    if until_ms is not None:
        words += " · as at the replayed step (L: live)"
    return words


def _line(row: ConversationLine) -> Content:
    style = STYLES.get(row.kind, "")
    if row.kind in ("summary", "note", "step"):
        return Content.styled(row.text if row.kind == "summary" else f"  {row.text}", style)
    label = Content.styled(f"    {row.label:<11} ", "bold")
    first, *more = row.text.split("\n")
    text = Content.styled(first, style)
    for line in more:
        text += Content("\n" + " " * 16) + Content.styled(line, style)
    return label + text


class ConversationPane(Static):
    """The tab's content; it asks for pages (`PageWanted`), the app loads them."""

    class PageWanted(Message):
        """Load the session-event page at `cursor` (None: the newest) for the window
        of `generation` (a window started again ignores answers meant for the old)."""

        def __init__(
            self,
            run_id: str,
            revision: int,
            cursor: str | None,
            generation: int,
            known: Mapping[str, Any],
        ):
            super().__init__()
            self.run_id = run_id
            self.revision = revision
            self.cursor = cursor
            self.generation = generation
            self.known = known
            """Verbatim entries the window holds (by digest): not loaded again."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.view: dict[str, Any] | None = None
        self.window = SessionWindow()
        self.generation = 0
        self.fetching = False
        """A page is on its way (one at a time)."""
        self.open = False
        """The tab is shown: only then are pages loaded and the text rendered."""
        self.node: str | None = None
        self.until_ms: int | None = None
        self.problem: str | None = None

    # --- feeding -------------------------------------------------------------------------

    def clear_run(self) -> None:
        self.view, self.window, self.fetching, self.problem = None, SessionWindow(), False, None
        self.node, self.until_ms = None, None
        self.generation += 1
        self.update("")

    def show_view(self, view: dict[str, Any]) -> None:
        self.view, self.problem = view, None  # a failed load is tried again
        self._want()
        self._show()

    def set_open(self, shown: bool) -> None:
        self.open = shown
        self._want()
        self._show()

    def select_node(self, node: str | None) -> None:
        """Show the turns of `node` (the step selected in Steps) when it recorded any."""
        self.node = node
        self._show()

    def replay_until(self, until_ms: int | None) -> None:
        """Show the conversation as it was at `until_ms` (None: all of it)."""
        self.until_ms = until_ms
        self._show()

    def page_arrived(self, generation: int, page: SessionPage | None, error: str | None) -> None:
        if generation != self.generation:
            return
        self.fetching = False
        if page is None:
            self.problem = error or "the page could not be loaded"
        else:
            self.problem = None
            self.window.add(page)
            self._want()
        self._show()

    def load_older(self) -> None:
        if self.window.pages and self.window.first > 0:
            self._ask(f"{SESSION_LIST}<{self.window.first}")

    def load_newer(self) -> None:
        if self.window.pages and not self.window.live:
            self._ask(f"{SESSION_LIST}>{self.window.end}")

    # --- loading and rendering -----------------------------------------------------------

    def _want(self) -> None:
        """Ask for what the open tab lacks: the newest page, or the pages the record
        grew by while the window follows it."""
        view = self.view
        if not self.open or view is None or self.fetching or self.problem:
            return
        record = view.get("sessionRecord")
        if record is None:
            return
        if not self.window.pages:
            self._ask(None)
        elif self.window.live and int(record.get("eventCount", 0)) > self.window.end:
            self._ask(f"{SESSION_LIST}>{self.window.end}")

    def _ask(self, cursor: str | None) -> None:
        view = self.view
        if view is None or self.fetching:
            return
        self.fetching = True
        # To the app itself: a message made while the inspector or the app handles one
        # would stop bubbling at its sender (textual's rule), before the app.
        self.app.post_message(
            self.PageWanted(
                str(view["runId"]),
                int(view["revision"]),
                cursor,
                self.generation,
                {d: e for page in self.window.pages for d, e in page.entries.items()},
            )
        )

    def _show(self) -> None:
        if not self.open:
            return
        view = self.view
        if view is None or "sessionRecord" not in view:
            self.update("This run has no recorded conversation.")
            return
        shown = conversation_content(view, self.window, node=self.node, until_ms=self.until_ms)
        if self.problem is not None:
            shown = Content.styled(f"could not load: {self.problem}", "$error") + "\n" + shown
        self.update(shown)
