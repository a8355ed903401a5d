"""Run views built once per revision: the reader actor's cache (issue 30 item 4).

A run view (`build_run_view`) is a function of committed rows only, and the run's view
revision (`run_view_revision`: its event revision plus `view_changes`, which triggers
raise for every row the view shows) moves whenever one of them changes; the
subscriptions already rely on it to skip unchanged runs. So the view built at revision
R is the view of every snapshot whose revision is still R.

`RunViewCache.view` looks the revision up first (one primary-key read, in the caller's
read transaction) and serves the view built at exactly that revision; anything else is
built again in the same transaction and replaces the run's entry. It never answers from
a revision that is not the current one, so a stale view cannot be served; it lives in
memory only, so a restarted server starts empty. One thread uses it (the reader
actor's): it takes no lock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from pi_workflows.domain._run_view import build_run_view
from pi_workflows.storage import Database, run_view_revision
from pi_workflows.wire.canonical import CanonicalJSONError, dumps

__all__ = ["DEFAULT_BYTES", "DEFAULT_VIEWS", "CacheCounts", "RunViewCache"]

DEFAULT_VIEWS: Final = 256
"""Run views kept (least recently served dropped first)."""
DEFAULT_BYTES: Final = 8 * 1024 * 1024
"""Canonical JSON bytes of the views kept, together; one larger view is not kept."""


@dataclass(slots=True)
class CacheCounts:
    """What the cache did so far (benchmarks and tests read it)."""

    hits: int = 0
    builds: int = 0
    """Views built: misses, and revisions that moved on since the kept one."""
    evictions: int = 0


@dataclass(frozen=True, slots=True)
class _Entry:
    revision: int
    view: dict[str, Any]
    size: int


class RunViewCache:
    """Built `pi-workflows.run-view.v1` documents by run ID and revision, bounded LRU.

    A run has at most one entry, its newest built revision: an older one can never be
    served again (revisions only grow). Served views are shared, never copied: callers
    encode them and must not change them.
    """

    def __init__(self, max_views: int = DEFAULT_VIEWS, max_bytes: int = DEFAULT_BYTES) -> None:
        self.max_views = max_views
        self.max_bytes = max_bytes
        self.counts = CacheCounts()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        """Canonical JSON bytes of the views kept."""
        return self._bytes

    def view(self, db: Database, run_id: str) -> dict[str, Any] | None:
        """The run's view at its current revision, or None when there is no such run.

        Built at most once per revision while it stays in the cache; the revision check
        and any build share one read transaction (the caller's, if one is open).
        """
        with db.read():
            revision = run_view_revision(db, run_id)
            if revision is None:
                self._drop(run_id)  # pruned: its view is gone with it
                return None
            return self.at(db, run_id, revision)

    def at(self, db: Database, run_id: str, revision: int) -> dict[str, Any] | None:
        """The view at `revision`, which the caller read in its open read transaction
        as the run's current one (so a kept view of it is current)."""
        entry = self._entries.get(run_id)
        if entry is not None and entry.revision == revision:
            self._entries.move_to_end(run_id)
            self.counts.hits += 1
            return entry.view
        view = build_run_view(db, run_id)
        self.counts.builds += 1
        if view is None:
            self._drop(run_id)
            return None
        self._keep(run_id, view)
        return view

    def _keep(self, run_id: str, view: dict[str, Any]) -> None:
        self._drop(run_id)
        try:
            size = len(dumps(view))
        except CanonicalJSONError:  # not sendable either; nothing to keep
            return
        if size > self.max_bytes or self.max_views <= 0:
            return
        self._entries[run_id] = _Entry(int(view["revision"]), view, size)
        self._bytes += size
        while len(self._entries) > self.max_views or self._bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.size
            self.counts.evictions += 1

    def _drop(self, run_id: str) -> None:
        entry = self._entries.pop(run_id, None)
        if entry is not None:
            self._bytes -= entry.size
