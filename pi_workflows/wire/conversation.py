"""A run's recorded conversation on the client side, shared by `run show` and `piw`:
session-event pages loaded through a client with their replay checkpoints (hydrated),
replayed to the conversation (wire/session_fold.py), and its lines: each recorded turn
under its step with its capture status, then its messages, each text bounded by `head`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.wire.client import WorkflowClient
from pi_workflows.wire.session_fold import conversation, empty_state, replay

__all__ = [
    "SESSION_LIST",
    "ConversationLine",
    "LineKind",
    "SessionPage",
    "conversation_lines",
    "conversation_rows",
    "cut_at",
    "load_conversation",
    "load_page",
    "load_recent",
    "pages_conversation",
    "plain_lines",
    "verbatim_blocks",
]

SESSION_LIST: Final = "sessionEvents"
"""The `view.page` list of a run's session events."""
MAX_ENTRY_BYTES: Final = 256 * 1024
"""The largest verbatim entry loaded with a page (a larger one stays folded)."""

LineKind = Literal[
    "summary", "note", "step", "text", "thinking", "toolCall", "toolResult", "toolError"
]


@dataclass(frozen=True, slots=True)
class SessionPage:
    """One stored session-event page with the folded state before its first item."""

    first: int
    """Position of `items[0]` among the run's session events."""
    items: list[dict[str, Any]]
    state: dict[str, Any]
    """The replay checkpoint's state (loaded and verified when it came by reference)."""
    count: int
    """The run's event count when the page was served."""
    older: str | None
    """The cursor of the page before this one (None: this is the first)."""
    newer: str | None
    """The cursor of the page after this one (None: this was the newest)."""
    checkpoint_missing: bool = False
    """The checkpoint's content is gone: the page replays from an empty state."""
    entries: Mapping[str, Any] = field(default_factory=dict)
    """The verbatim Pi entries of the page's settled assistant messages, by digest."""

    @property
    def end(self) -> int:
        return self.first + len(self.items)


def load_page(
    client: WorkflowClient,
    run_id: str,
    revision: int,
    cursor: str | None,
    known: Mapping[str, Any] | None = None,
) -> SessionPage:
    """The page holding `cursor` (`sessionEvents<N` / `sessionEvents>N`), or the newest
    page when `cursor` is None. Stored pages never change (only the newest grows), so
    the revision is the caller's, not matched. `known`: verbatim entries already loaded
    (by digest), not read again when the newest page is fetched as it grows."""
    payload = {"list": SESSION_LIST, "revision": revision, "cursor": cursor}
    page = client.call("view.page", payload, run_id=run_id)["receipt"]
    checkpoint = page["checkpoint"]
    missing = False
    if "stateContent" in checkpoint:
        state = json.loads(client.run_content(run_id, checkpoint["stateContent"]))
    elif isinstance(checkpoint.get("state"), dict):
        state = checkpoint["state"]
    else:
        state, missing = empty_state(), True
    items = list(page["items"])
    return SessionPage(
        first=int(page.get("first", 0)),
        items=items,
        state={**empty_state(), **state},
        count=int(page.get("count", 0)),
        older=page.get("nextCursor"),
        newer=page.get("previousCursor"),
        checkpoint_missing=missing,
        entries=_load_entries(client, run_id, items, known or {}),
    )


def _load_entries(
    client: WorkflowClient,
    run_id: str,
    items: Iterable[Mapping[str, Any]],
    known: Mapping[str, Any],
) -> dict[str, Any]:
    """The verbatim entries the page's finished assistant messages name (each checked
    against its digest; one that cannot be read leaves its message folded)."""
    entries: dict[str, Any] = {}
    for item in items:
        ref = item.get("entryContent")
        if item.get("type") != "messageEnd" or item.get("role") != "assistant":
            continue
        if not isinstance(ref, Mapping) or int(ref.get("byteCount") or 0) > MAX_ENTRY_BYTES:
            continue
        if ref.get("digest") in known:
            entries[str(ref["digest"])] = known[str(ref["digest"])]
            continue
        try:
            entries[str(ref["digest"])] = json.loads(client.run_content(run_id, ref))
        except (PiWorkflowsError, ValueError, KeyError):
            continue
    return entries


