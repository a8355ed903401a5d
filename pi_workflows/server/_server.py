"""`WorkflowServer`: the composition root that owns the lock, the actors and the socket.

Implements workflow-server.md § Process model, § Server lifecycle and § Worker
scheduling. Start order: lock, database, server epoch, actors, socket, ticker.
Stop order is the reverse, after in-flight commands have their receipts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pykka

from pi_workflows._version import __version__
from pi_workflows.actors._base import Reply, wait_reply
from pi_workflows.actors._claim_renewer import ClaimRenewerActor
from pi_workflows.actors._coordinator_epoch import CoordinatorEpochActor, ReleaseConnection
from pi_workflows.actors._database import DatabaseActor, Transact
from pi_workflows.actors._process_supervisor import (
    ChildExited,
    ProcessSupervisorActor,
    Spawn,
    StopChild,
)
from pi_workflows.actors._scheduler import SchedulerActor, Wake
from pi_workflows.actors._subscriptions import (
    ConnectionClosed,
    Subscribe,
    SubscriptionActor,
    Unsubscribe,
)
from pi_workflows.actors._ticker import Ticker
from pi_workflows.errors import PiWorkflowsError
from pi_workflows.server._logging import configure_server_logging
from pi_workflows.server._operations import (
    COMMANDS,
    READS,
    OperationContext,
    OperationError,
    build_run_list,
    handle_operation,
    rejected,
    response,
    start_request_fields,
    start_run,
)
from pi_workflows.server._recovery import RecoveryReport, recover_at_startup
from pi_workflows.server._resolver import RESOLVER_MODULE, resolve_start
from pi_workflows.server._runners import LaunchPlan, RunnerHost
from pi_workflows.storage import (
    Clock,
    Database,
    QueueRow,
    ServerClaim,
    SystemClock,
    acquire_server_epoch,
    ensure_private_dir,
    forget_recorded_processes,
    open_database,
    release_server_epoch,
    server_has_work,
    workflows_dir,
)
from pi_workflows.supervision import ServerLock, crash_point
from pi_workflows.supervision._zygote_client import Zygote
from pi_workflows.wire._listener import ClientListener, Connection
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.protocol import RequestMessage

__all__ = [
    "DEFAULT_IDLE_EXIT_S",
    "DEFAULT_MAX_WORKERS",
    "IDLE_EXIT_ENV",
    "MAX_WORKERS_ENV",
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
RENEW_EVERY_S = 2.0
STOP_DRAIN_TIMEOUT_S = 10.0
ACTOR_STOP_TIMEOUT_S = 10.0
DB_CALL_TIMEOUT_S = 10.0
RUNNER_GRACE_TICKS = 40
"""SIGTERM to SIGKILL grace for a runner group, in ticks (10 s at the default tick)."""
RUNNER_FD_ENV = "PI_WORKFLOWS_RUNNER_FD"
RESOLVER_THREADS = 2
"""Source resolver children that may run at once (each loads workflow code)."""
LAUNCH_ENV = "PI_WORKFLOWS_LAUNCH"
AGENT_DIR_ENV = "PI_WORKFLOWS_AGENT_DIR"
RUNNER_MODULE = "pi_workflows.engine.runner"
ZYGOTE_ENV = "PI_WORKFLOWS_ZYGOTE"
"""`0` starts every runner and resolver as a cold interpreter (no zygote)."""


class ServerStartError(PiWorkflowsError):
    """The server could not start (bad configuration or state)."""


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
    ) -> None:
        self.state_dir = Path(state_dir) if state_dir is not None else workflows_dir()
        self.max_workers = max_workers if max_workers is not None else max_workers_from_env()
        if self.max_workers < 1:
            raise ServerStartError("max_workers must be at least 1")
        self.idle_exit_s = idle_exit_s
        self.tick_s = tick_s
        self.clock: Clock = clock or SystemClock()
        self.execute_runs = execute_runs
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
        self._runners: RunnerHost | None = None
        self._resolvers: ThreadPoolExecutor | None = None
        self._log_handler: logging.Handler | None = None
        self._ctx: OperationContext | None = None
        self._watcher: threading.Thread | None = None
        self._zygote: Zygote | None = None
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
        try:
            self._log_handler = configure_server_logging(self.state_dir / "logs")
            self._start_zygote()
            db = open_database(self.state_dir / "state.sqlite", clock=self.clock)
            self._take_epoch(db)
            self.recovery = recover_at_startup(db, self.owner_id)
            self._start_actors(db)
            self._start_listener()
        except BaseException:
            self._teardown()
            raise
        self._accepting = True
        log.info("server started", extra={"action": "server.started", "epoch": self.epoch})
        self._watcher = threading.Thread(target=self._watch, name="server-watch", daemon=True)
        self._watcher.start()

    def _start_zygote(self) -> None:
        # Started before the database opens and before any actor thread: it imports the
        # runner and resolver once while the server starts, then forks them on request.
        if os.environ.get(ZYGOTE_ENV) == "0":
            return
        self._zygote = Zygote(
            [RUNNER_MODULE, RESOLVER_MODULE], log_path=self.state_dir / "logs" / "zygote.log"
        )
        self._zygote.prestart()

    def _take_epoch(self, db: Database) -> None:
        # Holding the lock proves no other server lives, so its lease may be taken over
        # at once: a crash restart never waits out the old lease.
        with db.write() as tx:
            claim = acquire_server_epoch(
                tx,
                owner_id=self.owner_id,
                pid=os.getpid(),
                ttl_ms=SERVER_LEASE_TTL_MS,
                previous_owner_gone=True,
            )
        self._server_claim = claim
        self.epoch = claim.epoch

    def _start_actors(self, db: Database) -> None:
        fail = self._on_actor_failure
        database = DatabaseActor.start(db, fail)
        self._database = database
        self._refs.append(database)
        supervisor = ProcessSupervisorActor.start(fail, self._zygote)
        self._supervisor = supervisor
        self._runners = RunnerHost(self.owner_id)
        self._ctx = OperationContext(
            epoch=self.epoch,
            runners=self._runners,
            agent_dir=self.state_dir.parent,
            stop_process=lambda identity: supervisor.tell(StopChild(identity, RUNNER_GRACE_TICKS)),
        )
        assert self._server_claim is not None
        every = max(1, round(RENEW_EVERY_S / self.tick_s))
        renewer = ClaimRenewerActor.start(
            database, self._server_claim, every, self._on_lease_lost, fail
        )
        launcher = self._launch if self.execute_runs else None
        self._scheduler = SchedulerActor.start(database, self.max_workers, launcher, fail)
        self._subscriptions = SubscriptionActor.start(database, fail)
        self._coordinators = CoordinatorEpochActor.start(fail)
        # Stop order (reverse of this list): database last.
        self._refs = [
            database,
            supervisor,
            renewer,
            self._scheduler,
            self._subscriptions,
            self._coordinators,
        ]
        self._ticker = Ticker(self.tick_s)
        for ref in (renewer, self._scheduler, self._subscriptions, supervisor):
            self._ticker.register(ref)

    def _start_listener(self) -> None:
        self._resolvers = ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="resolver")
        self._listener = ClientListener(
            self.socket_path, _Router(self), __version__, self._on_listener_crash
        )
        self._listener.start()
        assert self._ticker is not None
        self._ticker.start()

    def stop(self, reason: str = "stopped") -> None:
        """Stop gracefully: refuse new commands, wait for receipts, stop everything."""
        with self._stopping:
            if self._stopped.is_set():
                return
            self.stop_reason = self.stop_reason or reason
            self._accepting = False
            self._wait_in_flight()
            self._stop_launching()
            self._hand_back_runs()
            log.info("server stopping", extra={"action": "server.stopping", "reason": reason})
            self._teardown()
            self._stopped.set()

    def stop_async(self, reason: str) -> None:
        """Stop from a thread that must not block (an actor, the listener)."""
        threading.Thread(target=self.stop, args=(reason,), name="server-stop").start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stopped; True if it did within `timeout`."""
        return self._stopped.wait(timeout)

    @property
    def running(self) -> bool:
        """True between a successful start and the end of stop."""
        return self._accepting and not self._stopped.is_set()

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
            logging.getLogger("pi_workflows").removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None

    def _wake_scheduler(self) -> None:
        scheduler = self._scheduler
        if scheduler is not None:
            with contextlib.suppress(pykka.ActorDeadError):  # stopping: nothing to launch
                scheduler.tell(Wake())

    def _stop_launching(self) -> None:
        """Stop the scheduler before runs are handed back, so none is launched again.

        A launch it already asked for is claimed before the hand-back (the database
        actor keeps order), so the hand-back requeues that run too.
        """
        if self._scheduler is not None:
            with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                self._scheduler.stop(block=True, timeout=ACTOR_STOP_TIMEOUT_S)

    def _hand_back_runs(self) -> None:
        """Requeue every run a live runner holds, so the next server resumes it."""
        runners = self._runners
        if runners is None or self._database is None:
            return
        with contextlib.suppress(Exception):
            self.call_database(runners.hand_back_all, "runners.hand_back")

    def _release_epoch(self) -> None:
        claim = self._server_claim
        if claim is None or self._database is None:
            return

        supervisor = self._supervisor
        children_gone = supervisor is None or not supervisor.is_alive()

        def release(db: Database) -> None:
            with db.write() as tx:
                if children_gone:
                    # The process supervisor stopped: it killed and waited for every
                    # child, so no recorded process of this server is left to reap.
                    forget_recorded_processes(tx)
                release_server_epoch(tx, claim)

        with contextlib.suppress(Exception):
            self.call_database(release, "server.release")

    # --- runners -------------------------------------------------------------------------

    def _launch(self, row: QueueRow) -> None:
        """Scheduler launcher: claim the run, then spawn its runner (never blocks)."""
        runners, database = self._runners, self._database
        assert runners is not None and database is not None

        def prepared(reply: Reply) -> None:  # on the database actor's thread
            if reply.error is not None or reply.value is None:
                log.warning(
                    "could not claim a run for launch",
                    extra={
                        "action": "runner.launch_failed",
                        "run_id": row.run_id,
                        "reason": type(reply.error).__name__ if reply.error else "gone",
                    },
                )
                return
            crash_point("server.launch.after_commit")
            self._spawn_runner(reply.value)

        database.tell(
            Transact(lambda db: runners.prepare_launch(db, row.run_id), prepared, "runner.launch")
        )

    def _spawn_runner(self, plan: LaunchPlan) -> None:
        listener, supervisor, database = self._listener, self._supervisor, self._database
        runners = self._runners
        assert listener is not None and supervisor is not None and database is not None
        assert runners is not None
        server_end, runner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        epoch = plan.runner_epoch
        channel = _RunnerChannel(self, epoch)
        listener.attach_channel_nowait(server_end, channel, epoch)
        env = dict(os.environ)
        env[RUNNER_FD_ENV] = str(runner_end.fileno())
        env[LAUNCH_ENV] = dumps(plan.envelope).decode("utf-8")
        env[AGENT_DIR_ENV] = str(self.state_dir.parent)
        logs = self.state_dir / "logs" / "runners"
        ensure_private_dir(logs)

        def spawned(reply: Reply) -> None:  # on the supervisor's thread
            if reply.error is not None:
                log.error(
                    "runner spawn failed",
                    extra={"action": "runner.spawn_failed", "run_id": plan.envelope["runId"]},
                )
                database.tell(
                    Transact(
                        lambda db: runners.on_exit(db, epoch, 127, False),
                        lambda _: None,
                        "runner.exit",
                    )
                )
                return
            identity = reply.value
            crash_point("server.launch.after_spawn")
            database.tell(
                Transact(
                    lambda db: runners.spawned(db, epoch, identity),
                    lambda _: None,
                    "runner.spawned",
                )
            )

        def exited(child: ChildExited) -> None:  # on the supervisor's thread
            def after(reply: Reply) -> None:
                log.info(
                    "runner exited",
                    extra={
                        "action": "runner.exited",
                        "run_id": plan.envelope["runId"],
                        "reason": str(reply.value or reply.error),
                    },
                )
                self._wake_scheduler()

            def record_exit() -> None:
                database.tell(
                    Transact(
                        lambda db: runners.on_exit(db, epoch, child.returncode, child.killed),
                        after,
                        "runner.exit",
                    )
                )

            # The messages the runner wrote before it died go to the database first.
            if channel.defer_exit(record_exit) and not listener.end_channel_input_nowait(
                server_end
            ):
                channel.release_exit()  # the listener stopped: nothing reads the channel

        project = Path(plan.project_path) if plan.project_path else self.state_dir
        supervisor.tell(
            Spawn(
                [sys.executable, "-m", RUNNER_MODULE],
                env,
                spawned,
                exited,
                cwd=project if project.is_dir() else self.state_dir,
                log_path=logs / f"{epoch}.log",
                pass_fds=(runner_end.detach(),),
                preloaded=RUNNER_MODULE,
                fd_env=RUNNER_FD_ENV,
            )
        )

    def _on_runner_message(self, epoch: str, channel: Connection, message: dict[str, Any]) -> None:
        runners, database = self._runners, self._database
        if runners is None or database is None:
            return

        def answer(reply: Reply) -> None:
            if reply.error is not None:
                log.error(
                    "runner message failed", extra={"action": "runner.error"}, exc_info=reply.error
                )
                channel.close()
                return
            for frame in reply.value:
                if frame.get("kind") == "command":
                    crash_point("server.ready.before_command")
                channel.send(frame)

        database.tell(
            Transact(
                lambda db: runners.handle_message(db, epoch, message), answer, "runner.message"
            )
        )

    # --- database access for non-actor threads -----------------------------------------

    def call_database(self, work: Callable[[Database], Any], label: str) -> Any:
        """Run `work` on the database actor and wait for it (never from an actor)."""
        database = self._database
        assert database is not None

        def send(deliver: Callable[[Reply], None]) -> None:
            database.tell(Transact(work, deliver, label))

        return wait_reply(send, DB_CALL_TIMEOUT_S)

    # --- failures and idleness ----------------------------------------------------------

    def _on_actor_failure(self, name: str, exc: BaseException | None) -> None:
        reason = f"actor {name} failed ({type(exc).__name__ if exc else 'unknown'})"
        self.stop_async(reason)

    def _on_lease_lost(self, reason: str) -> None:
        self.stop_async(reason)

    def _on_listener_crash(self, exc: BaseException) -> None:
        self.stop_async(f"client listener failed ({type(exc).__name__})")

    def _watch(self) -> None:
        """Stop after `idle_exit_s` with no client, runner, queued run or unsettled work."""
        idle_since: float | None = None
        interval = max(self.tick_s, 0.05)
        while not self._stopped.wait(interval):
            if self._accepting:
                self._stop_overdue_runners()
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

    def _stop_overdue_runners(self) -> None:
        runners, supervisor = self._runners, self._supervisor
        if runners is None or supervisor is None:
            return
        try:
            late = self.call_database(runners.overdue, "runners.overdue")
        except Exception:  # noqa: BLE001 - checked again on the next round
            return
        for identity in late:
            supervisor.tell(StopChild(identity, RUNNER_GRACE_TICKS))

    def _is_idle(self) -> bool:
        if self._listener is None or self._listener.connection_count > 0:
            return False
        with self._in_flight_lock:
            if self._in_flight:
                return False
        try:
            return not self.call_database(server_has_work, "server.idle_check")
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


