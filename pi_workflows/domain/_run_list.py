"""Run-list pages: `pi-workflows.run-list-page.v1` for `run.list` and the run-list view.

Implements client-protocol.md § Run and session views: revision-bound pages that read
only lightweight status and source facts (never input, launch options, steps or
trace). A page and its revision come from one read transaction (the reader actor's),
so a client that collects pages of one revision never mixes two lists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pi_workflows.storage import (
    Reader,
    RunListFilter,
    RunSummary,
    list_runs_filtered,
    run_list_revision,
)
from pi_workflows.wire.protocol import DISPLAY_STATUSES, RUN_LIST_PAGE_SCHEMA

__all__ = [
    "DEFAULT_PAGE_ITEMS",
    "DISPLAY_STATUSES",
    "MAX_PAGE_ITEMS",
    "RunListQuery",
    "RunListQueryError",
    "parse_run_list_query",
    "run_list_page",
]

DEFAULT_PAGE_ITEMS: Final = 100
MAX_PAGE_ITEMS: Final = 256
"""The protocol's bound on items per snapshot page."""
_CURSOR_PREFIX: Final = "c1."
_MAX_TIME_MS: Final = 2**53 - 1
_MAX_NAME_CHARS: Final = 200
_MAX_PROJECT_CHARS: Final = 4096


class RunListQueryError(ValueError):
    """A `run.list` payload the server refuses: `code` is the safe error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class RunListQuery:
    """One page request: the filter, the page size and where the page starts."""

    run_filter: RunListFilter = field(default_factory=RunListFilter)
    limit: int = DEFAULT_PAGE_ITEMS
    cursor: str | None = None
    """Opaque: the `nextCursor` of the previous page; None for the first page."""


def parse_run_list_query(payload: Mapping[str, Any]) -> RunListQuery:
    """Check a `run.list` payload; raises `RunListQueryError` with a safe message."""
    known = {"cursor", "limit", "status", "workflow", "project", "since", "until"}
    unknown = sorted(set(payload) - known)
    if unknown:
        raise RunListQueryError("payloadInvalid", f"unknown run.list field {unknown[0]}")
    limit = payload.get("limit", DEFAULT_PAGE_ITEMS)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_ITEMS:
        raise RunListQueryError("payloadInvalid", f"limit must be 1 to {MAX_PAGE_ITEMS}")
    cursor = payload.get("cursor")
    if cursor is not None:
        _decode_cursor(cursor)
    return RunListQuery(
        RunListFilter(
            statuses=_statuses(payload.get("status")),
            workflow=_text(payload, "workflow", _MAX_NAME_CHARS),
            project=_text(payload, "project", _MAX_PROJECT_CHARS),
            since=_time(payload, "since"),
            until=_time(payload, "until"),
        ),
        limit,
        cursor,
    )


def run_list_page(
    reader: Reader, query: RunListQuery, item: Callable[[RunSummary], dict[str, Any]]
) -> tuple[int, dict[str, Any]]:
    """One page and its revision; call it inside one read transaction.

    Reads limit + 1 rows so that `nextCursor` is given only when another page exists.
    """
    revision = run_list_revision(reader)
    before = None if query.cursor is None else _decode_cursor(query.cursor)
    rows = list_runs_filtered(reader, query.run_filter, limit=query.limit + 1, before=before)
    shown = rows[: query.limit]
    page: dict[str, Any] = {
        "schema": RUN_LIST_PAGE_SCHEMA,
        "revision": revision,
        "cursor": query.cursor,
        "items": [item(summary) for summary in shown],
    }
    if len(rows) > query.limit:
        last = shown[-1]
        page["nextCursor"] = f"{_CURSOR_PREFIX}{last.created_at}.{last.run_id}"
    return revision, page


def _decode_cursor(cursor: object) -> tuple[int, str]:
    bad = RunListQueryError("cursorInvalid", "the cursor is not one this server gave")
    if not isinstance(cursor, str) or not cursor.startswith(_CURSOR_PREFIX):
        raise bad
    created, _, run_id = cursor[len(_CURSOR_PREFIX) :].partition(".")
    if not created.isdigit() or not 1 <= len(run_id) <= _MAX_NAME_CHARS:
        raise bad
    created_at = int(created)
    if created_at > _MAX_TIME_MS:
        raise bad
    return created_at, run_id


def _statuses(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    values = [value] if isinstance(value, str) else value
    if (
        not isinstance(values, list)
        or not values
        or not all(isinstance(v, str) and v in DISPLAY_STATUSES for v in values)
    ):
        raise RunListQueryError(
            "payloadInvalid", f"status must be one or more of {', '.join(DISPLAY_STATUSES)}"
        )
    return tuple(dict.fromkeys(values))


def _text(payload: Mapping[str, Any], key: str, max_chars: int) -> str | None:
    value = payload.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= max_chars:
        raise RunListQueryError("payloadInvalid", f"{key} must be a string of 1 to {max_chars}")
    return value


def _time(payload: Mapping[str, Any], key: str) -> int | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_TIME_MS:
        raise RunListQueryError("payloadInvalid", f"{key} must be epoch milliseconds")
    return value
