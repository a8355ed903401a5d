"""`WorkflowServer`: the composition root that owns the lock, the actors and the socket.

Implements workflow-server.md § Process model, § Server lifecycle and § Worker
scheduling. Start order: lock, log, zygote, database, server epoch, process supervisor,
startup recovery, the other actors, socket, ticker. Stop: refuse new work, wait for
in-flight receipts, stop admitting, drain runners, then tear down in reverse.
Nothing here runs runner or client logic: the actors and the router do.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pykka

from pi_workflows._version import __version__
from pi_workflows.actors import (
    POLL_SECONDS_ENV,
    RESOURCE_RUNNER_MODULE,
    RETRY_BOUND_ENV,
    RUNNER_MODULE,
    VACUUM_MIN_BYTES,
    VALIDATOR_MODULE,
    BackupsSettled,
    ChannelAdapterActor,
    ChannelsConfig,
    ClaimRenewerActor,
    ConnectRetention,
    ConnectScheduler,
    CoordinatorEpochActor,
    DatabaseActor,
    DeadlinesActor,
    Drain,
    HandBack,
    LeaseLost,
    ProcessSupervisorActor,
    ReaderActor,
    RequestSweep,
    ResourceRunnersActor,
    ResourceRunnersConfig,
    ResumeValidations,
    RetentionActor,
    RetentionConfig,
    RunnerHostActor,
    RunnerHostConfig,
    SchedulerActor,
    ServerEpochTaken,
    StartReconciling,
    StateBackupActor,
    StatePruneActor,
    StopAdapters,
    StopSweeps,
    SubscriptionActor,
    Ticker,
    Transact,
    ValidationsActor,
    ValidationsConfig,
    WatchCommits,
    reconcile_deadline_from_env,
    run_view_cache_enabled,
    validate_timeout_from_env,
    wait_reply,
)
from pi_workflows.domain import (
    ActiveEpochs,
    OperationContext,
    Perform,
    RecoveryReport,
    ReleaseServerClaim,
    RetentionReport,
    RunViewCache,
    ServerHasWork,
    channels_path,
    perform,
    recover_at_startup,
    retention_days_from_env,
)
from pi_workflows.engine import Limits
from pi_workflows.engine import default_limits as limits_from_env
from pi_workflows.errors import PiWorkflowsError
from pi_workflows.server._definition_cache import DefinitionCache
from pi_workflows.server._logging import configure_server_logging, detach_server_logging
from pi_workflows.server._resolver import RESOLVER_MODULE, ResolverPort
from pi_workflows.server._router import DEFAULT_DRAIN_S, Router, RouterPorts
from pi_workflows.storage import (
    Clock,
    Database,
    ServerClaim,
    SystemClock,
    acquire_server_epoch,
    ensure_private_dir,
    open_database,
    suspend_after_server_death,
    workflows_dir,
)
from pi_workflows.supervision import ProcessIdentity, ServerLock, StopRecorded, Zygote, crash_point
from pi_workflows.wire import ClientListener, ConnectionLimits, raise_descriptor_limit
from pi_workflows.wire.runner import max_value_bytes

__all__ = [
    "BLOB_GRACE_ENV",
    "DEFAULT_IDLE_EXIT_S",
    "DEFAULT_MAX_WORKERS",
    "IDLE_EXIT_ENV",
    "MAX_WORKERS_ENV",
    "SERVER_LEASE_ENV",
    "ServerStartError",
    "WorkflowServer",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_WORKERS = 4
MAX_WORKERS_ENV = "PI_WORKFLOWS_MAX_WORKERS"
DEFAULT_IDLE_EXIT_S = 600.0
"""An idle server (no client, runner, queued run or unsettled work) exits after this."""
IDLE_EXIT_ENV = "PI_WORKFLOWS_IDLE_EXIT_SECONDS"
SERVER_LEASE_TTL_MS = 15_000
SERVER_LEASE_ENV = "PI_WORKFLOWS_SERVER_LEASE_MS"
BLOB_GRACE_ENV = "PI_WORKFLOWS_BLOB_GRACE_SECONDS"
"""How old an unnamed blob must be before `state prune` collects it (default a day)."""
DEFAULT_BLOB_GRACE_S = 24 * 60 * 60
"""A test knob: the server lease lifetime in ms (default 15,000), so a stall test need
not stop a server for 15 s. Renewal runs five times per lifetime, at most every 2 s."""
RENEW_EVERY_S = 2.0
STOP_DRAIN_TIMEOUT_S = 10.0
ACTOR_STOP_TIMEOUT_S = 10.0
MAINTENANCE_STOP_TIMEOUT_S = 900.0
"""How long a stop waits for a backup in flight to be verified and its receipt stored
(client-protocol.md § Maintenance: shutdown waits for in-flight maintenance receipts)."""
STOP_CHANNELS_TIMEOUT_S = 5.0
DB_CALL_TIMEOUT_S = 10.0
RESOLVER_THREADS = 2
"""Source resolver children that may run at once (each loads workflow code)."""
ZYGOTE_ENV = "PI_WORKFLOWS_ZYGOTE"
WARM_MODULE = "pi_workflows.engine._warm"
"""The module whose `prewarm` and `rehearse` warm the zygote's caches: imported by name
in the zygote's process only (the server never loads the node executor)."""
"""`0` starts every runner and resolver as a cold interpreter (no zygote)."""


