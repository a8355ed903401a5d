"""The session fold (client-protocol.md § Run and session views): pure functions from
recorded session events to the conversation. A page's replay checkpoint is `checkpoint`
of the fold before it (what still streams or runs, so it stays small); `replay` over the
pages from the first equals `fold` over every event; `conversation` renders a state.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = [
    "EVENT_TYPES",
    "checkpoint",
    "conversation",
    "empty_state",
    "fold",
    "replay",
]

EVENT_TYPES: Final = frozenset(
    {
        "messageStart",
        "textDelta",
        "thinkingDelta",
        "toolCallDelta",
        "toolCallEnd",
        "toolStart",
        "toolEnd",
        "messageEnd",
    }
)
"""The session events the extension reports (each names its `type`)."""

_BLOCK_OF: Final = {"textDelta": "text", "thinkingDelta": "thinking", "toolCallDelta": "toolCall"}
_TEXT_FIELD: Final = {"text": "text", "thinking": "thinking", "toolCall": "argumentsText"}


def empty_state() -> dict[str, Any]:
    """The state before the first event: no messages, nothing streaming, no tools."""
    return {"messages": [], "open": None, "tools": {}}


def fold(state: Mapping[str, Any], items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The state after `items` (page items: `type`, `turnId` and the event's fields),
    folded onto a copy of `state`. Never raises on a stored event: a delta with no
    streaming message starts one, an unknown type changes nothing."""
    folded = copy.deepcopy(dict(state))
    for item in items:
        _apply(folded, item)
    return folded


def _apply(state: dict[str, Any], item: Mapping[str, Any]) -> None:
    kind = item.get("type")
    if kind == "messageStart":
        _start(state, item, str(item.get("role") or "assistant"))
    elif kind in _BLOCK_OF:
        _delta(state, item, _BLOCK_OF[str(kind)])
    elif kind == "toolCallEnd":
        _tool_call_end(state, item)
    elif kind == "toolStart":
        tool = _tool(state, item)
        tool["status"] = "running"
        if "arguments" in item:
            tool["arguments"] = item["arguments"]
    elif kind == "toolEnd":
        tool = _tool(state, item)
        tool["status"] = "error" if item.get("isError") is True else "done"
        if "result" in item:
            tool["result"] = item["result"]
        if item.get("omitted"):
            tool["omitted"] = item.get("byteCount")
    elif kind == "messageEnd":
        _end(state, item)


def _start(state: dict[str, Any], item: Mapping[str, Any], role: str) -> dict[str, Any]:
    message: dict[str, Any] = {
        "turnId": item.get("turnId"),
        "start": item.get("position"),
        "role": role,
        "content": [],
        "settled": False,
    }
    state["messages"].append(message)
    state["open"] = len(state["messages"]) - 1
    return message


def _streaming(state: dict[str, Any], item: Mapping[str, Any]) -> dict[str, Any]:
    """The message this event belongs to: the open one of the same turn, else a new one
    (after a gap in the record, a delta may come without its start)."""
    index = state["open"]
    if index is not None:
        message: dict[str, Any] = state["messages"][index]
        if message["turnId"] == item.get("turnId"):
            return message
    return _start(state, item, "assistant")


def _block(message: dict[str, Any], index: int, block_type: str) -> dict[str, Any]:
    for block in reversed(message["content"]):
        if block["index"] == index and block["type"] == block_type:
            found: dict[str, Any] = block
            return found
    created: dict[str, Any] = {"type": block_type, "index": index, _TEXT_FIELD[block_type]: ""}
    message["content"].append(created)
    return created


def _index(item: Mapping[str, Any]) -> int:
    value = item.get("contentIndex")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _delta(state: dict[str, Any], item: Mapping[str, Any], block_type: str) -> None:
    block = _block(_streaming(state, item), _index(item), block_type)
    field = _TEXT_FIELD[block_type]
    delta = item.get("delta")
    if isinstance(delta, str):
        block[field] += delta
    elif item.get("omitted"):
        block["omitted"] = block.get("omitted", 0) + int(item.get("byteCount") or 0)
    for key in ("toolCallId", "name"):
        if block_type == "toolCall" and isinstance(item.get(key), str):
            block["id" if key == "toolCallId" else key] = item[key]


