"""`state.prune`: the manual form of state retention, run by the server on its database.

Implements client-protocol.md § Maintenance and workflow-server.md § State retention.
Payload `{"olderThanDays"?: int (default 30), "apply"?: bool, "backupPath"?: str}`:

- without `apply` (a dry run) the reader actor selects the expired root-run trees and
  the receipt lists what would go: tree and run counts, run IDs (the first
  `RUN_IDS_SHOWN`), how many expired trees are kept for protected state, and how many
  blobs no row names are past the grace period (`unnamedBlobs`);
- with `apply` and an absolute, new `backupPath`, the reader actor selects the trees
  and writes a backup of the same snapshot there, which is verified before anything is
  deleted; then the database actor deletes one tree per unit of work (each rechecked in
  its own transaction, so server work interleaves), and a last unit collects the blobs
  only those trees referenced and every older blob that no row names (whatever left
  it behind; younger ones may belong to an upload in flight), and stores the receipt
  under the request's idempotency key. A retry of the same key adopts the stored
  receipt, or joins the one in flight.

The units of work are here; the state-prune actor (`actors/_state_prune.py`) chains them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pi_workflows.domain._operations import (
    _command,
    prior_answer,
    rejected,
    response,
    stored_answer,
)
from pi_workflows.storage import (
    DAY_MS,
    BackupFailedError,
    Database,
    PruneTree,
    ReceiptOutcome,
    collect_unnamed_blobs,
    collect_unreferenced_blobs,
    delete_tree,
    lookup_receipt,
    prunable_trees,
    record_receipt,
    unnamed_blobs,
    write_backup,
)
from pi_workflows.wire.protocol import RequestMessage

__all__ = [
    "DEFAULT_OLDER_THAN_DAYS",
    "RUN_IDS_SHOWN",
    "PruneProgress",
    "PruneQuery",
    "PruneQueryError",
    "PruneSelection",
    "as_adopted",
    "delete_prune_tree",
    "parse_prune_query",
    "prune_dry_run",
    "record_prune",
    "select_and_back_up",
]

log = logging.getLogger(__name__)

DEFAULT_OLDER_THAN_DAYS: Final = 30
"""The retention period of workflow-server.md § State retention."""
MAX_OLDER_THAN_DAYS: Final = 36_500
RUN_IDS_SHOWN: Final = 1000
"""The most run IDs one receipt lists (`runCount` has them all)."""
_MAX_PATH_CHARS: Final = 4096


class PruneQueryError(ValueError):
    """A `state.prune` payload the server refuses: `code` is the safe error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class PruneQuery:
    older_than_days: int = DEFAULT_OLDER_THAN_DAYS
    apply: bool = False
    backup_path: Path | None = None


def parse_prune_query(payload: Mapping[str, Any]) -> PruneQuery:
    """Check a `state.prune` payload; raises `PruneQueryError` with a safe message."""
    unknown = sorted(set(payload) - {"olderThanDays", "apply", "backupPath"})
    if unknown:
        raise PruneQueryError("payloadInvalid", f"unknown state.prune field {unknown[0]}")
    days = payload.get("olderThanDays", DEFAULT_OLDER_THAN_DAYS)
    if isinstance(days, bool) or not isinstance(days, int):
        raise PruneQueryError("payloadInvalid", "olderThanDays must be a whole number of days")
    if not 0 <= days <= MAX_OLDER_THAN_DAYS:
        raise PruneQueryError("payloadInvalid", f"olderThanDays must be 0 to {MAX_OLDER_THAN_DAYS}")
    apply = payload.get("apply", False)
    if not isinstance(apply, bool):
        raise PruneQueryError("payloadInvalid", "apply must be true or false")
    raw = payload.get("backupPath")
    if not apply:
        if raw is not None:
            raise PruneQueryError("payloadInvalid", "backupPath is only for apply")
        return PruneQuery(days)
    if not isinstance(raw, str) or not 1 <= len(raw) <= _MAX_PATH_CHARS:
        raise PruneQueryError("backupRequired", "apply needs a backupPath for a new backup")
    path = Path(raw)
    if not path.is_absolute():
        raise PruneQueryError("backupPathInvalid", "the backup path must be absolute")
    return PruneQuery(days, True, path)


def as_adopted(answer: Mapping[str, Any]) -> Mapping[str, Any]:
    """The answer a retry of an applied prune in flight gets: the same, as `adopted`."""
    if answer.get("outcome") == "accepted":
        return {**answer, "outcome": "adopted"}
    return answer


