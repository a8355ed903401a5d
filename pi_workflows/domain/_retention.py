"""Automatic state retention: the units of one sweep, and the report `state status` shows.

Implements workflow-server.md § State retention (automatic cleanup). A sweep selects
with the selector of `state prune` (`prunable_trees`), deletes one tree per transaction
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
    prunable_trees,
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


@dataclass(frozen=True, slots=True)
class RetentionSelection:
    """One sweep's selection, in one snapshot: the trees, oldest first, and the cutoff
    every tree is rechecked against before deletion."""

    cutoff: int
    trees: tuple[PruneTree, ...]
    kept: int


def select_expired(db: Database, *, days: int) -> RetentionSelection | Literal["yielded"]:
    """A read: the trees `state prune --older-than days` would list now, or `YIELDED`
    when runner work is pending (the sweep waits for idle)."""
    if runner_work_pending(db):
        return YIELDED
    cutoff = db.clock.now_ms() - days * DAY_MS
    trees, kept = prunable_trees(db, cutoff)
    return RetentionSelection(cutoff, tuple(trees), kept)


def sweep_tree(
    db: Database, *, tree: PruneTree, cutoff: int
) -> DeletedTree | Literal["yielded"] | None:
    """A write: `YIELDED` if runner work is pending (nothing deleted); else delete the
    tree if the recheck keeps it expired (None when it changed and is kept)."""
    with db.write() as tx:
        if runner_work_pending(tx):
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
