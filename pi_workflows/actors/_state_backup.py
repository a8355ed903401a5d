"""The state-backup actor: every verified copy of the live database, `state.backup` and
the backup before `state.prune --apply`, on a read connection of its own.

Implements client-protocol.md § Maintenance for `state.backup`. Which connection copies:
SQLite's online backup API (`Connection.backup`) finishes its backup handle when the call
returns, so a copy cannot be spread over several message turns of an actor; whichever
actor copies is busy for the whole copy. Not the database actor (every write would wait)
and not the reader actor (`server.status` and every view would wait): this actor owns a
third connection, read-only, opened by the server like the reader's, and copies in one
read transaction, in steps of `BACKUP_STEP_PAGES` pages. The writer commits between
steps (WAL), and the copy never restarts, because its source connection keeps seeing
its own snapshot; the WAL only grows by what is written during the copy, until a later
checkpoint. The driver releases the GIL inside each step.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pykka

from pi_workflows.actors._base import (
    ActorFailureHandler,
    Address,
    Done,
    Reply,
    ServerActor,
    answer,
)
from pi_workflows.actors._database import Transact
from pi_workflows.actors._reader import Read
from pi_workflows.actors._retention import MaintenanceRunning
from pi_workflows.domain import (
    BackupOutcome,
    BackupQueryError,
    Perform,
    RecordBackup,
    SelectAndBackUp,
    as_adopted,
    back_up,
    failure_response,
    parse_backup_query,
    perform,
    rejected,
    select_and_back_up,
    unit_label,
)
from pi_workflows.storage import BackupProgress, Clock, open_live_reader
from pi_workflows.wire.protocol import CLIENT_SCHEMA, RequestMessage

__all__ = ["Backup", "BackupStepped", "BackupsSettled", "StateBackupActor"]

log = logging.getLogger(__name__)

_Key = tuple[str, str]
PROGRESS_KIND = "maintenanceProgress"


class Held(Protocol):
    """A request waiting for its answer (the router's `Pending`): answered exactly once."""

    @property
    def request(self) -> RequestMessage: ...

    def respond(self, answer: Mapping[str, Any]) -> None: ...

    def offer_event(self, event: dict[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class Backup:
    """A `state.backup` request from the router."""

    held: Held


@dataclass(frozen=True, slots=True)
class BackupsSettled:
    """The server stops: answer `Done(None)` to `reply_to` once no backup is in flight
    (each one's receipt stored and its waiters answered)."""

    reply_to: Address


@dataclass(frozen=True, slots=True)
class BackupStepped:
    """Told to the asker of a `Read(SelectAndBackUp)` that wants progress: one step of
    its backup (the prune's `copy` and `verify` stages), before its `Done`."""

    tag: object
    progress: BackupProgress


@dataclass(frozen=True, slots=True)
class _Recorded:
    """Tag: the receipt of the backup of this key is stored."""

    key: _Key


@dataclass
class _Job:
    """One backup under way, and who waits for it (and whether as a retry)."""

    request: RequestMessage
    waiters: list[tuple[Held, bool]] = field(default_factory=list)
    sent: int = 0
    """Progress events sent, the revision of the next one."""


class StateBackupActor(ServerActor):
    """Owns: a read-only connection for copies, and every `state.backup` in flight by
    (client ID, idempotency key).

    Receives: `Backup`, `Read` (the prune's `SelectAndBackUp`: one unit in one read
        transaction, like the reader actor), and `Done` (a stored receipt).
    Sends: `Transact(RecordBackup)` to the database; progress events to the waiters
        that asked for them; responses.
    Invariants: one backup per key at a time (a retry joins it and is answered
        `adopted`); nobody is answered before the receipt (accepted or rejected) is
        stored; a client that went away does not stop the copy.
    On failure: an error of one backup is its answer; the actor carries on.
    """

    name = "state-backup"

    def __init__(
        self,
        path: Path,
        clock: Clock,
        on_actor_failure: ActorFailureHandler,
        *,
        database: pykka.ActorRef[Any],
        units: Perform = perform,
        retention: pykka.ActorRef[Any] | None = None,
    ) -> None:
        super().__init__(on_actor_failure)
        self._db = open_live_reader(path, clock=clock)
        self._database = database
        self._retention = retention
        """Told while a backup is in flight, so automatic cleanup does not start."""
        self._perform = units
        self._jobs: dict[_Key, _Job] = {}
        self._settled: list[Address] = []
        """Who waits for no backup to be in flight (the server's stop)."""

    def on_receive(self, message: Any) -> Any:
        match message:
            case Backup(held=held):
                self._backup(held)
            case BackupsSettled(reply_to=reply_to):
                self._settled.append(reply_to)
                self._tell_settled()
            case Read(unit=SelectAndBackUp() as unit, reply_to=reply_to, tag=tag) if (
                unit.query.progress and reply_to is not None
            ):
                answer(reply_to, tag, self._select(unit, reply_to, tag))
            case Read(unit=unit, reply_to=reply_to, tag=tag):
                answer(reply_to, tag, self._read(unit))
            case Done(tag=_Recorded(key=key), reply=reply):
                job = self._jobs.get(key)
                if job is not None:
                    self._finish(key, _answer_of(job.request, reply))
            case _:
                raise TypeError(f"state-backup actor got {type(message).__name__}")
        return None

    def on_stop(self) -> None:
        """The server stops (after in-flight requests were waited for): whoever still
        waits is told; a retry finds the stored receipt or backs up again."""
        for key in list(self._jobs):
            self._finish(key, _stopping(self._jobs[key].request))
        self._db.close()

    def _read(self, unit: object) -> Reply:
        try:
            with self._db.read():
                return Reply(value=self._perform(self._db, unit))
        except Exception as exc:  # noqa: BLE001 - the error belongs to the caller
            label = unit_label(unit)
            log.debug("read failed", extra={"action": "db.read_error", "label": label})
            return Reply(error=exc)

    def _select(self, unit: SelectAndBackUp, reply_to: Address, tag: object) -> Reply:
        """The prune's selection and backup, telling the asker each step of the copy."""

        def stepped(progress: BackupProgress) -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                reply_to.tell(BackupStepped(tag, progress))

        try:
            with self._db.read():
                value = select_and_back_up(
                    self._db, request=unit.request, query=unit.query, on_progress=stepped
                )
            return Reply(value=value)
        except Exception as exc:  # noqa: BLE001 - the error belongs to the caller
            log.debug("read failed", extra={"action": "db.read_error", "label": unit_label(unit)})
            return Reply(error=exc)

    def _backup(self, held: Held) -> None:
        request = held.request
        try:
            query = parse_backup_query(request["payload"])
        except BackupQueryError as exc:
            held.respond(rejected(request, "rejected", exc.code, str(exc)))
            return
        key = (request["clientId"], request["idempotencyKey"])
        running = self._jobs.get(key)
        if running is not None and running.request["payload"] != request["payload"]:
            held.respond(_conflict(request))  # as a stored receipt of the key would answer
            return
        if running is not None:  # the same invocation retried: it gets the same answer
            running.waiters.append((held, True))
            return
        job = _Job(request, [(held, False)])
        self._jobs[key] = job
        self._tell_retention()
        # The copy blocks this actor (see the module docstring); a retry that arrives
        # meanwhile waits in the mailbox and joins the job while its receipt is stored.
        try:
            with self._db.read():
                outcome = back_up(
                    self._db,
                    request=request,
                    query=query,
                    on_progress=lambda progress: self._progress(job, progress),
                )
        except Exception as exc:  # noqa: BLE001 - one backup's failure is its answer
            self._finish(key, failure_response(request, exc))
            return
        if not isinstance(outcome, BackupOutcome):  # this key's stored answer
            self._finish(key, outcome)
            return
        try:
            self._database.tell(
                Transact(RecordBackup(request, outcome), self.actor_ref, _Recorded(key))
            )
        except pykka.ActorDeadError:
            self._finish(key, _stopping(request))

    def _progress(self, job: _Job, progress: BackupProgress) -> None:
        """Offer the waiters that asked for progress the newest step (coalesced)."""
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
                        "operation": "state.backup",
                        "stage": progress.stage,
                        "done": progress.done,
                        "total": progress.total,
                    },
                }
            )

    def _finish(self, key: _Key, response: Mapping[str, Any]) -> None:
        job = self._jobs.pop(key, None)
        for held, retried in job.waiters if job is not None else []:
            held.respond(as_adopted(response) if retried else response)
        self._tell_settled()

    def _tell_retention(self) -> None:
        if self._retention is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                self._retention.tell(MaintenanceRunning("state.backup", bool(self._jobs)))

    def _tell_settled(self) -> None:
        if self._jobs:
            return
        self._tell_retention()
        waiting, self._settled = self._settled, []
        for reply_to in waiting:
            answer(reply_to, None, Reply(value=None))


def _answer_of(request: RequestMessage, reply: Reply) -> Mapping[str, Any]:
    if isinstance(reply.error, pykka.ActorDeadError):
        return _stopping(request)
    if reply.error is not None:
        return failure_response(request, reply.error)
    response: Mapping[str, Any] = reply.value
    return response


def _conflict(request: RequestMessage) -> dict[str, Any]:
    return rejected(
        request,
        "conflict",
        "idempotencyConflict",
        "this request ID or idempotency key was already used with another payload",
    )


def _stopping(request: RequestMessage) -> dict[str, Any]:
    return rejected(request, "unavailable", "serverStopping", "the server is stopping")