class _RunnerChannel:
    """Routes one runner's private channel to the database actor.

    **Ordering:** the runner's exit reaches the database actor only after every message
    the runner wrote before it died (a message sent just before a crash is committed or
    refused like any other, never lost to the exit). The exit waits for the channel's
    end of file, which the supervisor's exit report brings about (`exited` in
    `_spawn_runner` half-closes the channel).
    """

    def __init__(self, server: WorkflowServer, runner_epoch: str) -> None:
        self._server = server
        self._epoch = runner_epoch
        self._lock = threading.Lock()
        self._closed = False
        self._exit: Callable[[], None] | None = None

    def on_message(self, channel: Connection, message: dict[str, Any]) -> None:
        self._server._on_runner_message(self._epoch, channel, message)

    def on_close(self, channel: Connection) -> None:
        # The process exit decides the outcome, not the channel: closing only lets a
        # reported exit through, after the last message.
        self.release_exit()

    def defer_exit(self, record_exit: Callable[[], None]) -> bool:
        """Record the exit now if the channel is closed; else hold it for `on_close`.

        Returns True when it is held (the caller then ends the channel's input).
        """
        with self._lock:
            if not self._closed:
                self._exit = record_exit
                return True
        record_exit()
        return False

    def release_exit(self) -> None:
        """The channel delivered its last message: a held exit goes to the database."""
        with self._lock:
            self._closed = True
            held, self._exit = self._exit, None
        if held is not None:
            with contextlib.suppress(pykka.ActorDeadError):  # stopping: nothing to record
                held()


