"""Collecting the run list from `pi-workflows.run-list-page.v1` pages.

Implements client-protocol.md § Run and session views: a client collects every page
of one revision before it replaces the visible list. A page of another revision means
the list changed between pages: the partial list is discarded and collection starts
again from the first page, so a caller never sees two lists mixed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.wire.protocol import run_list_page_from_wire
from pi_workflows.wire.views import RunListItem  # re-exported: the typed item

__all__ = [
    "MAX_COLLECT_ATTEMPTS",
    "PAGE_ITEMS",
    "RunList",
    "RunListChangingError",
    "RunListItem",
    "collect_run_list",
]

PAGE_ITEMS: Final = 256
"""Items the client asks for per page (the protocol's bound)."""
MAX_COLLECT_ATTEMPTS: Final = 20
"""Collections started again after a revision change before the client gives up."""


class RunListChangingError(PiWorkflowsError):
    """The list changed between the pages of every attempt to collect it."""

    retryable = True


@dataclass(frozen=True, slots=True)
class RunList:
    """Every run the filter selected (up to the limit), all from one revision."""

    revision: int
    items: list[RunListItem]
    pages: int
    """Pages read for this revision."""
    restarts: int
    """Collections discarded because the revision changed between pages."""
    truncated: bool
    """The limit stopped the collection before the last page."""


class _Caller(Protocol):
    def call(
        self, operation: str, payload: Mapping[str, Any] | None = None, **options: Any
    ) -> Any: ...


def collect_run_list(
    client: _Caller,
    *,
    status: Sequence[str] | None = None,
    workflow: str | None = None,
    project: str | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
    limit: int | None = None,
    page_items: int = PAGE_ITEMS,
    on_page: Callable[[Mapping[str, Any]], None] | None = None,
) -> RunList:
    """Read pages of one revision until the last one (or `limit` items).

    `page_items` (1 to 256) is the size of each page; `on_page` sees each page as it
    arrives (a display can show progress).

    Raises:
        RunListChangingError: the revision changed during every attempt.
        RequestFailedError: the server refused the request (a bad filter, say).
    """
    query: dict[str, Any] = {}
    for key, value in (
        ("status", list(status) if status else None),
        ("workflow", workflow),
        ("project", project),
        ("since", since_ms),
        ("until", until_ms),
    ):
        if value is not None:
            query[key] = value
    for restart in range(MAX_COLLECT_ATTEMPTS):
        collected = _collect_once(client, query, limit, page_items, on_page)
        if collected is not None:
            revision, items, pages, truncated = collected
            return RunList(revision, items, pages, restart, truncated)
    raise RunListChangingError(
        f"the run list changed between pages {MAX_COLLECT_ATTEMPTS} times in a row; try again"
    )


def _collect_once(
    client: _Caller,
    query: dict[str, Any],
    limit: int | None,
    page_items: int,
    on_page: Callable[[Mapping[str, Any]], None] | None,
) -> tuple[int, list[RunListItem], int, bool] | None:
    """One pass over the pages; None when a page had another revision."""
    items: list[RunListItem] = []
    revision: int | None = None
    cursor: str | None = None
    pages = 0
    while True:
        want = page_items if limit is None else min(page_items, limit - len(items))
        payload = {**query, "limit": want}
        if cursor is not None:
            payload["cursor"] = cursor
        page = run_list_page_from_wire(client.call("run.list", payload)["receipt"])
        pages += 1
        if on_page is not None:
            on_page(page)
        if revision is None:
            revision = int(page["revision"])
        elif page["revision"] != revision or page.get("cursor") != cursor:
            return None  # the list changed: discard the partial list
        items.extend(page["items"])
        cursor = page.get("nextCursor")
        if cursor is None:
            return revision, items, pages, False
        if limit is not None and len(items) >= limit:
            return revision, items, pages, True
