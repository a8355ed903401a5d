"""`run show`'s conversation: what the model said in each interactive step's turns.

Every session-event page, oldest first, with its replay checkpoint, replays to the whole
recorded conversation (wire/session_fold.py `replay`). Lines are bounded (each text's
head) unless `--full` is given.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from pi_workflows.wire.client import WorkflowClient
from pi_workflows.wire.session_fold import conversation, replay

__all__ = ["conversation_lines", "load_conversation"]


def load_conversation(client: WorkflowClient, view: dict[str, Any]) -> list[dict[str, Any]]:
    """The folded messages of the run's session record (empty when it has none)."""
    if "sessionRecord" not in view:
        return []
    pages: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    cursor: str | None = "sessionEvents>0"
    while cursor is not None:  # stored pages never change: no revision to match
        payload = {"list": "sessionEvents", "revision": view["revision"], "cursor": cursor}
        page = client.call("view.page", payload, run_id=view["runId"])["receipt"]
        checkpoint = page["checkpoint"]
        if "stateContent" in checkpoint:
            state = json.loads(client.run_content(view["runId"], checkpoint["stateContent"]))
        else:
            state = checkpoint.get("state") or {}
        pages.append((state, page["items"]))
        cursor = page.get("previousCursor")
    return conversation(replay(pages))


def _step_heading(segment: dict[str, Any]) -> str:
    where = f"step {segment['node']}" if "node" in segment else f"{segment['kind']} message"
    capture = segment["status"]
    if "failure" in segment:
        capture += f" ({segment['failure']})"
    notes = [capture] + [_finding(finding) for finding in segment["findings"]]
    notes = [note for note in notes if note]
    return f"{where}, turn {segment['turnId']}: capture {', '.join(dict.fromkeys(notes))}"


def _finding(finding: dict[str, Any]) -> str:
    code = str(finding["code"])
    if code == "sequenceGap":
        return f"{finding['missing']} events missing"
    if code == "countMismatch":
        return f"{finding['recorded']} of {finding['expected']} events recorded"
    if code == "captureFailed":
        return ""  # already in the status
    return code


def _block_lines(block: dict[str, Any], head: Callable[[str], str]) -> Iterator[str]:
    kind = block["type"]
    if kind == "text":
        yield head(block.get("text", ""))
    elif kind == "thinking":
        yield "thinking: " + head(block.get("thinking", ""))
    elif kind == "toolCall":
        arguments = block.get("arguments", block.get("argumentsText", ""))
        shown = arguments if isinstance(arguments, str) else json.dumps(arguments)
        yield f"tool call {block.get('name', '?')} {head(shown)}"
        execution = block.get("execution")
        if isinstance(execution, dict):
            result = execution.get("result")
            text = result if isinstance(result, str) else json.dumps(result)
            yield f"  → {execution.get('status', '?')}: {head(text)}"


def conversation_lines(
    view: dict[str, Any], messages: list[dict[str, Any]], head: Callable[[str], str]
) -> Iterator[str]:
    """Each recorded turn under its step with its capture status, then its messages."""
    record = view.get("sessionRecord")
    if not record:
        return
    by_turn: dict[str, list[dict[str, Any]]] = {}
    for message in messages:
        by_turn.setdefault(str(message.get("turnId")), []).append(message)
    shown = len(record["segments"])
    if record["segmentCount"] > shown:
        yield f"conversation: the newest {shown} of {record['segmentCount']} recorded turns"
    else:
        yield f"conversation: {record['segmentCount']} recorded turns"
    for segment in record["segments"]:
        yield f"  {_step_heading(segment)}"
        for message in by_turn.get(segment["turnId"], []):
            for block in message["content"]:
                for number, line in enumerate(_block_lines(block, head)):
                    label = f"{message['role']}:" if number == 0 else ""
                    first, *more = line.split("\n")
                    yield f"    {label:<11} {first}"
                    yield from (f"    {'':<11} {rest}" for rest in more)