class _Router:
    """Routes requests from the listener's loop to actors; never blocks the loop."""

    def __init__(self, server: WorkflowServer) -> None:
        self._server = server

    def on_connect(self, connection: Connection) -> None:
        return None

    def on_disconnect(self, connection: Connection) -> None:
        server = self._server
        if server._subscriptions is not None:
            server._subscriptions.tell(ConnectionClosed(connection.connection_id))
        if server._coordinators is not None:
            server._coordinators.tell(ReleaseConnection(connection.connection_id))

    def on_request(self, connection: Connection, request: RequestMessage) -> None:
        server = self._server
        operation = request["operation"]
        if not server._begin_request():
            connection.respond(
                rejected(request, "unavailable", "serverStopping", "the server is stopping")
            )
            return
        try:
            self._dispatch(connection, request, operation)
        except BaseException:
            server._end_request()
            raise

    def _dispatch(self, connection: Connection, request: RequestMessage, operation: str) -> None:
        server = self._server
        if operation == "server.stop":
            connection.respond(response(request, "accepted", receipt={"state": "stopping"}))
            server._end_request()
            server.stop_async("stop requested")
            return
        if operation == "view.subscribe":
            self._subscribe(connection, request)
            return
        if operation == "run.start":
            self._start_run(connection, request)
            return
        if operation == "view.unsubscribe":
            self._unsubscribe(connection, request)
            return
        if operation not in READS and operation not in COMMANDS:
            connection.respond(
                rejected(request, "rejected", "unknownOperation", f"unknown operation {operation}")
            )
            server._end_request()
            return
        ctx = server._ctx
        assert ctx is not None and server._database is not None

        def reply(result: Reply) -> None:
            try:
                if result.error is not None:
                    log.error(
                        "operation failed",
                        extra={"action": "operation.error", "operation": operation},
                        exc_info=result.error,
                    )
                    connection.respond(
                        rejected(
                            request,
                            "unavailable",
                            "internalError",
                            "the server failed this request; retry it",
                        )
                    )
                else:
                    connection.respond(result.value)
                    if operation in COMMANDS:
                        server._wake_scheduler()
            finally:
                server._end_request()

        server._database.tell(
            Transact(lambda db: handle_operation(db, request, ctx), reply, operation)
        )

    def _start_run(self, connection: Connection, request: RequestMessage) -> None:
        """Resolve the source in a child (off every actor), then commit through the database."""
        server = self._server
        try:
            name, project, workflow_input = start_request_fields(request)
        except OperationError as exc:
            connection.respond(rejected(request, exc.outcome, exc.code, str(exc)))
            server._end_request()
            return
        ctx, database, pool = server._ctx, server._database, server._resolvers
        assert ctx is not None and database is not None and pool is not None

        def commit(resolved: dict[str, Any]) -> None:
            def reply(result: Reply) -> None:
                try:
                    if result.error is not None:
                        log.error(
                            "run.start failed",
                            extra={"action": "operation.error", "operation": "run.start"},
                            exc_info=result.error,
                        )
                        connection.respond(
                            rejected(
                                request,
                                "unavailable",
                                "internalError",
                                "the server failed this request; retry it",
                            )
                        )
                    else:
                        connection.respond(result.value)
                        server._wake_scheduler()
                finally:
                    server._end_request()

            database.tell(
                Transact(lambda db: start_run(db, request, ctx, resolved), reply, "run.start")
            )

        def resolve() -> None:
            try:
                resolved = resolve_start(
                    name, project, server.state_dir.parent, workflow_input, server._zygote
                )
            except Exception:
                log.exception("resolver failed", extra={"action": "resolver.error"})
                resolved = {
                    "ok": False,
                    "code": "definitionInvalid",
                    "message": "the workflow could not be loaded",
                }
            commit(resolved)

        pool.submit(resolve)

    def _subscribe(self, connection: Connection, request: RequestMessage) -> None:
        server = self._server
        try:
            kind = request["payload"].get("kind")
            if kind != "runList":
                connection.respond(
                    rejected(request, "rejected", "unknownView", "only the runList view exists yet")
                )
                return
            subscription_id = f"sub-{uuid.uuid4().hex[:12]}"
            assert server._subscriptions is not None
            connection.respond(
                response(request, "accepted", receipt={"subscriptionId": subscription_id})
            )
            server._subscriptions.tell(
                Subscribe(connection, subscription_id, "runList", build_run_list)
            )
        finally:
            server._end_request()

    def _unsubscribe(self, connection: Connection, request: RequestMessage) -> None:
        server = self._server
        subscription_id = request["payload"].get("subscriptionId")
        assert server._subscriptions is not None

        def reply(result: Reply) -> None:
            try:
                if result.value:
                    answer = response(
                        request, "accepted", receipt={"subscriptionId": subscription_id}
                    )
                else:
                    answer = rejected(
                        request, "notFound", "subscriptionNotFound", "no such subscription"
                    )
                connection.respond(answer)
            finally:
                server._end_request()

        server._subscriptions.tell(
            Unsubscribe(connection.connection_id, str(subscription_id), reply)
        )