def _tool_call_end(state: dict[str, Any], item: Mapping[str, Any]) -> None:
    block = _block(_streaming(state, item), _index(item), "toolCall")
    for key, field in (("toolCallId", "id"), ("name", "name"), ("arguments", "arguments")):
        if key in item:
            block[field] = item[key]
    block["complete"] = True


def _tool(state: dict[str, Any], item: Mapping[str, Any]) -> dict[str, Any]:
    call_id = str(item.get("toolCallId") or "")
    tools: dict[str, Any] = state["tools"]
    tool: dict[str, Any] = tools.setdefault(call_id, {"status": "running"})
    if isinstance(item.get("name"), str):
        tool["name"] = item["name"]
    return tool


def _end(state: dict[str, Any], item: Mapping[str, Any]) -> None:
    index = state["open"]
    message: dict[str, Any]
    if index is None or state["messages"][index]["turnId"] != item.get("turnId"):
        message = _start(state, item, str(item.get("role") or "assistant"))
    else:
        message = state["messages"][index]
    message["settled"] = True
    for key in ("entryId", "stopReason", "role"):
        if isinstance(item.get(key), str):
            message[key] = item[key]
    if isinstance(item.get("entryContent"), Mapping):
        message["entryContent"] = dict(item["entryContent"])  # the verbatim Pi entry
    state["open"] = None


def checkpoint(state: Mapping[str, Any]) -> dict[str, Any]:
    """What a page's checkpoint keeps of the state before it: the messages not settled
    (with which one streams) and the tools still running. Settled messages and ended
    tools are in the pages where they settled and ended (`replay` collects them)."""
    messages = state.get("messages", [])
    kept = [index for index, message in enumerate(messages) if not message["settled"]]
    open_index = state.get("open")
    return copy.deepcopy(
        {
            "messages": [messages[index] for index in kept],
            "open": kept.index(open_index) if open_index in kept else None,
            "tools": {
                call: tool
                for call, tool in state.get("tools", {}).items()
                if tool.get("status") == "running"
            },
        }
    )


def replay(
    pages: Iterable[tuple[Mapping[str, Any], Iterable[Mapping[str, Any]]]],
) -> dict[str, Any]:
    """The state after the pages' items, from each page's checkpoint and items, in
    page order from the first page (the last may be cut short at a replay position):
    what `fold` from `empty_state()` over the same items gives."""
    settled: list[dict[str, Any]] = []
    tools: dict[str, Any] = {}
    last = empty_state()
    for state, items in pages:
        last = fold(state, items)
        settled += [message for message in last["messages"] if message["settled"]]
        tools.update(last["tools"])
    active = [message for message in last["messages"] if not message["settled"]]
    streaming = last["messages"][last["open"]] if last["open"] is not None else None
    messages = sorted(settled + active, key=lambda message: _order(message.get("start")))
    open_index = next(
        (index for index, message in enumerate(messages) if message is streaming), None
    )
    return {"messages": messages, "open": open_index, "tools": tools}


def _order(start: object) -> int:
    return start if isinstance(start, int) else -1


def conversation(state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The folded messages, each tool call with what its execution returned."""
    tools: Mapping[str, Any] = state.get("tools", {})
    messages: list[dict[str, Any]] = []
    for message in state.get("messages", []):
        shown = dict(message)
        content = []
        for block in sorted(message["content"], key=lambda b: int(b["index"])):
            shown_block = dict(block)
            if block["type"] == "toolCall" and block.get("id") in tools:
                shown_block["execution"] = tools[block["id"]]
            content.append(shown_block)
        shown["content"] = content
        messages.append(shown)
    return messages
