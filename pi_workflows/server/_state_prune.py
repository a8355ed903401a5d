"""`state.prune`: the manual form of state retention, run by the server on its database.

Implements client-protocol.md § Maintenance and workflow-server.md § State retention.
Payload `{"olderThanDays"?: int (default 30), "apply"?: bool, "backupPath"?: str}`:

- without `apply` (a dry run) the reader actor selects the expired root-run trees and
  the receipt lists what would go: tree and run counts, run IDs (the first
  `RUN_IDS_SHOWN`), and how many expired trees are kept for protected state;
- with `apply` and an absolute, new `backupPath`, the reader actor selects the trees
  and writes a backup of the same snapshot there, which is verified before anything is
  deleted; then the database actor deletes one tree per unit of work (each rechecked in
  its own transaction, so server work interleaves), and a last unit collects the blobs
  only those trees referenced and stores the receipt under the request's idempotency
  key. A retry of the same key adopts the stored receipt, or joins the one in flight.

Every step runs on an actor; this module only chains them (callbacks must not block).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pykka

from pi_workflows.actors._base import Reply
from pi_workflows.actors._database import Transact
from pi_workflows.actors._reader import Read
from pi_workflows.server._operations import (
    _command,
    failure_response,
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
    collect_unreferenced_blobs,
    delete_tree,
    lookup_receipt,
    prunable_trees,
    record_receipt,
    write_backup,
)
from pi_workflows.wire.protocol import RequestMessage

__all__ = ["DEFAULT_OLDER_THAN_DAYS", "RUN_IDS_SHOWN", "PruneQuery", "start_state_prune"]

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


@dataclass
class _InFlight:
    """One applied prune under way; retries of its key wait for its answer."""

    waiters: list[Callable[[Mapping[str, Any], bool], None]] = field(default_factory=list)


_in_flight: dict[tuple[str, str], _InFlight] = {}
_in_flight_lock = threading.Lock()


def start_state_prune(
    request: RequestMessage,
    respond: Callable[[Mapping[str, Any]], None],
    database: pykka.ActorRef[Any],
    reader: pykka.ActorRef[Any],
) -> None:
    """Answer one `state.prune` request through the reader and database actors."""
    try:
        query = parse_prune_query(request["payload"])
    except PruneQueryError as exc:
        respond(rejected(request, "rejected", exc.code, str(exc)))
        return
    if not query.apply:
        try:
            reader.tell(Read(lambda db: _dry_run(db, request, query), _replier(request, respond)))
        except pykka.ActorDeadError:
            respond(rejected(request, "unavailable", "serverStopping", "the server is stopping"))
        return
    key = (request["clientId"], request["idempotencyKey"])
    with _in_flight_lock:
        running = _in_flight.get(key)
        if running is not None:  # the same invocation retried: it gets the same answer
            running.waiters.append(lambda answer, _first: respond(_as_adopted(answer)))
            return
        flight = _InFlight([lambda answer, _first: respond(answer)])
        _in_flight[key] = flight
    _Apply(request, query, key, database, reader).begin()


def _replier(
    request: RequestMessage, respond: Callable[[Mapping[str, Any]], None]
) -> Callable[[Reply], None]:
    def reply(result: Reply) -> None:
        if result.error is not None:
            respond(failure_response(request, result.error))
        else:
            respond(result.value)

    return reply


def _as_adopted(answer: Mapping[str, Any]) -> Mapping[str, Any]:
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


def _dry_run(db: Database, request: RequestMessage, query: PruneQuery) -> Any:
    cutoff = _cutoff(db, query)
    trees, kept = prunable_trees(db, cutoff)
    return response(request, "accepted", receipt=_summary(trees, kept, query, cutoff))


@dataclass
class _Apply:
    """The steps of one applied prune, chained by actor replies."""

    request: RequestMessage
    query: PruneQuery
    key: tuple[str, str]
    database: pykka.ActorRef[Any]
    reader: pykka.ActorRef[Any]
    cutoff: int = 0
    """Fixed by the selection; every tree is rechecked against it before deletion."""
    pending: list[PruneTree] = field(default_factory=list)
    deleted: list[PruneTree] = field(default_factory=list)
    skipped: int = 0
    kept: int = 0
    backup_bytes: int = 0
    digests: set[str] = field(default_factory=set)

    def begin(self) -> None:
        self._tell(self.reader, Read(self._select_and_back_up, self._backed_up, "state.prune"))

    def _tell(self, actor: pykka.ActorRef[Any], message: Any) -> None:
        """Hand the next step on; a stopping server answers instead (no actor is left)."""
        try:
            actor.tell(message)
        except pykka.ActorDeadError:
            self._finish(
                rejected(self.request, "unavailable", "serverStopping", "the server is stopping")
            )

    def _select_and_back_up(self, db: Database) -> Any:
        """On the reader, in one snapshot: a stored answer, else the trees and a backup."""
        stored = prior_answer(db, self.request)
        if stored is not None:
            return stored
        self.cutoff = _cutoff(db, self.query)
        trees, kept = prunable_trees(db, self.cutoff)
        assert self.query.backup_path is not None
        try:
            size = write_backup(db, self.query.backup_path)
        except BackupFailedError as exc:
            return rejected(self.request, "rejected", exc.code, str(exc))
        return trees, kept, size

    def _backed_up(self, result: Reply) -> None:
        if result.error is not None:
            self._finish(failure_response(self.request, result.error))
            return
        if isinstance(result.value, dict):  # a stored answer or a refused backup
            self._finish(result.value)
            return
        self.pending, self.kept, self.backup_bytes = result.value
        self.pending.reverse()  # popped from the end: oldest first
        self._next()

    def _next(self) -> None:
        if self.pending:
            tree = self.pending[-1]
            work = Transact(lambda db: self._delete(db, tree), self._deleted, "state.prune")
        else:
            work = Transact(self._collect_and_record, self._recorded, "state.prune")
        self._tell(self.database, work)

    def _delete(self, db: Database, tree: PruneTree) -> Any:
        with db.write() as tx:
            return delete_tree(tx, tree.root_run_id, self.cutoff)

    def _deleted(self, result: Reply) -> None:
        if result.error is not None:
            self._finish(failure_response(self.request, result.error))
            return
        tree = self.pending.pop()
        if result.value is None:
            self.skipped += 1  # changed since the selection: kept
        else:
            run_ids, digests = result.value
            self.deleted.append(PruneTree(tree.root_run_id, tuple(run_ids), tree.finished_at))
            self.digests |= digests
        self._next()

    def _collect_and_record(self, db: Database) -> Any:
        command = _command(self.request)
        with db.write() as tx:
            stored = stored_answer(self.request, lookup_receipt(tx, command))
            if stored is not None:
                return stored
            receipt = _summary(self.deleted, self.kept, self.query, self.cutoff)
            receipt["skipped"] = self.skipped
            receipt["backup"] = {"verified": True, "byteCount": self.backup_bytes}
            receipt["blobsDeleted"] = collect_unreferenced_blobs(tx, self.digests)
            record_receipt(tx, command, outcome=ReceiptOutcome.ACCEPTED, receipt=receipt)
        log.info(
            "state pruned",
            extra={"action": "state.prune", "trees": len(self.deleted), "skipped": self.skipped},
        )
        return response(self.request, "accepted", receipt=receipt)

    def _recorded(self, result: Reply) -> None:
        if result.error is not None:
            self._finish(failure_response(self.request, result.error))
        else:
            self._finish(result.value)

    def _finish(self, answer: Mapping[str, Any]) -> None:
        with _in_flight_lock:
            flight = _in_flight.pop(self.key, None)
        for waiter in flight.waiters if flight is not None else []:
            waiter(answer, True)
