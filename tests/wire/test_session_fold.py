"""The session fold as a pure function: deltas build blocks by content index, tool
executions join their calls, a record with gaps still folds, and a checkpoint keeps only
what still streams or runs while `replay` from it equals the fold from the start.
"""

from __future__ import annotations

from typing import Any

from pi_workflows.wire.session_fold import checkpoint, conversation, empty_state, fold, replay


def items(*events: dict[str, Any], turn: str = "t-1") -> list[dict[str, Any]]:
    return [{"position": n, "turnId": turn, **event} for n, event in enumerate(events)]


def test_deltas_make_blocks_and_tool_results_join_their_calls() -> None:
    state = fold(
        empty_state(),
        items(
            {"type": "messageStart", "role": "assistant"},
            {"type": "thinkingDelta", "contentIndex": 0, "delta": "hm"},
            {"type": "textDelta", "contentIndex": 1, "delta": "Hel"},
            {"type": "textDelta", "contentIndex": 1, "delta": "lo"},
            {"type": "toolCallDelta", "contentIndex": 2, "toolCallId": "c", "delta": "{}"},
            {"type": "toolCallEnd", "contentIndex": 2, "toolCallId": "c", "name": "ls",
             "arguments": {}},
            {"type": "messageEnd", "entryId": "e-1", "stopReason": "toolUse"},
            {"type": "toolStart", "toolCallId": "c", "name": "ls"},
            {"type": "toolEnd", "toolCallId": "c", "isError": True, "result": "denied"},
        ),
    )  # fmt: skip
    [message] = conversation(state)
    assert message["settled"] and message["entryId"] == "e-1"
    thinking, text, call = message["content"]
    assert thinking["thinking"] == "hm" and text["text"] == "Hello"
    assert call["name"] == "ls" and call["argumentsText"] == "{}" and call["complete"]
    assert call["execution"] == {"name": "ls", "status": "error", "result": "denied"}


def test_a_record_with_gaps_and_unknown_events_still_folds() -> None:
    state = fold(
        empty_state(),
        items(
            {"type": "textDelta", "delta": "no start"},  # its messageStart was lost
            {"type": "futureEvent", "x": 1},
            {"type": "toolEnd", "toolCallId": "orphan", "result": 1},
            {"type": "messageEnd"},
        ),
    )
    [message] = state["messages"]
    assert message["content"][0]["text"] == "no start" and message["settled"]
    assert state["tools"]["orphan"]["status"] == "done"


def test_a_checkpoint_keeps_what_streams_and_replay_equals_the_fold() -> None:
    events = items(
        {"type": "messageStart", "role": "assistant"},
        {"type": "textDelta", "delta": "first"},
        {"type": "messageEnd", "entryId": "e-1"},
        {"type": "toolStart", "toolCallId": "c", "name": "ls"},
        {"type": "messageStart", "role": "assistant"},
        {"type": "textDelta", "delta": "second"},
        {"type": "toolEnd", "toolCallId": "c", "result": "ok"},
        {"type": "textDelta", "delta": " more"},
        {"type": "messageEnd", "entryId": "e-2"},
    )
    for cut in range(len(events) + 1):
        saved = checkpoint(fold(empty_state(), events[:cut]))
        assert all(not message["settled"] for message in saved["messages"])
        assert all(tool["status"] == "running" for tool in saved["tools"].values())
        pages = [(empty_state(), events[:cut]), (saved, events[cut:])]
        assert replay(pages) == fold(empty_state(), events)
