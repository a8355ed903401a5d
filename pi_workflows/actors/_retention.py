"""The retention actor: automatic state retention, one root-run tree per transaction.

Implements workflow-server.md § State retention (automatic cleanup) and § Recovery
step 12. It selects and deletes with the units of `state prune` (domain/_retention.py),
makes no backup, yields to runner work between trees and stays due, and keeps its
timers on the server's clock (a manual clock in tests).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Done, Reply, ServerActor
from pi_workflows.actors._database import Transact
from pi_workflows.actors._reader import Read
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import (
    YIELDED,
    CheckpointSweepWal,
    CollectSweepBlobs,
    CompactAfterSweep,
    DeletedTree,
    FindOrphanFiles,
    RetentionReport,
    RetentionSelection,
    SelectExpired,
    SweepTree,
    TreeFiles,
    list_tree_files,
    remove_orphan_files,
    remove_tree_files,
)
from pi_workflows.storage import DAY_MS, Clock, CompactOutcome, PruneTree

__all__ = [
    "VACUUM_MIN_BYTES",
    "MaintenanceRunning",
    "RequestSweep",
    "RetentionActor",
    "RetentionConfig",
    "StopSweeps",
]

log = logging.getLogger(__name__)

RETRY_AFTER_MS: Final = 5 * 60 * 1000
"""A failed or yielded sweep is tried again after this (never a tight loop)."""
SWEEP_EVERY_MS: Final = DAY_MS
"""At most one completed sweep per server process in this long; the daily check."""
CHECKPOINT_EVERY_TREES: Final = 10
"""The sweep copies the WAL into the database after this many trees (a unit of its own on
the writer): about 250 pages, a few ms, well under the 1,000 at which SQLite checkpoints
by itself inside the commit of whatever came next (a `run.start` then waited 10-200 ms
at 10,000 trees, against 2 ms for a tree)."""
VACUUM_MIN_BYTES: Final = 64 * 1024 * 1024
VACUUM_MIN_FREE_RATIO: Final = 0.20


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    days: int
    """Keep terminal trees this many days after `finished_at`; 0: no automatic cleanup."""
    state_dir: Path
    clock: Clock
    blob_grace_ms: int
    vacuum_min_bytes: int = VACUUM_MIN_BYTES
    vacuum_min_free_ratio: float = VACUUM_MIN_FREE_RATIO


@dataclass(frozen=True, slots=True)
class RequestSweep:
    """A lifecycle trigger: `recovery` (startup) or `runnerExit`."""

    trigger: str


@dataclass(frozen=True, slots=True)
class MaintenanceRunning:
    """From a maintenance actor (`state.prune`, `state.backup`): whether a command of
    its kind is in flight. No sweep starts while any kind is."""

    kind: str
    running: bool


@dataclass(frozen=True, slots=True)
class StopSweeps:
    """The server is stopping: start nothing more (a tree in flight still commits)."""


@dataclass(frozen=True, slots=True)
class _Selected:
    sweep: int


@dataclass(frozen=True, slots=True)
class _Swept:
    sweep: int


@dataclass(frozen=True, slots=True)
class _Checkpointed:
    sweep: int


@dataclass(frozen=True, slots=True)
class _Collected:
    sweep: int


@dataclass(frozen=True, slots=True)
class _Orphans:
    sweep: int


@dataclass(frozen=True, slots=True)
class _Compacted:
    sweep: int


@dataclass
class _Sweep:
    """One sweep under way (it may span several idle periods)."""

    number: int
    trigger: str
    started_at: int
    """Wall-clock ms (shown by `state status`)."""
    cutoff: int | None = None
    """Fixed by the first selection page (None: no page read yet)."""
    after: str | None = ""
    """The cursor of the next selection page ("": the first; None: every page read)."""
    pending: list[PruneTree] = field(default_factory=list)
    """The current page's trees still to delete, the next last (popped from the end)."""
    kept: int = 0
    deleted_trees: int = 0
    deleted_runs: int = 0
    skipped: int = 0
    digests: set[str] = field(default_factory=set)
    blobs_deleted: int = 0


