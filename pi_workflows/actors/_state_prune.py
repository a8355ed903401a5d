"""The state-prune actor: `state.prune` requests, chained through the reader and database.

Implements client-protocol.md § Maintenance and workflow-server.md § State retention
(the manual form). It owns every applied prune in flight, so a retry of the same key
joins the one under way; the units of work are in `domain/_state_prune.py`. The
retention actor of automatic retention grows from this one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Done, Reply, ServerActor
from pi_workflows.actors._database import Transact
from pi_workflows.actors._reader import Read
from pi_workflows.actors._retention import MaintenanceRunning
from pi_workflows.actors._state_backup import PROGRESS_KIND, BackupStepped
from pi_workflows.domain import (
    DeletedTree,
    DeletePruneTree,
    PruneDryRun,
    PruneProgress,
    PruneQuery,
    PruneQueryError,
    PruneSelection,
    RecordPrune,
    SelectAndBackUp,
    as_adopted,
    failure_response,
    parse_prune_query,
    rejected,
    remove_tree_files,
)
from pi_workflows.storage import PruneTree
from pi_workflows.wire.protocol import CLIENT_SCHEMA, RequestMessage

__all__ = ["Prune", "StatePruneActor"]

log = logging.getLogger(__name__)

_Key = tuple[str, str]


class Held(Protocol):
    """A request waiting for its answer (the router's `Pending`): answered exactly once."""

    @property
    def request(self) -> RequestMessage: ...

    def respond(self, answer: Mapping[str, Any]) -> None: ...

    def offer_event(self, event: dict[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class Prune:
    """A `state.prune` request from the router."""

    held: Held


@dataclass(frozen=True, slots=True)
class _DryRunRead:
    """Tag: a dry run's read (its answer is the response)."""

    held: Held


@dataclass(frozen=True, slots=True)
class _Selected:
    """Tag: an applied prune's selection and backup."""

    key: _Key


@dataclass(frozen=True, slots=True)
class _Deleted:
    """Tag: one tree's deletion."""

    key: _Key


@dataclass(frozen=True, slots=True)
class _Recorded:
    """Tag: the receipt, stored with the blob collection."""

    key: _Key


@dataclass
class _Job:
    """One applied prune under way."""

    request: RequestMessage
    query: PruneQuery
    waiters: list[tuple[Held, bool]]
    """Who waits for its answer, and whether as a retry (`adopted`)."""
    selection: PruneSelection | None = None
    pending: list[PruneTree] = field(default_factory=list)
    """Selected trees still to delete, the oldest last (popped from the end)."""
    deleted: list[PruneTree] = field(default_factory=list)
    skipped: int = 0
    digests: set[str] = field(default_factory=set)
    sent: int = 0
    """Progress events sent, the revision of the next one."""


class StatePruneActor(ServerActor):
    """Owns: every applied `state.prune` in flight, by (client ID, idempotency key).

    Receives: `Prune`, `BackupStepped` (its backup's steps), and `Done` (its units' answers).
    Sends: `Read` (`PruneDryRun`) to the reader, (`SelectAndBackUp`) to the state-backup
        actor; `Transact`
        (`DeletePruneTree` one tree a unit, then `RecordPrune`) to the database;
        `maintenanceProgress` events to the waiters that asked for them; responses.
    Invariants: one applied prune per key at a time (a retry joins it and is answered
        `adopted`); nothing is deleted before the backup of the selection's snapshot is
        verified; the receipt is stored in the transaction that collects the blobs.
    On failure: reported to the server, which stops; trees deleted so far stay deleted
        (each in its own transaction), and a retry of the key prunes what is left.
    """

    name = "state-prune"

    def __init__(
        self,
        on_actor_failure: ActorFailureHandler,
        *,
        database: pykka.ActorRef[Any],
        reader: pykka.ActorRef[Any],
        backups: pykka.ActorRef[Any] | None = None,
        blob_grace_ms: int = 24 * 60 * 60 * 1000,
        state_dir: Path | None = None,
        retention: pykka.ActorRef[Any] | None = None,
    ) -> None:
        super().__init__(on_actor_failure)
        self._database = database
        self._reader = reader
        self._backups = reader if backups is None else backups
        """Runs `SelectAndBackUp` (the state-backup actor: a copy never blocks reads)."""
        self._blob_grace_ms = blob_grace_ms
        """Unnamed blobs younger than this are kept (an upload in flight may name them)."""
        self._jobs: dict[_Key, _Job] = {}
        self._state_dir = state_dir
        """Where a deleted tree's files are (pi folders, logs); None: none to remove."""
        self._retention = retention
        """Told while an applied prune runs, so automatic cleanup does not start."""

    def on_receive(self, message: Any) -> Any:
        match message:
            case Prune(held=held):
                self._prune(held)
            case Done(tag=_DryRunRead(held=held), reply=reply):
                held.respond(_answer_of(held.request, reply))
            case BackupStepped(tag=_Selected(key=key), progress=step):
                self._progress(key, step.stage, step.done, step.total)
            case Done(tag=_Selected(key=key), reply=reply):
                self._on_selected(key, reply)
            case Done(tag=_Deleted(key=key), reply=reply):
                self._on_deleted(key, reply)
            case Done(tag=_Recorded(key=key), reply=reply):
                job = self._jobs.get(key)
                if job is not None:
                    self._finish(key, _answer_of(job.request, reply))
            case _:
                raise TypeError(f"state-prune actor got {type(message).__name__}")
        return None

    def on_stop(self) -> None:
        """The server stops: whoever waits is told; a retry prunes what is left."""
        for key in list(self._jobs):
            job = self._jobs[key]
            self._finish(key, _stopping(job.request))

    def _prune(self, held: Held) -> None:
        request = held.request
        try:
            query = parse_prune_query(request["payload"])
        except PruneQueryError as exc:
            held.respond(rejected(request, "rejected", exc.code, str(exc)))
            return
        if not query.apply:
            unit = PruneDryRun(request, query, self._blob_grace_ms)
            self._ask(self._reader, Read, unit, _DryRunRead(held))
            return
        key = (request["clientId"], request["idempotencyKey"])
        running = self._jobs.get(key)
        if running is not None:  # the same invocation retried: it gets the same answer
            running.waiters.append((held, True))
            return
        self._jobs[key] = _Job(request, query, [(held, False)])
        self._tell_retention()
        self._ask(self._backups, Read, SelectAndBackUp(request, query), _Selected(key))

    def _on_selected(self, key: _Key, reply: Reply) -> None:
        job = self._jobs.get(key)
        if job is None:
            return
        if reply.error is not None or not isinstance(reply.value, PruneSelection):
            self._finish(key, _answer_of(job.request, reply))  # a stored or refused answer
            return
        job.selection = reply.value
        job.pending = list(reversed(reply.value.trees))
        self._progress(key, "delete", 0, len(job.pending))
        self._next(key, job)

    def _on_deleted(self, key: _Key, reply: Reply) -> None:
        job = self._jobs.get(key)
        if job is None:
            return
        if reply.error is not None:
            self._finish(key, failure_response(job.request, reply.error))
            return
        tree = job.pending.pop()
        deleted = reply.value
        if not isinstance(deleted, DeletedTree):
            job.skipped += 1  # changed since the selection: kept
        else:
            job.deleted.append(PruneTree(tree.root_run_id, deleted.run_ids, tree.finished_at))
            job.digests |= deleted.digests
            if self._state_dir is not None:
                remove_tree_files(self._state_dir, deleted)
        done = len(job.deleted) + job.skipped
        self._progress(key, "delete", done, done + len(job.pending))
        self._next(key, job)

    def _next(self, key: _Key, job: _Job) -> None:
        assert job.selection is not None
        if job.pending:
            unit = DeletePruneTree(job.pending[-1], job.selection.cutoff)
            self._ask(self._database, Transact, unit, _Deleted(key))
            return
        self._progress(key, "collect", 0, 1)
        progress = PruneProgress(
            job.selection, tuple(job.deleted), job.skipped, frozenset(job.digests)
        )
        record = RecordPrune(job.request, job.query, progress, self._blob_grace_ms)
        self._ask(self._database, Transact, record, _Recorded(key))

    def _progress(self, key: _Key, stage: str, done: int, total: int) -> None:
        """Offer the waiters that asked for progress where the prune is: the backup's
        `copy` (pages) and `verify`, `delete` (trees done of how many), `collect`."""
        job = self._jobs.get(key)
        if job is None:
            return
        job.sent += 1
        for held, _ in job.waiters:
            if not held.request["payload"].get("progress"):
                continue
            held.offer_event(
                {
                    "schema": CLIENT_SCHEMA,
                    "type": "event",
                    "subscriptionId": held.request["requestId"],
                    "kind": PROGRESS_KIND,
                    "revision": job.sent,
                    "payload": {
                        "operation": "state.prune",
                        "stage": stage,
                        "done": done,
                        "total": total,
                    },
                }
            )

    def _finish(self, key: _Key, answer: Mapping[str, Any]) -> None:
        job = self._jobs.pop(key, None)
        for held, retried in job.waiters if job is not None else []:
            held.respond(as_adopted(answer) if retried else answer)
        self._tell_retention()

    def _tell_retention(self) -> None:
        if self._retention is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                self._retention.tell(MaintenanceRunning("state.prune", bool(self._jobs)))

    def _ask(
        self,
        actor: pykka.ActorRef[Any],
        kind: type[Read] | type[Transact],
        unit: object,
        tag: object,
    ) -> None:
        """Hand the next step on; a stopped actor (the server stops) is the step's error."""
        try:
            actor.tell(kind(unit, self.actor_ref, tag))
        except pykka.ActorDeadError as exc:
            self.actor_ref.tell(Done(tag, Reply(error=exc)))


def _answer_of(request: RequestMessage, reply: Reply) -> Mapping[str, Any]:
    if isinstance(reply.error, pykka.ActorDeadError):
        return _stopping(request)
    if reply.error is not None:
        return failure_response(request, reply.error)
    answer: Mapping[str, Any] = reply.value
    return answer


def _stopping(request: RequestMessage) -> dict[str, Any]:
    return rejected(request, "unavailable", "serverStopping", "the server is stopping")
