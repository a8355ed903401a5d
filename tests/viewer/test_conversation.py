"""The Conversation tab of `piw` (headless, textual's Pilot) against a real server.

A coordinator connection records a turn's session events through the real protocol
(`sessionEvents.record`, as tests/server/test_session_record.py does); the app loads
the newest session-event page with its replay checkpoint, older pages on `o`, and the
pages the record grows by while it is open. What it shows is the fold of the events.
"""

from __future__ import annotations

from typing import Any

import pytest
from textual.pilot import Pilot

from pi_workflows.viewer._app import PiwApp
from pi_workflows.viewer._conversation import (
    HELD_PAGES,
    ConversationPane,
    SessionWindow,
    conversation_content,
)
from pi_workflows.viewer._inspector import Inspector
from pi_workflows.wire.conversation import SessionPage, pages_conversation
from pi_workflows.wire.session_fold import conversation, empty_state, fold
from tests.server import origin, test_session_record
from tests.server.test_session_record import Turn, reply
from tests.viewer.test_app import drive, until
from tests.viewer.test_once import conversation_events

pytestmark = pytest.mark.timeout(180)

running = origin.running
ask_project = origin.ask_project
turn = test_session_record.turn


def pane_of(app: PiwApp) -> ConversationPane:
    return app.query_one(Inspector).conversation


def shown(app: PiwApp) -> str:
    return str(pane_of(app).render())


async def open_tab(app: PiwApp, pilot: Pilot[int]) -> None:
    """Open the Conversation tab once the run's view has offered it."""
    await until(pilot, lambda: app.view is not None and "sessionRecord" in app.view, "a record")
    inspector = app.query_one(Inspector)
    await until(pilot, lambda: not inspector.query_one("#conversation").disabled, "the tab")
    inspector.active = "conversation"
    await until(pilot, lambda: pane_of(app).window.pages, "the newest page")


def test_the_tab_shows_the_folded_turn_and_follows_the_growing_record(turn: Turn) -> None:
    assert turn.record(conversation_events())["outcome"] == "accepted"

    async def scenario(app: PiwApp, pilot: Pilot[int]) -> None:
        await open_tab(app, pilot)
        await until(pilot, lambda: "All files are listed." in shown(app), "the last reply")
        text = shown(app)
        assert "step ask, turn turn-1: capture recording" in text
        assert "assistant:  Here is the plan." in text
        assert 'assistant:  tool call bash {"command": "ls"}' in text
        assert "→ done: a.txt a.txt" in text
        assert "(cut: 12000 bytes in all)" in text, "a long tool result is cut, with its size"
        content = pane_of(app).render()
        thinking = text.index("thinking: Look first.")
        assert any(
            span.start <= thinking < span.end and "dim" in str(span.style)
            for span in getattr(content, "spans", [])
        ), "thinking is dimmed"
        # The record grows while the tab is open: the new events are fetched and shown.
        more = reply(14, "A later reply.", "entry-d")
        assert turn.record(more, final={"count": 18})["outcome"] == "accepted"
        await until(pilot, lambda: "A later reply." in shown(app), "the new reply")
        await until(pilot, lambda: "capture complete" in shown(app), "the finished capture")
        # Selecting the step in Steps keeps its turns (it recorded them).
        pane_of(app).select_node("ask")
        assert "conversation of step ask: 1 turns" in shown(app)

    drive(turn.server.state_dir, turn.run_id, scenario)


def long_conversation(count: int) -> list[dict[str, Any]]:
    """`count` events of replies with thinking, text and a tool call with its result."""
    events: list[dict[str, Any]] = []
    round_ = 0
    while len(events) < count:
        round_ += 1
        call = f"call-{round_}"
        for event in (
            {"type": "messageStart", "role": "assistant"},
            {"type": "thinkingDelta", "contentIndex": 0, "delta": f"think {round_}"},
            {"type": "textDelta", "contentIndex": 1, "delta": f"reply {round_} "},
            {"type": "textDelta", "contentIndex": 1, "delta": "and more"},
            {"type": "toolCallDelta", "contentIndex": 2, "toolCallId": call, "delta": "{}"},
            {"type": "toolCallEnd", "contentIndex": 2, "toolCallId": call, "name": "read"},
            {"type": "messageEnd", "entryId": f"entry-{round_}", "role": "assistant"},
            {"type": "toolStart", "toolCallId": call, "name": "read"},
            {"type": "toolEnd", "toolCallId": call, "result": f"result {round_}"},
        ):
            if len(events) < count:
                events.append({"seq": len(events), **event})
    return events