def _summary(trees: list[PruneTree], kept: int, query: PruneQuery, cutoff: int) -> dict[str, Any]:
    run_ids = [run_id for tree in trees for run_id in tree.run_ids]
    return {
        "applied": query.apply,
        "olderThanDays": query.older_than_days,
        "cutoff": cutoff,
        "treeCount": len(trees),
        "runCount": len(run_ids),
        "runIds": run_ids[:RUN_IDS_SHOWN],
        "truncated": len(run_ids) > RUN_IDS_SHOWN,
        "keptProtected": kept,
    }


def _cutoff(db: Database, query: PruneQuery) -> int:
    """Runs finished before this epoch-millisecond time are old enough (the server's clock)."""
    return db.clock.now_ms() - query.older_than_days * DAY_MS


def prune_dry_run(
    db: Database, *, request: RequestMessage, query: PruneQuery, blob_grace_ms: int
) -> Any:
    """A read: what an applied prune of `query` would delete now (its receipt), and how
    many blobs no row names that it would collect besides (`unnamedBlobs`)."""
    cutoff = _cutoff(db, query)
    trees, kept = prunable_trees(db, cutoff)
    receipt = _summary(trees, kept, query, cutoff)
    receipt["unnamedBlobs"] = len(unnamed_blobs(db, db.clock.now_ms() - blob_grace_ms))
    return response(request, "accepted", receipt=receipt)


@dataclass(frozen=True, slots=True)
class PruneSelection:
    """What one applied prune selected, in one snapshot, and the size of its backup."""

    cutoff: int
    """Fixed by the selection; every tree is rechecked against it before deletion."""
    trees: list[PruneTree]
    kept: int
    backup_bytes: int


def select_and_back_up(
    db: Database, *, request: RequestMessage, query: PruneQuery
) -> PruneSelection | dict[str, Any]:
    """A read, in one snapshot: a stored answer, else the trees and a verified backup of
    the same snapshot (a refused backup is the answer)."""
    stored = prior_answer(db, request)
    if stored is not None:
        return stored
    cutoff = _cutoff(db, query)
    trees, kept = prunable_trees(db, cutoff)
    assert query.backup_path is not None
    try:
        size = write_backup(db, query.backup_path)
    except BackupFailedError as exc:
        return rejected(request, "rejected", exc.code, str(exc))
    return PruneSelection(cutoff, trees, kept, size)


def delete_prune_tree(
    db: Database, *, tree: PruneTree, cutoff: int
) -> tuple[list[str], set[str]] | None:
    """A write: delete one selected tree if it is still old enough, in its own
    transaction (so server work interleaves); None when it changed and is kept."""
    with db.write() as tx:
        return delete_tree(tx, tree.root_run_id, cutoff)


@dataclass(frozen=True, slots=True)
class PruneProgress:
    """What the deletions of one applied prune did, for its receipt."""

    selection: PruneSelection
    deleted: tuple[PruneTree, ...]
    skipped: int
    digests: frozenset[str]
    """The blobs the deleted trees referenced: collected if nothing else names them."""


def record_prune(
    db: Database,
    *,
    request: RequestMessage,
    query: PruneQuery,
    progress: PruneProgress,
    blob_grace_ms: int,
) -> Any:
    """A write: collect the blobs only the deleted trees named, and every other blob no
    row names that is older than `blob_grace_ms` (whatever left it behind), and store
    the receipt under the request's idempotency key (a receipt stored meanwhile is the
    answer)."""
    command = _command(request)
    selection = progress.selection
    with db.write() as tx:
        stored = stored_answer(request, lookup_receipt(tx, command))
        if stored is not None:
            return stored
        receipt = _summary(list(progress.deleted), selection.kept, query, selection.cutoff)
        receipt["skipped"] = progress.skipped
        receipt["backup"] = {"verified": True, "byteCount": selection.backup_bytes}
        freed = collect_unreferenced_blobs(tx, set(progress.digests))
        freed += collect_unnamed_blobs(tx, tx.now - blob_grace_ms)
        receipt["blobsDeleted"] = freed
        record_receipt(tx, command, outcome=ReceiptOutcome.ACCEPTED, receipt=receipt)
    log.info(
        "state pruned",
        extra={
            "action": "state.prune",
            "trees": len(progress.deleted),
            "skipped": progress.skipped,
        },
    )
    return response(request, "accepted", receipt=receipt)
