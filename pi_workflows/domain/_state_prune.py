"""`state.prune`: the manual form of state retention, run by the server on its database.

Implements client-protocol.md § Maintenance and workflow-server.md § State retention.
Payload `{"olderThanDays"?: int (default 30), "apply"?: bool, "backupPath"?: str,
"progress"?: bool}` (with `progress`, an applied prune's asker gets `maintenanceProgress`
events: the backup's `copy` and `verify`, then `delete` trees done of how many, then
`collect`):

- without `apply` (a dry run) the reader actor selects the expired root-run trees and
  the receipt lists what would go: tree and run counts, run IDs (the first
  `RUN_IDS_SHOWN`), how many expired trees are kept for protected state, and how many
  blobs no row names are past the grace period (`unnamedBlobs`);
- with `apply` and an absolute, new `backupPath`, the state-backup actor selects the
  trees and writes a backup of the same snapshot there (on its own read connection, the
  code of `state.backup`), which is verified before anything is
  deleted; then the database actor deletes one tree per unit of work (each rechecked in
  its own transaction, so server work interleaves), and a last unit collects the blobs
  only those trees referenced and every older blob that no row names (whatever left
  it behind; younger ones may belong to an upload in flight), and stores the receipt
  under the request's idempotency key. A retry of the same key adopts the stored
  receipt, or joins the one in flight.

The units of work are here; the state-prune actor (`actors/_state_prune.py`) chains them.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
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
    BackupProgress,
    Database,
    PruneTree,
    ReceiptOutcome,
    Tx,
    collect_unnamed_blobs,
    collect_unreferenced_blobs,
    delete_tree,
    known_resource_uids,
    known_run_ids,
    known_runner_epochs,
    lookup_receipt,
    prunable_trees,
    record_receipt,
    tree_runner_epochs,
    unnamed_blobs,
    write_backup,
)
from pi_workflows.wire.protocol import RequestMessage

__all__ = [
    "DEFAULT_OLDER_THAN_DAYS",
    "RUN_IDS_SHOWN",
    "DeletedTree",
    "PruneProgress",
    "PruneQuery",
    "PruneQueryError",
    "PruneSelection",
    "TreeFiles",
    "as_adopted",
    "collect_blobs",
    "delete_one_tree",
    "delete_prune_tree",
    "list_tree_files",
    "orphan_files",
    "parse_prune_query",
    "prune_dry_run",
    "record_prune",
    "remove_orphan_files",
    "remove_resource_log",
    "remove_tree_files",
    "resource_log_path",
    "select_and_back_up",
]

log = logging.getLogger(__name__)
_SAFE_LOG_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""A resource UID that can name its log file as it is (a UID is generated, never a path)."""

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
    progress: bool = False
    """The asker wants `maintenanceProgress` events (an applied prune sends them)."""


def parse_prune_query(payload: Mapping[str, Any]) -> PruneQuery:
    """Check a `state.prune` payload; raises `PruneQueryError` with a safe message."""
    unknown = sorted(set(payload) - {"olderThanDays", "apply", "backupPath", "progress"})
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
    progress = payload.get("progress", False)
    if not isinstance(progress, bool):
        raise PruneQueryError("payloadInvalid", "progress must be true or false")
    raw = payload.get("backupPath")
    if not apply:
        if raw is not None:
            raise PruneQueryError("payloadInvalid", "backupPath is only for apply")
        return PruneQuery(days, progress=progress)
    if not isinstance(raw, str) or not 1 <= len(raw) <= _MAX_PATH_CHARS:
        raise PruneQueryError("backupRequired", "apply needs a backupPath for a new backup")
    path = Path(raw)
    if not path.is_absolute():
        raise PruneQueryError("backupPathInvalid", "the backup path must be absolute")
    return PruneQuery(days, True, path, progress)


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
    db: Database,
    *,
    request: RequestMessage,
    query: PruneQuery,
    on_progress: Callable[[BackupProgress], None] | None = None,
) -> PruneSelection | dict[str, Any]:
    """A read, in one snapshot: a stored answer, else the trees and a verified backup of
    the same snapshot (a refused backup is the answer). `on_progress` is told each step
    of the backup (the state-backup actor's own function, never a message's content)."""
    stored = prior_answer(db, request)
    if stored is not None:
        return stored
    cutoff = _cutoff(db, query)
    trees, kept = prunable_trees(db, cutoff)
    assert query.backup_path is not None
    try:
        copy = write_backup(db, query.backup_path, on_progress=on_progress)
    except BackupFailedError as exc:
        return rejected(request, "rejected", exc.code, f"{exc}; nothing was deleted")
    return PruneSelection(cutoff, trees, kept, copy.byte_count)


@dataclass(frozen=True, slots=True)
class DeletedTree:
    """One tree deleted in its own transaction: its runs, the digests its rows named
    (collected if nothing else names them) and its runner epochs (whose logs go)."""

    tree: PruneTree
    run_ids: tuple[str, ...]
    digests: frozenset[str]
    runner_epochs: tuple[str, ...]


