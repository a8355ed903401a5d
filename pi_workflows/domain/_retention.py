"""Automatic state retention: the units of one sweep, and the report `state status` shows.

Implements workflow-server.md § State retention (automatic cleanup). A sweep selects
with the selector of `state prune` (`prunable_tree_page`, `prunable_trees` a page at a
time), deletes one tree per transaction
with the same recheck (`delete_one_tree`), collects blobs the same way (`collect_blobs`)
and makes no backup; each deletion first checks that no runner work is pending and
yields to it. The retention actor (`actors/_retention.py`) chains the units.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from pi_workflows.domain._state_prune import DeletedTree, collect_blobs, delete_one_tree
from pi_workflows.storage import (
    DAY_MS,
    CompactOutcome,
    Database,
    PruneTree,
    compact_state,
    prunable_tree_page,
    runner_work_pending,
)
from pi_workflows.supervision import crash_point

__all__ = [
    "DEFAULT_RETENTION_DAYS",
    "RETENTION_DAYS_ENV",
    "YIELDED",
    "RetentionSelection",
    "collect_sweep_blobs",
    "compact_after_sweep",
    "retention_days_from_env",
    "select_expired",
    "sweep_tree",
]

RETENTION_DAYS_ENV: Final = "PI_WORKFLOWS_RETENTION_DAYS"
DEFAULT_RETENTION_DAYS: Final = 30
MAX_RETENTION_DAYS: Final = 36_500
YIELDED: Final = "yielded"
"""A sweep unit's answer when runner work is pending: the sweep stops and stays due."""


def retention_days_from_env(environ: Mapping[str, str] = os.environ) -> int:
    """`PI_WORKFLOWS_RETENTION_DAYS` (default 30; 0 turns automatic cleanup off).

    Raises:
        ValueError: not a whole number of days from 0 to 36,500 (safe message).
    """
    raw = environ.get(RETENTION_DAYS_ENV, "").strip()
    if not raw:
        return DEFAULT_RETENTION_DAYS
    try:
        days = int(raw)
    except ValueError:
        days = -1
    if not 0 <= days <= MAX_RETENTION_DAYS:
        raise ValueError(
            f"{RETENTION_DAYS_ENV} must be a whole number of days, 0 (off) to {MAX_RETENTION_DAYS}"
        )
    return days


SELECT_PAGE_TREES: Final = 20
"""Root-run trees a selection page reads (about 4 ms): the reader actor, which every
`run.start` asks for its receipt first, is never held longer by a sweep."""


@dataclass(frozen=True, slots=True)
class RetentionSelection:
    """One page of a sweep's selection: its trees, the cutoff every tree is rechecked
    against before deletion (fixed by the first page), the expired trees it kept for
    protected state, and the cursor of the next page (None: the last)."""

    cutoff: int
    trees: tuple[PruneTree, ...]
    kept: int
    next_after: str | None


def select_expired(
    db: Database, *, days: int, cutoff: int | None = None, after: str = ""
) -> RetentionSelection | Literal["yielded"]:
    """A read: the next page of the trees `state prune --older-than days` would list
    (`prunable_tree_page`, after root `after`; `cutoff` None: now minus `days`), or
    `YIELDED` when runner work is pending (the sweep waits for idle)."""
    if runner_work_pending(db, db.clock.now_ms()):
        return YIELDED
    if cutoff is None:
        cutoff = db.clock.now_ms() - days * DAY_MS
    page = prunable_tree_page(db, cutoff, after=after, limit=SELECT_PAGE_TREES)
    return RetentionSelection(cutoff, page.trees, page.kept, page.next_after)


def sweep_tree(
    db: Database, *, tree: PruneTree, cutoff: int
) -> DeletedTree | Literal["yielded"] | None:
    """A write: `YIELDED` if runner work is pending (nothing deleted); else delete the
    tree if the recheck keeps it expired (None when it changed and is kept)."""
    with db.write() as tx:
        if runner_work_pending(tx, tx.now):
            return YIELDED
        return delete_one_tree(tx, tree, cutoff)


def collect_sweep_blobs(db: Database, *, digests: frozenset[str], blob_grace_ms: int) -> int:
    """A write: the blob collection of `state prune`, after a sweep's deletions."""
    with db.write() as tx:
        crash_point("server.retention.before_blob_collection")
        return collect_blobs(tx, digests, blob_grace_ms)


def compact_after_sweep(
    db: Database, *, vacuum_min_bytes: int, vacuum_min_free_ratio: float
) -> CompactOutcome:
    """Truncate the WAL and maybe `VACUUM` (`compact_state`), only while idle."""
    return compact_state(
        db, vacuum_min_bytes=vacuum_min_bytes, vacuum_min_free_ratio=vacuum_min_free_ratio
    )


def checkpoint_sweep_wal(db: Database) -> bool:
    """Between two of a sweep's trees: copy the WAL the sweep wrote into the database
    (`Database.checkpoint_wal`), so no command's commit runs SQLite's own checkpoint of
    it. Best effort; True when the WAL was copied whole."""
    return db.checkpoint_wal()