def test_a_conversation_over_several_pages_shows_what_folding_every_event_gives(
    turn: Turn,
) -> None:
    events = long_conversation(700)  # three stored pages (256 events each at most)
    for first in range(0, len(events), 250):
        assert turn.record(events[first : first + 250])["outcome"] == "accepted"
    loaded: dict[str, Any] = {}

    async def scenario(app: PiwApp, pilot: Pilot[int]) -> None:
        await open_tab(app, pilot)
        pane = pane_of(app)
        newest = list(pane.window.pages)
        assert len(newest) == 1 and newest[0].first > 0 and newest[0].end == 700
        assert "o: older" in shown(app)
        loaded["newest"] = pages_conversation(newest)
        while (first := pane.window.first) > 0:  # older pages, one `o` each
            await pilot.press("o")
            await until(pilot, lambda: pane.window.first < first, "an older page")
        assert len(pane.window.pages) == 3
        loaded["all"] = pages_conversation(pane.window.pages)
        loaded["items"] = [item for page in pane.window.pages for item in page.items]
        loaded["text"] = shown(app)
        assert app.view is not None
        whole = SessionWindow(pane.window.pages, live=True)
        loaded["view"], loaded["window"] = app.view, whole

    drive(turn.server.state_dir, turn.run_id, scenario)
    items = loaded["items"]
    assert [item["seq"] for item in items] == list(range(700))
    folded = conversation(fold(empty_state(), items))
    assert loaded["all"] == folded, "the pages replay to what folding every event gives"
    assert loaded["newest"] == folded[-len(loaded["newest"]) :], "the newest page: the tail"
    assert "reply 1 and more" in loaded["text"] and "reply 78 and more" in loaded["text"]
    assert "not loaded" not in loaded["text"]
    plain = str(conversation_content(loaded["view"], loaded["window"]))
    assert plain == loaded["text"]


def page(first: int, size: int, *, newer: bool) -> SessionPage:
    items = [{"position": first + n, "seq": first + n, "type": "x"} for n in range(size)]
    return SessionPage(
        first,
        items,
        empty_state(),
        count=first + size + (1 if newer else 0),
        older=f"sessionEvents<{first}" if first else None,
        newer=f"sessionEvents>{first + size}" if newer else None,
    )


def test_the_window_holds_consecutive_pages_up_to_its_limit() -> None:
    window = SessionWindow()
    window.add(page(100 * HELD_PAGES, 10, newer=False))
    assert window.live and (window.first, window.end) == (100 * HELD_PAGES, 100 * HELD_PAGES + 10)
    window.add(page(100 * HELD_PAGES, 50, newer=False))  # the newest page grew
    assert len(window.pages) == 1 and window.end == 100 * HELD_PAGES + 50 and window.live
    for first in range(100 * (HELD_PAGES - 1), -1, -100):  # older pages, one by one
        window.add(page(first, 100, newer=True))
    assert len(window.pages) == HELD_PAGES and window.first == 0
    assert not window.live, "the newest page went: the window no longer follows"
    window.add(page(window.end, 100, newer=False))  # newer again: the oldest goes
    assert window.live and window.first == 100 and len(window.pages) == HELD_PAGES
    window.add(page(5000, 10, newer=False))  # not consecutive: the window starts again
    assert [p.first for p in window.pages] == [5000]


def test_a_replayed_step_shows_the_conversation_as_it_was_when_the_step_ended() -> None:
    """Events recorded after the replay position are left out, and the pages after it."""
    events = long_conversation(18)  # two replies with their tool calls
    items = [
        {**event, "position": n, "turnId": "turn-1", "recordedAt": 1000 + n}
        for n, event in enumerate(events)
    ]
    view = {
        "sessionRecord": {
            "segmentCount": 1,
            "eventCount": 18,
            "segments": [
                {"turnId": "turn-1", "kind": "step", "node": "ask", "status": "complete",
                 "findings": [], "firstPosition": 0},
            ],
        }
    }  # fmt: skip
    first = SessionPage(0, items[:10], empty_state(), 18, None, "sessionEvents>10")
    second_state = fold(empty_state(), items[:10])
    second = SessionPage(10, items[10:], second_state, 18, "sessionEvents<10", None)
    window = SessionWindow([first, second], live=True)
    whole = str(conversation_content(view, window))
    assert "reply 1 and more" in whole and "reply 2 and more" in whole
    at_five = str(conversation_content(view, window, until_ms=1005))
    assert "reply 1" in at_five and "reply 2" not in at_five
    assert "→" not in at_five, "the tool had not run yet"
    assert "as at the replayed step" in at_five
    at_eleven = str(conversation_content(view, window, until_ms=1011))
    assert "→ done: result 1" in at_eleven and "reply 2 " in at_eleven
    assert "reply 2 and more" not in at_eleven, "its second delta came later"
