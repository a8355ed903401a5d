"""Run history windows: the run view's newest trace window, and `view.page`.

Implements client-protocol.md § Run and session views (`pi-workflows.run-page.v1`): a
page holds at most 256 items and at most `PAGE_BYTES` of encoded items; it echoes the
requested cursor and the current view revision, and a client applies it only when
both still match. The server counts a history first, then reads only the selected
range of `node_attempts` (LIMIT/OFFSET on the `node_attempts_by_run` index), never the
whole history. A step-centred trace request (`attemptId`) selects the window that
starts at that exact stored attempt.

Cursors are opaque to clients. Inside they name a position in start order:
`trace<120` is the window of items before position 120, newest first filled (older
history); `trace>120` the window from position 120 on (newer history). Attempts are
append-only, so a position names the same attempt at every later revision.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pi_workflows.domain._session_pages import SESSION_LIST, session_events_page
from pi_workflows.domain._view_content import (
    ViewRequestError,
    json_blob_value,
    long_text,
    wire_ref,
)
from pi_workflows.storage import VIEW_INLINE_BYTES as INLINE_BYTES
from pi_workflows.storage import (
    ContentRef,
    ContentUnavailableError,
    NumberedAttempt,
    Reader,
    attempt_position,
    attempt_window,
    count_attempts,
    count_transitions,
    failure_tracebacks,
    get_run,
    read_view_content,
    run_view_revision,
    transition_window,
)
from pi_workflows.wire.protocol import RUN_PAGE_SCHEMA

__all__ = [
    "LISTS",
    "PAGE_BYTES",
    "PAGE_ITEMS",
    "VIEW_TRACE_BYTES",
    "Window",
    "newest_trace",
    "run_page",
]

PAGE_ITEMS: Final = 256
"""The most items one window holds (the design's page size)."""
PAGE_BYTES: Final = 512 * 1024
"""The most encoded item bytes one `view.page` response holds."""
VIEW_TRACE_BYTES: Final = 384 * 1024
"""The most encoded trace bytes the run view itself holds, so it stays below 1 MiB."""
LISTS: Final = ("trace", "transitions", "graphSteps", SESSION_LIST)
_CURSOR = re.compile(r"^(trace|transitions|graphSteps)([<>])([0-9]{1,15})$")


@dataclass(frozen=True, slots=True)
class Window:
    """Items of one window, in start order, and where they sit in the history."""

    items: list[dict[str, Any]]
    first: int
    """Position of the first item (0 = the first attempt)."""
    count: int
    """How many items the whole history has."""

    @property
    def end(self) -> int:
        return self.first + len(self.items)

    def cursors(self, name: str) -> dict[str, str]:
        cursors: dict[str, str] = {}
        if self.first > 0:
            cursors["older"] = f"{name}<{self.first}"
        if self.end < self.count:
            cursors["newer"] = f"{name}>{self.end}"
        return cursors


# --- items -------------------------------------------------------------------------------


def trace_item(
    reader: Reader, attempt: NumberedAttempt, tracebacks: Mapping[str, ContentRef]
) -> dict[str, Any]:
    """One attempt of the trace, with its output, error and traceback."""
    item = _step_item(attempt)
    item["generation"] = attempt.generation
    item["startedAt"] = attempt.started_at
    if attempt.finished_at is not None:
        item["finishedAt"] = attempt.finished_at
    if attempt.output_hash is not None:
        item["output"] = json_blob_value(reader, attempt.run_id, attempt.output_hash)
    if attempt.error is not None:
        item["error"], ref = long_text(reader, attempt.run_id, attempt.error)
        if ref is not None:
            item["errorContent"] = ref
    traceback = tracebacks.get(attempt.attempt_id)
    if traceback is not None:
        item["traceback"] = _traceback(reader, traceback)
    return item


def _step_item(attempt: NumberedAttempt) -> dict[str, Any]:
    item: dict[str, Any] = {
        "attemptId": attempt.attempt_id,
        "node": attempt.node_path,
        "kind": attempt.node_type,
        "visit": attempt.visit,
        "attempt": attempt.number,
        "outcome": attempt.status,
    }
    if attempt.next_node_path is not None:
        item["next"] = attempt.next_node_path
    return item


def _transition_item(attempt: NumberedAttempt) -> dict[str, Any]:
    assert attempt.next_node_path is not None
    item: dict[str, Any] = {
        "attemptId": attempt.attempt_id,
        "from": attempt.node_path,
        "to": attempt.next_node_path,
        "visit": attempt.visit,
        "outcome": attempt.status,
    }
    if attempt.finished_at is not None:
        item["at"] = attempt.finished_at
    return item


def _traceback(reader: Reader, ref: ContentRef) -> dict[str, Any]:
    """The failed node's traceback: always its reference, and its text when small."""
    shown: dict[str, Any] = {"ref": wire_ref(ref)}
    if ref.byte_length > INLINE_BYTES:
        return shown
    try:
        shown["text"] = read_view_content(reader, ref).decode("utf-8", "replace")
    except ContentUnavailableError as exc:
        shown["unavailable"] = exc.reason
    return shown


# --- windows -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _History:
    """One list of a run: how to count it, read a range of it and render its items."""

    count: Callable[[Reader, str], int]
    read: Callable[[Reader, str, int, int, int], list[NumberedAttempt]]
    render: Callable[[list[NumberedAttempt]], list[dict[str, Any]]]


def _transitions_range(
    reader: Reader, run_id: str, offset: int, limit: int, total: int
) -> list[NumberedAttempt]:
    return transition_window(reader, run_id, offset, limit)


def _history(reader: Reader, run_id: str, name: str) -> _History:
    if name == "transitions":
        return _History(
            count_transitions,
            _transitions_range,
            lambda rows: [_transition_item(row) for row in rows],
        )
    if name == "graphSteps":
        return _History(
            count_attempts, attempt_window, lambda rows: [_step_item(row) for row in rows]
        )

    def render(rows: list[NumberedAttempt]) -> list[dict[str, Any]]:
        # Only this window's failed attempts are looked up (events read newest first).
        failed = [row.attempt_id for row in rows if row.status in ("failed", "timed_out")]
        tracebacks = failure_tracebacks(reader, run_id, failed)
        return [trace_item(reader, row, tracebacks) for row in rows]

    return _History(count_attempts, attempt_window, render)


def _fill(rendered: list[dict[str, Any]], budget: int) -> int:
    """How many of `rendered` (in fill order) fit `budget` encoded bytes; at least one."""
    spent = 0
    for taken, item in enumerate(rendered):
        spent += len(json.dumps(item, ensure_ascii=False).encode("utf-8")) + 1
        if spent > budget and taken > 0:
            return taken
    return len(rendered)


def _older(history: _History, reader: Reader, run_id: str, end: int, budget: int) -> Window:
    """The window of items before position `end`, newest first filled."""
    count = history.count(reader, run_id)
    end = min(end, count)
    first = max(0, end - PAGE_ITEMS)
    rows = history.read(reader, run_id, first, end - first, count)
    rendered = history.render(rows)
    rendered.reverse()  # newest first: the budget keeps the newest
    kept = rendered[: _fill(rendered, budget)]
    kept.reverse()
    return Window(kept, end - len(kept), count)


def _newer(history: _History, reader: Reader, run_id: str, first: int, budget: int) -> Window:
    """The window of items from position `first` on, oldest first filled."""
    count = history.count(reader, run_id)
    first = min(first, count)
    rows = history.read(reader, run_id, first, min(PAGE_ITEMS, count - first), count)
    rendered = history.render(rows)
    return Window(rendered[: _fill(rendered, budget)], first, count)


def newest_trace(reader: Reader, run_id: str) -> Window:
    """The run view's trace window: the newest attempts within `VIEW_TRACE_BYTES`."""
    history = _history(reader, run_id, "trace")
    return _older(history, reader, run_id, 2**53, VIEW_TRACE_BYTES)


def newest_steps(reader: Reader, run_id: str, limit: int) -> list[dict[str, Any]]:
    """The newest `limit` graph steps, without values."""
    count = count_attempts(reader, run_id)
    first = max(0, count - limit)
    rows = attempt_window(reader, run_id, first, count - first, count)
    return [_step_item(row) for row in rows]


# --- view.page -----------------------------------------------------------------------------


def _page_request(payload: Mapping[str, Any]) -> tuple[str, str | None, str | None]:
    name = payload.get("list")
    if name not in LISTS:
        raise ViewRequestError(
            "rejected",
            "unknownList",
            "payload.list is trace, transitions, graphSteps or sessionEvents",
        )
    revision = payload.get("revision")
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 0:
        raise ViewRequestError(
            "rejected", "invalidRevision", "payload.revision is the view revision the client holds"
        )
    cursor, attempt_id = payload.get("cursor"), payload.get("attemptId")
    if cursor is not None and not isinstance(cursor, str):
        raise ViewRequestError("rejected", "invalidCursor", "payload.cursor is a string")
    if attempt_id is not None and (not isinstance(attempt_id, str) or not attempt_id):
        raise ViewRequestError("rejected", "invalidAttempt", "payload.attemptId is an attempt ID")
    if attempt_id is not None and cursor is not None:
        raise ViewRequestError(
            "rejected", "invalidCursor", "give a cursor or an attemptId, not both"
        )
    return str(name), cursor, attempt_id


def _cursor_window(
    history: _History, reader: Reader, run_id: str, name: str, cursor: str
) -> Window:
    match = _CURSOR.match(cursor)
    if match is None or match.group(1) != name:
        raise ViewRequestError(
            "rejected", "invalidCursor", f"not a {name} cursor of this server's run views"
        )
    position = int(match.group(3))
    if match.group(2) == "<":
        return _older(history, reader, run_id, position, PAGE_BYTES)
    return _newer(history, reader, run_id, position, PAGE_BYTES)


def run_page(reader: Reader, run_id: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """`view.page`: one byte-bounded window of a run's trace, transitions or graph steps.

    Raises:
        ViewRequestError: `runNotFound`, `attemptNotFound`, or a malformed request.
    """
    name, cursor, attempt_id = _page_request(payload)
    revision = run_view_revision(reader, run_id)
    if revision is None or get_run(reader, run_id) is None:
        raise ViewRequestError("notFound", "runNotFound", f"no run {run_id}")
    if name == SESSION_LIST:  # stored pages, each with its replay checkpoint
        return {
            "schema": RUN_PAGE_SCHEMA,
            "runId": run_id,
            "list": name,
            "revision": revision,
            "cursor": cursor,
            **session_events_page(reader, run_id, payload),
        }
    history = _history(reader, run_id, name)
    if cursor is not None:
        window = _cursor_window(history, reader, run_id, name, cursor)
    elif attempt_id is not None and name != "transitions":
        position = attempt_position(reader, run_id, attempt_id)
        if position is None:
            raise ViewRequestError(
                "notFound", "attemptNotFound", "this run has no attempt with that ID"
            )
        window = _newer(history, reader, run_id, position, PAGE_BYTES)
    else:
        window = _older(history, reader, run_id, 2**53, PAGE_BYTES)
    page: dict[str, Any] = {
        "schema": RUN_PAGE_SCHEMA,
        "runId": run_id,
        "list": name,
        "revision": revision,
        "cursor": cursor,
        "items": window.items,
        "count": window.count,
        "first": window.first,
    }
    cursors = window.cursors(name)
    if "older" in cursors:
        page["nextCursor"] = cursors["older"]
    if "newer" in cursors:
        page["previousCursor"] = cursors["newer"]
    return page