def delete_one_tree(tx: Tx, tree: PruneTree, cutoff: int) -> DeletedTree | None:
    """Delete `tree` in `tx` if the recheck still finds it expired and unprotected
    (`delete_tree`); None when it changed and is kept. Shared by `state prune` and
    automatic retention."""
    epochs = tree_runner_epochs(tx, tree.root_run_id)
    deleted = delete_tree(tx, tree.root_run_id, cutoff)
    if deleted is None:
        return None
    run_ids, digests = deleted
    return DeletedTree(tree, tuple(run_ids), frozenset(digests), tuple(epochs))


def delete_prune_tree(db: Database, *, tree: PruneTree, cutoff: int) -> DeletedTree | None:
    """A write: delete one selected tree if it is still old enough, in its own
    transaction (so server work interleaves); None when it changed and is kept."""
    with db.write() as tx:
        return delete_one_tree(tx, tree, cutoff)


def collect_blobs(tx: Tx, digests: Iterable[str], blob_grace_ms: int) -> int:
    """Collect the blobs only deleted trees named, and every blob no row names that is
    older than `blob_grace_ms` (whatever left it behind); return how many. Shared by
    `state prune` and automatic retention."""
    freed = collect_unreferenced_blobs(tx, set(digests))
    return freed + collect_unnamed_blobs(tx, tx.now - blob_grace_ms)


@dataclass(frozen=True, slots=True)
class TreeFiles:
    """Run folders (pi folders, validator logs), runner logs and resource-runner logs on
    disk, by name."""

    run_ids: frozenset[str]
    runner_epochs: frozenset[str]
    resource_uids: frozenset[str] = frozenset()


def list_tree_files(state_dir: Path) -> TreeFiles:
    """What runs left on disk: the run IDs that name a pi or validator-log folder, and
    the runner epochs that name a runner log. List it *before* reading which exist: a
    run's or runner epoch's row commits before its files appear."""
    runs: set[str] = set()
    for folder in (state_dir / "pi", state_dir / "logs" / "validators"):
        with contextlib.suppress(OSError):
            runs.update(entry.name for entry in folder.iterdir() if entry.is_dir())
    epochs: set[str] = set()
    with contextlib.suppress(OSError):
        logs = (state_dir / "logs" / "runners").iterdir()
        epochs.update(entry.stem for entry in logs if entry.suffix == ".log")
    uids: set[str] = set()
    with contextlib.suppress(OSError):
        logs = (state_dir / "logs" / "resource-runners").iterdir()
        uids.update(entry.stem for entry in logs if entry.suffix == ".log")
    return TreeFiles(frozenset(runs), frozenset(epochs), frozenset(uids))


def orphan_files(db: Database, *, files: TreeFiles) -> TreeFiles:
    """A read: the files of `files` whose run, runner epoch or resource no longer exists
    (a tree deleted by a server that died before it removed them, a deleted resource)."""
    return TreeFiles(
        files.run_ids - known_run_ids(db, files.run_ids),
        files.runner_epochs - known_runner_epochs(db, files.runner_epochs),
        files.resource_uids - known_resource_uids(db, files.resource_uids),
    )


def remove_orphan_files(state_dir: Path, orphans: TreeFiles) -> None:
    """Remove the files of runs, runner epochs and resources that no longer exist."""
    runs = tuple(sorted(orphans.run_ids))
    epochs = tuple(sorted(orphans.runner_epochs))
    tree = PruneTree("", runs, 0)
    remove_tree_files(state_dir, DeletedTree(tree, runs, frozenset(), epochs))
    for uid in sorted(orphans.resource_uids):
        remove_resource_log(state_dir, uid)


def resource_log_path(state_dir: Path, uid: str) -> Path:
    """The one log file of a resource's passes (each pass truncates it)."""
    name = uid if _SAFE_LOG_NAME.fullmatch(uid) else "resource"
    return state_dir / "logs" / "resource-runners" / f"{name}.log"


def remove_resource_log(state_dir: Path, uid: str) -> None:
    """Remove a removed resource's pass log; best effort (it names no live row)."""
    if _SAFE_LOG_NAME.fullmatch(uid):
        with contextlib.suppress(OSError):
            resource_log_path(state_dir, uid).unlink()


def remove_tree_files(state_dir: Path, deleted: DeletedTree) -> None:
    """Remove what a deleted tree left on disk, after its deletion committed: each run's
    pi folders (`pi/<run>/`), validator logs (`logs/validators/<run>/`) and its runner
    epochs' logs. Best effort: a file that cannot go stays (it names no live row)."""
    for run_id in deleted.run_ids:
        shutil.rmtree(state_dir / "pi" / run_id, ignore_errors=True)
        shutil.rmtree(state_dir / "logs" / "validators" / run_id, ignore_errors=True)
    for epoch in deleted.runner_epochs:
        with contextlib.suppress(OSError):
            (state_dir / "logs" / "runners" / f"{epoch}.log").unlink()


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
        receipt["blobsDeleted"] = collect_blobs(tx, progress.digests, blob_grace_ms)
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