class ServerStartError(PiWorkflowsError):
    """The server could not start (bad configuration or state)."""


def lease_ttl_from_env(environ: dict[str, str] | None = None) -> int:
    """`PI_WORKFLOWS_SERVER_LEASE_MS` as a lifetime of at least 500 ms, or 15,000."""
    raw = (environ if environ is not None else dict(os.environ)).get(SERVER_LEASE_ENV, "")
    if not raw.strip():
        return SERVER_LEASE_TTL_MS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 500:
        raise ServerStartError(f"{SERVER_LEASE_ENV} must be an integer of at least 500")
    return value


def blob_grace_from_env(environ: dict[str, str] | None = None) -> int:
    """`PI_WORKFLOWS_BLOB_GRACE_SECONDS` in milliseconds (0 or more), or a day.

    The grace period protects blobs an in-flight upload or content reference wrote
    before any row names them (`collect_unnamed_blobs`); it must stay well above the
    blob refresh interval for that, so only a test sets it lower.
    """
    raw = (environ if environ is not None else dict(os.environ)).get(BLOB_GRACE_ENV, "")
    if not raw.strip():
        return DEFAULT_BLOB_GRACE_S * 1000
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ServerStartError(f"{BLOB_GRACE_ENV} must be a whole number of seconds, 0 or more")
    return value * 1000


VACUUM_MIN_BYTES_ENV = "PI_WORKFLOWS_RETENTION_VACUUM_MIN_BYTES"
"""A test knob: the reclaimable bytes an idle sweep needs before it runs VACUUM
(default 64 MiB), so a test need not write 64 MiB to reach it."""


def vacuum_min_bytes_from_env(environ: dict[str, str] | None = None) -> int:
    raw = (environ if environ is not None else dict(os.environ)).get(VACUUM_MIN_BYTES_ENV, "")
    try:
        value = int(raw) if raw.strip() else VACUUM_MIN_BYTES
    except ValueError:
        value = -1
    if value < 0:
        raise ServerStartError(f"{VACUUM_MIN_BYTES_ENV} must be a whole number of bytes")
    return value


def _retention_days() -> int:
    try:
        return retention_days_from_env()
    except ValueError as exc:
        raise ServerStartError(str(exc)) from None


def max_workers_from_env(environ: dict[str, str] | None = None) -> int:
    """`PI_WORKFLOWS_MAX_WORKERS` as a positive integer, or the default of 4."""
    raw = (environ if environ is not None else dict(os.environ)).get(MAX_WORKERS_ENV, "")
    if not raw.strip():
        return DEFAULT_MAX_WORKERS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ServerStartError(f"{MAX_WORKERS_ENV} must be a positive integer, not {raw!r}")
    return value


def _default_limits(given: Limits | None) -> Limits:
    """The server's default node limits, and the value cap checked once here (runners
    read the same variable: they get this environment)."""
    try:
        limits = given if given is not None else limits_from_env()
        max_value_bytes()
    except ValueError as exc:
        raise ServerStartError(str(exc)) from None
    return limits