def load_conversation(client: WorkflowClient, view: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The folded messages of the run's whole session record, every page oldest first
    (empty when it has none)."""
    if "sessionRecord" not in view:
        return []
    run_id, revision = str(view["runId"]), int(view["revision"])
    pages = [load_page(client, run_id, revision, f"{SESSION_LIST}>0")]
    while (cursor := pages[-1].newer) is not None:
        pages.append(load_page(client, run_id, revision, cursor))
    return pages_conversation(pages)


def load_recent(
    client: WorkflowClient, view: Mapping[str, Any], *, max_pages: int, min_messages: int
) -> list[SessionPage]:
    """The newest pages, oldest first: the newest one, then older ones until they
    replay to `min_messages` messages or `max_pages` are loaded (empty: no record)."""
    if "sessionRecord" not in view:
        return []
    run_id, revision = str(view["runId"]), int(view["revision"])
    pages = [load_page(client, run_id, revision, None)]
    while (
        (cursor := pages[0].older) is not None
        and len(pages) < max_pages
        and len(pages_conversation(pages)) < min_messages
    ):
        pages.insert(0, load_page(client, run_id, revision, cursor))
    return pages


def cut_at(pages: Sequence[SessionPage], until_ms: int | None) -> list[SessionPage]:
    """The pages as they were at `until_ms` (a replay position in time): the items
    recorded after it are left out, and with them every later page."""
    if until_ms is None:
        return list(pages)
    kept: list[SessionPage] = []
    for page in pages:
        items = [item for item in page.items if int(item.get("recordedAt", 0)) <= until_ms]
        if len(items) < len(page.items):
            if items or not kept:
                kept.append(_with_items(page, items))
            break
        kept.append(page)
    return kept


def _with_items(page: SessionPage, items: list[dict[str, Any]]) -> SessionPage:
    return SessionPage(
        page.first,
        items,
        page.state,
        page.count,
        page.older,
        page.newer,
        page.checkpoint_missing,
        page.entries,
    )


def pages_conversation(pages: Iterable[SessionPage]) -> list[dict[str, Any]]:
    """The folded messages of consecutive pages (oldest first); from a page after the
    first, what settled before it is left out, and everything after it is there. A
    settled assistant message whose verbatim entry was loaded shows that entry."""
    held = list(pages)
    messages = conversation(replay((page.state, page.items) for page in held))
    entries = {digest: entry for page in held for digest, entry in page.entries.items()}
    for message in messages:
        ref = message.get("entryContent")
        if message.get("settled") and isinstance(ref, Mapping) and ref.get("digest") in entries:
            blocks = verbatim_blocks(entries[str(ref["digest"])], message["content"])
            if blocks is not None:
                message["content"], message["verbatim"] = blocks, True
    return messages


def verbatim_blocks(entry: Any, folded: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """A Pi assistant message's content as folded blocks (text, thinking, tool calls
    with the execution the fold found for them); None: not a message with content."""
    content = entry.get("content") if isinstance(entry, Mapping) else None
    if isinstance(content, str):
        return [{"type": "text", "index": 0, "text": content}]
    if not isinstance(content, list):
        return None
    executions = {
        block.get("id"): block["execution"]
        for block in folded
        if block.get("type") == "toolCall" and "execution" in block
    }
    blocks: list[dict[str, Any]] = []
    for index, raw in enumerate(content):
        if not isinstance(raw, Mapping):
            continue
        kind = raw.get("type")
        if kind == "text":
            blocks.append({"type": "text", "index": index, "text": str(raw.get("text", ""))})
        elif kind == "thinking":
            blocks.append(
                {"type": "thinking", "index": index, "thinking": str(raw.get("thinking", ""))}
            )
        elif kind == "toolCall":
            call: dict[str, Any] = {
                "type": "toolCall",
                "index": index,
                "id": raw.get("id"),
                "name": raw.get("name"),
                "arguments": raw.get("arguments"),
                "complete": True,
            }
            if raw.get("id") in executions:
                call["execution"] = executions[raw.get("id")]
            blocks.append(call)
    return blocks


# --- lines ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConversationLine:
    """One line (its text may hold line breaks) of the conversation, by kind."""

    kind: LineKind
    text: str
    label: str = ""
    """The message's role (`assistant:`) on each content block's first line."""


def _step_heading(segment: Mapping[str, Any]) -> str:
    where = f"step {segment['node']}" if "node" in segment else f"{segment['kind']} message"
    capture = str(segment["status"])
    if "failure" in segment:
        capture += f" ({segment['failure']})"
    notes = [capture] + [_finding(finding) for finding in segment["findings"]]
    notes = [note for note in notes if note]
    return f"{where}, turn {segment['turnId']}: capture {', '.join(dict.fromkeys(notes))}"


def _finding(finding: Mapping[str, Any]) -> str:
    code = str(finding["code"])
    if code == "sequenceGap":
        return f"{finding['missing']} events missing"
    if code == "countMismatch":
        return f"{finding['recorded']} of {finding['expected']} events recorded"
    if code == "captureFailed":
        return ""  # already in the status
    return code


def _block_lines(
    block: Mapping[str, Any], head: Callable[[str], str]
) -> Iterator[tuple[LineKind, str]]:
    kind = block["type"]
    if kind == "text":
        yield "text", head(block.get("text", ""))
    elif kind == "thinking":
        yield "thinking", "thinking: " + head(block.get("thinking", ""))
    elif kind == "toolCall":
        arguments = block.get("arguments", block.get("argumentsText", ""))
        shown = arguments if isinstance(arguments, str) else json.dumps(arguments)
        yield "toolCall", f"tool call {block.get('name', '?')} {head(shown)}"
        execution = block.get("execution")
        if isinstance(execution, Mapping):
            yield _execution_line(execution, head)


def _execution_line(
    execution: Mapping[str, Any], head: Callable[[str], str]
) -> tuple[LineKind, str]:
    status = str(execution.get("status", "?"))
    kind: LineKind = "toolError" if status == "error" else "toolResult"
    if "result" in execution:
        result = execution["result"]
        text = result if isinstance(result, str) else json.dumps(result)
        return kind, f"  → {status}: {head(text)}"
    if execution.get("omitted") is not None:
        return kind, f"  → {status}: ({execution['omitted']} bytes, too large to record)"
    return kind, f"  → {status}"


def conversation_rows(
    view: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    head: Callable[[str], str],
    *,
    first: int = 0,
    node: str | None = None,
) -> Iterator[ConversationLine]:
    """Each recorded turn under its step with its capture status, then its messages.
    `first`: the position of the first event `messages` were folded from (a turn wholly
    before it is left out, with a note); `node`: that step's turns only."""
    record = view.get("sessionRecord")
    if not record:
        return
    by_turn: dict[str, list[Mapping[str, Any]]] = {}
    for message in messages:
        by_turn.setdefault(str(message.get("turnId")), []).append(message)
    segments = [s for s in record["segments"] if node is None or s.get("node") == node]
    if node is not None:
        yield ConversationLine("summary", f"conversation of step {node}: {len(segments)} turns")
    elif record["segmentCount"] > len(segments):
        shown, count = len(segments), record["segmentCount"]
        yield ConversationLine(
            "summary", f"conversation: the newest {shown} of {count} recorded turns"
        )
    else:
        yield ConversationLine("summary", f"conversation: {record['segmentCount']} recorded turns")
    if first > 0:
        yield ConversationLine("note", f"(the {first} events before these are not loaded)")
    for segment in segments:
        turn = by_turn.get(str(segment["turnId"]), [])
        if not turn and int(segment.get("firstPosition", first)) < first:
            continue  # wholly before the pages loaded
        yield ConversationLine("step", _step_heading(segment))
        for message in turn:
            for block in message["content"]:
                for number, (kind, text) in enumerate(_block_lines(block, head)):
                    label = f"{message['role']}:" if number == 0 else ""
                    yield ConversationLine(kind, text, label)


def plain_lines(line: ConversationLine) -> list[str]:
    """A line as plain text: turns indented under the summary, messages under turns,
    a text's further lines under its first."""
    if line.kind == "summary":
        return [line.text]
    if line.kind in ("note", "step"):
        return [f"  {line.text}"]
    first, *more = line.text.split("\n")
    return [f"    {line.label:<11} {first}", *(f"    {'':<11} {rest}" for rest in more)]


def conversation_lines(
    view: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    head: Callable[[str], str],
    *,
    first: int = 0,
    node: str | None = None,
) -> Iterator[str]:
    """`conversation_rows` as plain text lines (`run show`, `piw --once`)."""
    for row in conversation_rows(view, messages, head, first=first, node=node):
        yield from plain_lines(row)