class RetentionActor(ServerActor):
    """Owns: the one automatic sweep of this server process, its timers and its report.

    Receives: `RequestSweep` (after recovery, after a runner exit), `MaintenanceRunning`,
        `StopSweeps`, `Tick` (the daily check and the five-minute retry) and `Done`.
    Sends: `Read(SelectExpired)` to the reader, a page of trees at a time; `Transact`
        to the database: `SweepTree` one tree a unit, `CheckpointSweepWal` every
        `CHECKPOINT_EVERY_TREES` trees, then `CollectSweepBlobs`, `CompactAfterSweep`.
    Invariants: overlapping requests join the one sweep; a sweep starts only while no
        maintenance command runs and the server is not stopping, and each unit checks
        that no runner work is pending (else it yields: the sweep stays due and goes on
        at the next trigger or after five minutes); at most one completed sweep per
        `SWEEP_EVERY_MS`; no backup.
    On failure: a failed unit is one bounded diagnostic (its error's type, no content
        or path); the sweep stays due and is tried again after `RETRY_AFTER_MS`. Trees
        deleted so far stay deleted, each in its own transaction.
    """

    name = "retention"

    def __init__(
        self,
        config: RetentionConfig,
        report: RetentionReport,
        on_actor_failure: ActorFailureHandler,
        *,
        database: pykka.ActorRef[Any],
        reader: pykka.ActorRef[Any],
    ) -> None:
        super().__init__(on_actor_failure)
        self._config = config
        self._report = report
        self._database = database
        self._reader = reader
        self._due = False
        self._sweep: _Sweep | None = None
        self._in_flight = False
        """A unit of the sweep is asked and not answered yet."""
        self._numbers = 0
        self._maintenance: set[str] = set()
        """The maintenance kinds with a command in flight."""
        self._stopping = False
        self._retry_at: int | None = None
        """Monotonic ms: after a failure, no sweep starts before this."""
        self._idle_retry_at: int | None = None
        """Monotonic ms: a yielded sweep goes on by itself at this time."""
        self._completed_at: int | None = None
        """Monotonic ms of this process's last completed sweep."""

    def on_receive(self, message: Any) -> Any:
        match message:
            case RequestSweep(trigger=trigger):
                self._request(trigger)
            case MaintenanceRunning(kind=kind, running=running):
                if running:
                    self._maintenance.add(kind)
                else:
                    self._maintenance.discard(kind)
                self._maybe_go("idle")
            case StopSweeps():
                self._stopping = True
            case Tick():
                self._on_tick()
            case Done(tag=tag, reply=reply):
                self._on_done(tag, reply)
            case _:
                raise TypeError(f"retention actor got {type(message).__name__}")
        return None

    # --- triggers ----------------------------------------------------------------------

    def _now(self) -> int:
        return self._config.clock.monotonic_ms()

    def _request(self, trigger: str) -> None:
        if self._config.days <= 0:
            return
        self._due = True
        self._idle_retry_at = None  # an idle trigger goes on at once
        self._maybe_go(trigger)

    def _on_tick(self) -> None:
        if self._config.days <= 0:
            return
        now = self._now()
        if self._completed_at is not None and now - self._completed_at >= SWEEP_EVERY_MS:
            self._due = True  # the daily check
        if self._idle_retry_at is not None and now >= self._idle_retry_at:
            self._idle_retry_at = None
        # A sweep under way (yielded, or failed) goes on; else a due one starts.
        self._maybe_go("daily")

    def _may_start(self) -> bool:
        now = self._now()
        return not (
            not self._due
            or self._in_flight
            or self._stopping
            or self._maintenance
            or (self._retry_at is not None and now < self._retry_at)
            or (self._idle_retry_at is not None and now < self._idle_retry_at)
            or (self._completed_at is not None and now - self._completed_at < SWEEP_EVERY_MS)
        )

    def _maybe_go(self, trigger: str) -> None:
        if not self._may_start():
            return
        self._retry_at = None
        sweep = self._sweep
        if sweep is None:
            self._numbers += 1
            sweep = _Sweep(self._numbers, trigger, self._config.clock.now_ms())
            self._sweep = sweep
        self._report.publish(state="sweeping")  # begun, or going on after a yield
        if sweep.cutoff is None:
            self._select(sweep)
        else:
            self._next(sweep)

    # --- the sweep ---------------------------------------------------------------------

    def _on_done(self, tag: object, reply: Reply) -> None:
        self._in_flight = False
        sweep = self._sweep
        number = getattr(tag, "sweep", None)
        if sweep is None or number != sweep.number:
            return
        if reply.error is not None:
            self._failed(sweep, reply.error)
            return
        match tag:
            case _Selected():
                self._on_selected(sweep, reply.value)
            case _Swept():
                self._on_swept(sweep, reply.value)
            case _Checkpointed():
                self._next(sweep)
            case _Collected():
                sweep.blobs_deleted += int(reply.value)
                sweep.digests.clear()
                self._find_orphans(sweep)
            case _Orphans():
                assert isinstance(reply.value, TreeFiles)
                remove_orphan_files(self._config.state_dir, reply.value)
                self._compact(sweep)
            case _Compacted():
                self._completed(sweep, reply.value)

    def _on_selected(self, sweep: _Sweep, value: object) -> None:
        if value == YIELDED:
            self._yielded(sweep)
            return
        assert isinstance(value, RetentionSelection)
        sweep.cutoff = value.cutoff
        sweep.kept += value.kept
        sweep.pending = list(reversed(value.trees))
        sweep.after = value.next_after
        self._next(sweep)

    def _on_swept(self, sweep: _Sweep, value: object) -> None:
        if value == YIELDED:
            self._yielded(sweep)
            return
        sweep.pending.pop()
        if isinstance(value, DeletedTree):
            sweep.deleted_trees += 1
            sweep.deleted_runs += len(value.run_ids)
            sweep.digests |= value.digests
            remove_tree_files(self._config.state_dir, value)
            if sweep.deleted_trees % CHECKPOINT_EVERY_TREES == 0:
                self._ask(
                    self._database, Transact, CheckpointSweepWal(), _Checkpointed(sweep.number)
                )
                return
        else:
            sweep.skipped += 1  # changed since the selection: kept
        self._next(sweep)

    def _next(self, sweep: _Sweep) -> None:
        """The next step; checked before each, so a stop or a command halts it."""
        if self._stopping or self._maintenance:
            return  # stays due; the next trigger goes on
        assert sweep.cutoff is not None
        if sweep.pending:
            unit: object = SweepTree(sweep.pending[-1], sweep.cutoff)
            self._ask(self._database, Transact, unit, _Swept(sweep.number))
            return
        if sweep.after is not None:
            self._select(sweep)
            return
        grace = self._config.blob_grace_ms
        collect = CollectSweepBlobs(frozenset(sweep.digests), grace)
        self._ask(self._database, Transact, collect, _Collected(sweep.number))

    def _select(self, sweep: _Sweep) -> None:
        """Read the next page of the selection (the first fixes the cutoff)."""
        assert sweep.after is not None
        unit = SelectExpired(self._config.days, sweep.cutoff, sweep.after)
        self._ask(self._reader, Read, unit, _Selected(sweep.number))

    def _find_orphans(self, sweep: _Sweep) -> None:
        """Files of trees deleted by a server that died before it removed them: listed
        first, then checked against the rows (which always exist before their files)."""
        files = list_tree_files(self._config.state_dir)
        if not (files.run_ids or files.runner_epochs or files.resource_uids):
            self._compact(sweep)
            return
        self._ask(self._reader, Read, FindOrphanFiles(files), _Orphans(sweep.number))

    def _compact(self, sweep: _Sweep) -> None:
        config = self._config
        unit = CompactAfterSweep(config.vacuum_min_bytes, config.vacuum_min_free_ratio)
        self._ask(self._database, Transact, unit, _Compacted(sweep.number))

    def _yielded(self, sweep: _Sweep) -> None:
        """Runner work appeared: stop between trees; the next trigger goes on."""
        self._idle_retry_at = self._now() + RETRY_AFTER_MS
        self._publish_next(self._idle_retry_at, state="waitingForIdle")

    def _failed(self, sweep: _Sweep, error: BaseException) -> None:
        if isinstance(error, pykka.ActorDeadError):
            return  # the server stops
        log.warning(
            "state retention sweep failed; it is tried again in five minutes",
            extra={"action": "retention.failed", "error": type(error).__name__},
        )
        self._retry_at = self._now() + RETRY_AFTER_MS
        self._report.publish(
            lastFailure={"at": self._config.clock.now_ms(), "error": type(error).__name__}
        )
        sweep.cutoff = None  # select again: what is left, from the first page
        sweep.after = ""
        sweep.kept = 0
        sweep.pending = []
        self._publish_next(self._retry_at, state="retrying")

    def _completed(self, sweep: _Sweep, outcome: CompactOutcome) -> None:
        if outcome.skipped not in (None, "busy"):
            log.warning(
                "state compaction failed; the deletions stay committed and the free pages reusable",
                extra={"action": "retention.vacuum_failed", "error": outcome.skipped},
            )
        self._sweep = None
        self._due = False
        self._idle_retry_at = None
        self._completed_at = self._now()
        finished = self._config.clock.now_ms()
        self._report.publish(
            lastSweep={
                "trigger": sweep.trigger,
                "startedAt": sweep.started_at,
                "finishedAt": finished,
                "treesDeleted": sweep.deleted_trees,
                "runsDeleted": sweep.deleted_runs,
                "treesKeptProtected": sweep.kept,
                "treesSkipped": sweep.skipped,
                "blobsDeleted": sweep.blobs_deleted,
                "walTruncated": outcome.wal_truncated,
                "vacuumed": outcome.vacuumed,
                "compactionSkipped": outcome.skipped,
                "reclaimableBytes": outcome.reclaimable_bytes,
            }
        )
        self._publish_next(self._completed_at + SWEEP_EVERY_MS, state="idle")
        log.info(
            "state retention sweep completed",
            extra={
                "action": "retention.swept",
                "trees": sweep.deleted_trees,
                "runs": sweep.deleted_runs,
            },
        )

    def _publish_next(self, monotonic_at: int, *, state: str) -> None:
        clock = self._config.clock
        wall = clock.now_ms() + (monotonic_at - clock.monotonic_ms())
        self._report.publish(nextDueAt=wall, state=state)

    def _ask(
        self,
        actor: pykka.ActorRef[Any],
        kind: type[Read] | type[Transact],
        unit: object,
        tag: object,
    ) -> None:
        self._in_flight = True
        try:
            actor.tell(kind(unit, self.actor_ref, tag))
        except pykka.ActorDeadError as exc:
            with contextlib.suppress(pykka.ActorDeadError):
                self.actor_ref.tell(Done(tag, Reply(error=exc)))