class WorkflowServer:
    """One workflow server for one state folder, embeddable in a test.

    Args:
        state_dir: the workflow state folder (`<agent dir>/workflows` by default).
        max_workers: execution capacity; default `PI_WORKFLOWS_MAX_WORKERS` or 4.
        idle_exit_s: stop after this long with nothing to do; None never stops.
        tick_s: the ticker interval (renewal, subscriptions, scheduling, reaping).
        clock: time source for stored times (tests may pass a manual clock).
        execute_runs: launch runner processes for admitted runs; False only records
            runs (tests of the protocol use it).
        default_limits: the `memory_mb` and `processes` of every node whose workflow
            sets none; default `PI_WORKFLOWS_DEFAULT_MEMORY_MB` and
            `PI_WORKFLOWS_DEFAULT_PROCESSES`, or half the memory (at most 4 GiB) and
            512. `Limits()` sets no default.
        connection_limits: the client connection cap and first-frame deadline; default
            from `PI_WORKFLOWS_MAX_CONNECTIONS` and `PI_WORKFLOWS_FIRST_FRAME_SECONDS`.
        lease_ttl_ms: the server lease lifetime; default `PI_WORKFLOWS_SERVER_LEASE_MS`
            or 15,000 (tests of stalls shorten it).
        units: how the database and reader actors resolve a unit of work; default
            `pi_workflows.domain.perform`. Tests extend it with units of their own
            (`pi_workflows.testing.perform_with_calls`).

    **Blocking:** `start` returns once the socket accepts commands; `stop` returns
    once every in-flight command has its receipt and every actor has stopped.
    """

    def __init__(
        self,
        state_dir: Path | str | None = None,
        *,
        max_workers: int | None = None,
        idle_exit_s: float | None = DEFAULT_IDLE_EXIT_S,
        tick_s: float = 0.25,
        clock: Clock | None = None,
        execute_runs: bool = True,
        default_limits: Limits | None = None,
        connection_limits: ConnectionLimits | None = None,
        lease_ttl_ms: int | None = None,
        units: Perform | None = None,
    ) -> None:
        self._units: Perform = units if units is not None else perform
        self.state_dir = Path(state_dir) if state_dir is not None else workflows_dir()
        self.max_workers = max_workers if max_workers is not None else max_workers_from_env()
        if self.max_workers < 1:
            raise ServerStartError("max_workers must be at least 1")
        self.default_limits = _default_limits(default_limits)
        self.idle_exit_s = idle_exit_s
        self.tick_s = tick_s
        self.clock: Clock = clock or SystemClock()
        self.execute_runs = execute_runs
        self.connection_limits = connection_limits or ConnectionLimits.from_env()
        self.descriptor_limit = 0
        """The soft RLIMIT_NOFILE in force, after `start` raised it to the hard limit."""
        self.lease_ttl_ms = lease_ttl_ms if lease_ttl_ms is not None else lease_ttl_from_env()
        self.blob_grace_ms = blob_grace_from_env()
        self.retention = RetentionReport(_retention_days())
        """What `state status` shows of automatic retention (the retention actor writes it)."""
        self._retention_ref: pykka.ActorRef[Any] | None = None
        self.owner_id = f"server-{uuid.uuid4().hex[:12]}"
        self.epoch = 0
        self.stop_reason: str | None = None
        self._lock = ServerLock(self.host_dir / "server.lock")
        self._stopped = threading.Event()
        self._stopping = threading.Lock()
        self._accepting = False
        self._in_flight = 0
        self._in_flight_lock = threading.Condition()
        self._refs: list[pykka.ActorRef[Any]] = []
        self._database: pykka.ActorRef[Any] | None = None
        self._subscriptions: pykka.ActorRef[Any] | None = None
        self._coordinators: pykka.ActorRef[Any] | None = None
        self._scheduler: pykka.ActorRef[Any] | None = None
        self._supervisor: pykka.ActorRef[Any] | None = None
        self._listener: ClientListener | None = None
        self._ticker: Ticker | None = None
        self._server_claim: ServerClaim | None = None
        self._runner_host: pykka.ActorRef[Any] | None = None
        self._channels: pykka.ActorRef[Any] | None = None
        self._state_backup: pykka.ActorRef[Any] | None = None
        self._resolvers: ThreadPoolExecutor | None = None
        self._log_handler: logging.Handler | None = None
        self._watcher: threading.Thread | None = None
        self._zygote: Zygote | None = None
        self.definitions = DefinitionCache()
        """Reusable resolver answers: a hit starts a run without a resolver child."""
        self.recovery: RecoveryReport | None = None
        """What startup recovery did (counts only)."""

    # --- paths -----------------------------------------------------------------------

    @property
    def host_dir(self) -> Path:
        """`<state>/host`: the socket and the lock, mode 0700."""
        return self.state_dir / "host"

    @property
    def socket_path(self) -> Path:
        """The client socket, `<state>/host/host.sock`, mode 0600."""
        return self.host_dir / "host.sock"

    # --- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> WorkflowServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop("context exit")

    def start(self) -> None:
        """Take the lock and the epoch, start the actors, then accept clients.

        Raises:
            ServerAlreadyRunningError: another live server holds the lock.
            SchemaMismatchError: the database has another schema; nothing was written.
        """
        for folder in (self.state_dir, self.host_dir, self.state_dir / "logs"):
            ensure_private_dir(folder)
        self._lock.acquire()
        self.descriptor_limit = raise_descriptor_limit()
        try:
            self._log_handler = configure_server_logging(self.state_dir / "logs")
            self._start_zygote()
            db = open_database(self.state_dir / "state.sqlite", clock=self.clock)
            self._take_epoch(db)
            self._start_supervisor()
            self.recovery = recover_at_startup(db, self.owner_id, self._stop_recorded)
            self._start_actors(db)
            self._start_listener()
        except BaseException:
            self._teardown()
            raise
        self._accepting = True
        if self._retention_ref is not None:  # recovery step 12: the sweep waits for idle
            self._retention_ref.tell(RequestSweep("recovery"))
        log.info("server started", extra={"action": "server.started", "epoch": self.epoch})
        self._watcher = threading.Thread(target=self._watch, name="server-watch", daemon=True)
        self._watcher.start()

    def _start_zygote(self) -> None:
        # Started before the database opens and before any actor thread: it imports the
        # runner and resolver once while the server starts, then forks them on request.
        if os.environ.get(ZYGOTE_ENV) == "0":
            return
        self._zygote = Zygote(
            [RUNNER_MODULE, RESOLVER_MODULE, VALIDATOR_MODULE, RESOURCE_RUNNER_MODULE],
            log_path=self.state_dir / "logs" / "zygote.log",
            warm=WARM_MODULE,
        )
        self._zygote.prestart()

    def _take_epoch(self, db: Database) -> None:
        # Holding the lock proves no other server lives, so its lease may be taken over
        # at once: a crash restart never waits out the old lease.
        with db.write() as tx:
            # No coordinator epoch outlives its server: interactive step timers stop at
            # the old server's last heartbeat, in the transaction that ends its epoch.
            suspend_after_server_death(tx)
            claim = acquire_server_epoch(
                tx,
                owner_id=self.owner_id,
                pid=os.getpid(),
                ttl_ms=self.lease_ttl_ms,
                previous_owner_gone=True,
            )
        self._server_claim = claim
        self.epoch = claim.epoch

    def _start_supervisor(self) -> None:
        self._supervisor = ProcessSupervisorActor.start(self._on_actor_failure, self._zygote)
        self._refs.append(self._supervisor)

    def _stop_recorded(self, identities: tuple[ProcessIdentity, ...]) -> int:
        """Recovery's stop of recorded groups, through the one signaller."""
        supervisor = self._supervisor
        assert supervisor is not None
        if not identities:
            return 0

        stopped = wait_reply(
            lambda box: supervisor.tell(StopRecorded(identities, box)), DB_CALL_TIMEOUT_S
        )
        return int(stopped)

    def _start_actors(self, db: Database) -> None:
        fail = self._on_actor_failure
        supervisor = self._supervisor
        assert supervisor is not None and self._server_claim is not None
        database = DatabaseActor.start(db, fail, units=self._units)
        self._database = database
        self._listener = ClientListener(
            self.socket_path,
            None,
            __version__,
            self._on_listener_crash,
            limits=self.connection_limits,
            descriptor_limit=self.descriptor_limit,
        )
        agent_dir = self.state_dir.parent
        config = RunnerHostConfig(
            self.owner_id, self.state_dir, agent_dir, self.clock, default_limits=self.default_limits
        )
        runner_host = RunnerHostActor.start(config, database, supervisor, self._listener, fail)
        self._runner_host = runner_host
        renew_s = min(RENEW_EVERY_S, self.lease_ttl_ms / 5000)
        every = max(1, round(renew_s / self.tick_s))
        renewer = ClaimRenewerActor.start(
            database, self._server_claim, every, _LeaseNotices(self), fail,
            clock=self.clock, lock=self._lock, pid=os.getpid(),
        )  # fmt: skip
        launches = runner_host if self.execute_runs else None
        self._scheduler = SchedulerActor.start(
            database, self.max_workers, launches, fail, self.owner_id
        )
        runner_host.tell(ConnectScheduler(self._scheduler))
        views = RunViewCache() if run_view_cache_enabled() else None
        reader = ReaderActor.start(db.path, self.clock, fail, units=self._units, run_views=views)
        # The coordinator actor publishes its epochs; a coordinator's session view reads them.
        epochs = ActiveEpochs()
        self._subscriptions = SubscriptionActor.start(reader, fail, epochs=epochs)
        database.tell(WatchCommits(self._subscriptions))  # live views refresh on commit
        self._coordinators = CoordinatorEpochActor.start(fail, epochs, database)
        deadlines = DeadlinesActor.start(
            database=database,
            reader=reader,
            scheduler=self._scheduler,
            clock=self.clock,
            owner_id=self.owner_id,
            on_actor_failure=fail,
        )
        database.tell(WatchCommits(deadlines))  # a turn's start or end moves the timer
        validations = ValidationsActor.start(
            ValidationsConfig(self.state_dir, agent_dir, validate_timeout_from_env()),
            fail,
            database=database,
            reader=reader,
            supervisor=supervisor,
            listener=self._listener,
            epochs=epochs,
            scheduler=self._scheduler,
        )
        validations.tell(ResumeValidations())  # recovery step 9, now that children can start
        # One transport-only child per Telegram profile (recovery already made every
        # attempt a dead server left applying ambiguous).
        channels = ChannelAdapterActor.start(
            ChannelsConfig(
                self.state_dir,
                channels_path(agent_dir),
                self.tick_s,
                os.environ.get(POLL_SECONDS_ENV),
                ChannelsConfig.retry_bound_from(os.environ.get(RETRY_BOUND_ENV)),
            ),
            fail,
            database=database,
            reader=reader,
            supervisor=supervisor,
            listener=self._listener,
            scheduler=self._scheduler,
        )
        database.tell(WatchCommits(channels))  # a new decision or answer is work at once
        self._channels = channels
        resource_runners = self._start_resource_runners(database, supervisor)
        retention = RetentionActor.start(
            RetentionConfig(
                self.retention.days,
                self.state_dir,
                self.clock,
                self.blob_grace_ms,
                vacuum_min_bytes=vacuum_min_bytes_from_env(),
            ),
            self.retention,
            fail,
            database=database,
            reader=reader,
        )
        self._retention_ref = retention
        runner_host.tell(ConnectRetention(retention))  # a runner's exit is a sweep trigger
        state_backup = StateBackupActor.start(
            db.path, self.clock, fail, database=database, units=self._units, retention=retention
        )
        self._state_backup = state_backup
        state_prune = StatePruneActor.start(
            fail,
            database=database,
            reader=reader,
            backups=state_backup,
            blob_grace_ms=self.blob_grace_ms,
            state_dir=self.state_dir,
            retention=retention,
        )
        # Stop order (reverse of this list, the database last): the runner host stops
        # before the supervisor, which kills what is left.
        self._refs = [
            database,
            reader,
            supervisor,
            runner_host,
            renewer,
            self._scheduler,
            self._subscriptions,
            self._coordinators,
            validations,
            deadlines,
            channels,
            retention,
            state_backup,
            state_prune,
            *resource_runners,
        ]
        self._ticker = Ticker(self.tick_s)
        for ref in (
            renewer,
            self._scheduler,
            self._subscriptions,
            supervisor,
            runner_host,
            validations,
            deadlines,
            channels,
            retention,
        ):
            self._ticker.register(ref)
        for ref in resource_runners:
            self._ticker.register(ref)
        self._ticker.register(database)  # retries the writes a full disk held
        self._resolvers = ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="resolver")
        context = OperationContext(
            epoch=self.epoch,
            owner_id=self.owner_id,
            agent_dir=agent_dir,
            pid=os.getpid(),
            retention=self.retention,
        )
        self._listener.route_to(
            Router(
                RouterPorts(
                    loop=self._listener.address,
                    context=context,
                    database=database,
                    reader=reader,
                    runner_host=runner_host,
                    scheduler=self._scheduler,
                    subscriptions=self._subscriptions,
                    coordinators=self._coordinators,
                    validations=validations,
                    resolvers=self._resolvers,
                    agent_dir=agent_dir,
                    resolver_children=ResolverPort(supervisor),
                    definitions=self.definitions,
                    begin_request=self._begin_request,
                    end_request=self._end_request,
                    stop=self.stop_async,
                    epochs=epochs,
                    channels=channels,
                    state_prune=state_prune,
                    state_backup=state_backup,
                )
            )
        )

    def _start_resource_runners(
        self, database: pykka.ActorRef[Any], supervisor: pykka.ActorRef[Any]
    ) -> tuple[pykka.ActorRef[Any], ...]:
        """The resource runners (none in a server that only records runs): recovery step 7
        once children can start, then a pass for every due key within the capacity."""
        if not self.execute_runs:
            return ()
        assert self._listener is not None
        try:
            deadline_s = reconcile_deadline_from_env()
        except ValueError as exc:
            raise ServerStartError(str(exc)) from None
        config = ResourceRunnersConfig(
            self.owner_id,
            self.state_dir,
            self.max_workers,
            self.clock,
            deadline_s,
            agent_dir=self.state_dir.parent,
        )
        runners = ResourceRunnersActor.start(
            config,
            self._on_actor_failure,
            database=database,
            supervisor=supervisor,
            listener=self._listener,
            scheduler=self._scheduler,
        )
        database.tell(WatchCommits(runners))  # an apply, an enqueue or a freed slot is work
        runners.tell(StartReconciling())
        return (runners,)

    def _start_listener(self) -> None:
        assert self._listener is not None and self._ticker is not None
        self._listener.start()
        self._ticker.start()

    def stop(self, reason: str = "stopped", drain_s: float | None = None) -> None:
        """Stop gracefully: refuse new work, drain runners, wait for receipts, stop.

        `drain_s` (default `DEFAULT_DRAIN_S`) is how long applying effects and running
        shell commands may take to settle; runs are handed back at their next durable
        boundary, and only an effect still applying when it ends becomes ambiguous.
        """
        with self._stopping:
            if self._stopped.is_set():
                return
            self.stop_reason = self.stop_reason or reason
            self._accepting = False
            log.info("server stopping", extra={"action": "server.stopping", "reason": reason})
            if self._retention_ref is not None:
                with contextlib.suppress(pykka.ActorDeadError):
                    self._retention_ref.tell(StopSweeps())
            self._wait_maintenance()
            self._wait_in_flight()
            self._stop_launching()
            self._drain(DEFAULT_DRAIN_S if drain_s is None else drain_s)
            self._stop_channels()
            self._teardown()
            self._stopped.set()

    def stop_async(self, reason: str, drain_s: float | None = None) -> None:
        """Stop from a thread that must not block (an actor, the listener)."""
        threading.Thread(target=self.stop, args=(reason, drain_s), name="server-stop").start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stopped; True if it did within `timeout`."""
        return self._stopped.wait(timeout)

    @property
    def running(self) -> bool:
        """True between a successful start and the end of stop."""
        return self._accepting and not self._stopped.is_set()

    def _wait_maintenance(self) -> None:
        """Let every backup in flight finish and store its receipt (new requests are
        refused by now); the database and listener are still up to store and answer."""
        backups = self._state_backup
        if backups is None or not backups.is_alive():
            return
        try:
            wait_reply(lambda box: backups.tell(BackupsSettled(box)), MAINTENANCE_STOP_TIMEOUT_S)
        except (TimeoutError, pykka.ActorDeadError):
            log.warning(
                "stopping with a backup still in flight",
                extra={"action": "server.stop_timeout"},
            )

    def _wait_in_flight(self) -> None:
        deadline = time.monotonic() + STOP_DRAIN_TIMEOUT_S
        with self._in_flight_lock:
            while self._in_flight > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.warning(
                        "stopping with commands still in flight",
                        extra={"action": "server.stop_timeout"},
                    )
                    return
                self._in_flight_lock.wait(remaining)

    def _teardown(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()
        if self._resolvers is not None:
            self._resolvers.shutdown(wait=True, cancel_futures=False)
        if self._listener is not None:
            self._listener.stop()
        for ref in reversed(self._refs[1:]):
            with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                ref.stop(block=True, timeout=ACTOR_STOP_TIMEOUT_S)
        self._release_epoch()
        if self._refs:
            with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                self._refs[0].stop(block=True, timeout=ACTOR_STOP_TIMEOUT_S)
        self._refs = []
        if self._zygote is not None:
            self._zygote.close()
        self._lock.release()
        if self._log_handler is not None:
            detach_server_logging(self._log_handler)
            self._log_handler = None

    def _stop_launching(self) -> None:
        """Stop the scheduler before runs are handed back, so none is launched again.

        A launch it already asked for is claimed before the hand-back (the database
        actor keeps order), so the hand-back requeues that run too.
        """
        if self._scheduler is not None:
            with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                self._scheduler.stop(block=True, timeout=ACTOR_STOP_TIMEOUT_S)

    def _drain(self, drain_s: float) -> None:
        """Let runners reach a durable boundary, then hand back what is still held."""
        host = self._runner_host
        if host is None or not host.is_alive():
            return

        crash_point("server.drain.started")
        with contextlib.suppress(TimeoutError):
            wait_reply(lambda box: host.tell(Drain(box)), drain_s)
        with contextlib.suppress(Exception):
            wait_reply(lambda box: host.tell(HandBack(box)), DB_CALL_TIMEOUT_S)

    def _stop_channels(self) -> None:
        """Stop the adapter children and end their channels before the listener stops."""
        channels = self._channels
        if channels is None or not channels.is_alive():
            return

        with contextlib.suppress(Exception):
            wait_reply(lambda box: channels.tell(StopAdapters(box)), STOP_CHANNELS_TIMEOUT_S)

    def _release_epoch(self) -> None:
        claim = self._server_claim
        if claim is None or self._database is None:
            return

        supervisor = self._supervisor
        # A stopped process supervisor killed and waited for every child, so no
        # recorded process of this server is left to reap.
        children_gone = supervisor is None or not supervisor.is_alive()
        with contextlib.suppress(Exception):
            self.call_database(ReleaseServerClaim(claim, children_gone))

    # --- database access for non-actor threads -----------------------------------------

    def call_database(self, unit: object) -> Any:
        """Run a unit of work on the database actor and wait for it (never from an actor).

        Raises:
            TimeoutError: no answer within 10 s; or the unit's own error.
        """
        database = self._database
        assert database is not None
        return wait_reply(lambda box: database.tell(Transact(unit, box)), DB_CALL_TIMEOUT_S)

    # --- failures and idleness ----------------------------------------------------------

    def _on_actor_failure(self, name: str, exc: BaseException | None) -> None:
        reason = f"actor {name} failed ({type(exc).__name__ if exc else 'unknown'})"
        self.stop_async(reason)

    def _on_new_epoch(self, claim: ServerClaim) -> None:
        """The lease lapsed (a stall) and no other server took it: the next epoch is ours.

        Called on the claim renewer's thread; the stop releases this lease."""
        self._server_claim = claim
        self.epoch = claim.epoch

    def _on_listener_crash(self, exc: BaseException) -> None:
        self.stop_async(f"client listener failed ({type(exc).__name__})")

    def _watch(self) -> None:
        """Stop after `idle_exit_s` with no client, runner, queued run or unsettled work."""
        idle_since: float | None = None
        interval = max(self.tick_s, 0.05)
        while not self._stopped.wait(interval):
            if self.idle_exit_s is None or not self._accepting:
                continue
            if self._is_idle():
                now = self.clock.monotonic_ms() / 1000  # the injectable clock, like leases
                idle_since = idle_since if idle_since is not None else now
                if now - idle_since >= self.idle_exit_s:
                    self.stop_async("idle")
                    return
            else:
                idle_since = None

    def _is_idle(self) -> bool:
        if self._listener is None or self._listener.connection_count > 0:
            return False
        with self._in_flight_lock:
            if self._in_flight:
                return False
        try:
            return not self.call_database(ServerHasWork())
        except Exception:  # noqa: BLE001 - an unanswered check means "not idle"
            return False

    # --- request routing ----------------------------------------------------------------

    def _begin_request(self) -> bool:
        with self._in_flight_lock:
            if not self._accepting:
                return False
            self._in_flight += 1
            return True

    def _end_request(self) -> None:
        with self._in_flight_lock:
            self._in_flight -= 1
            self._in_flight_lock.notify_all()


class _LeaseNotices:
    """The server's address for the claim renewer's notices (handled on its thread)."""

    def __init__(self, server: WorkflowServer) -> None:
        self._server = server

    def tell(self, message: Any) -> None:
        match message:
            case LeaseLost(reason=reason):
                self._server.stop_async(reason)
            case ServerEpochTaken(claim=claim):
                self._server._on_new_epoch(claim)
