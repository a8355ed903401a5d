"""Client request routing: one dispatch table from operation to the actor that owns it.

Implements workflow-server.md § Live client protocol. The router runs on the listener's
event loop and never blocks it: each request is parsed once, then handed to the one
place that answers it (the database actor, the runner-host actor, the subscription
actor; for `run.start` the reader actor's receipt lookup, then a resolver thread).
Every request is answered exactly once, and the in-flight count (for a graceful stop's
receipts) follows that answer.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pykka

from pi_workflows._version import __version__
from pi_workflows.actors import (
    ChannelRequest,
    ClaimCoordinator,
    ConnectionClosed,
    ConnectionGone,
    Prune,
    Read,
    ReleaseConnection,
    Reply,
    RunCommand,
    ScanChannels,
    Submit,
    Subscribe,
    Transact,
    Unsubscribe,
    Wake,
)
from pi_workflows.domain import (
    COMMANDS,
    READS,
    RUNNER_COMMANDS,
    SNAPSHOT_READS,
    ActiveEpochs,
    CoordinatorGrant,
    OperationContext,
    OperationError,
    SessionAuthority,
    StartRequest,
    ViewSpec,
    add_follow_up_command,
    answer_decision_command,
    answer_from_session,
    clear_terminal_view,
    failure_response,
    handle_operation,
    internal_error,
    list_decisions,
    prior_answer,
    recover_channel,
    rejected,
    report_branch,
    report_turn,
    response,
    start_request_fields,
    start_run,
    update_interaction,
)
from pi_workflows.server._definition_cache import DefinitionCache
from pi_workflows.server._resolver import ResolverChildren, resolve_start
from pi_workflows.storage import run_view_revision
from pi_workflows.wire import Connection
from pi_workflows.wire.protocol import RequestMessage, client_operations

__all__ = ["DEFAULT_DRAIN_S", "Router", "RouterPorts"]

log = logging.getLogger(__name__)

OriginReport = Callable[..., dict[str, Any]]
"""`report_branch` or `report_turn`: (db, request, connection_id, epochs) -> response."""

DEFAULT_DRAIN_S = 30.0
"""How long a graceful stop lets applying effects and running shell commands settle."""
MAX_DRAIN_S = 3600.0
MAX_ID_CHARS = 256
"""The schema's bound on an opaque ID (`$defs/id`)."""


@dataclass(frozen=True)
class RouterPorts:
    """Where the router sends work; fixed once the server's actors have started."""

    context: OperationContext
    database: pykka.ActorRef[Any]
    reader: pykka.ActorRef[Any]
    """Answers `SNAPSHOT_READS` from its read-only connection, never behind a write."""
    runner_host: pykka.ActorRef[Any]
    scheduler: pykka.ActorRef[Any]
    subscriptions: pykka.ActorRef[Any]
    coordinators: pykka.ActorRef[Any]
    validations: pykka.ActorRef[Any]
    """Holds `interaction.submit` responses until the durable outcome."""
    resolvers: Executor
    agent_dir: Path
    resolver_children: ResolverChildren
    """Starts and kills resolver children through the process supervisor."""
    definitions: DefinitionCache
    """Resolver answers by source identity: a hit starts a run without a resolver child."""
    begin_request: Callable[[], bool]
    """False while the server is stopping: the request is refused."""
    end_request: Callable[[], None]
    stop: Callable[[str, float], None]
    """Asks for a graceful stop with a drain period (non-blocking)."""
    epochs: ActiveEpochs = field(default_factory=ActiveEpochs)
    """The coordinator epochs the coordinator actor publishes (origin-session reports)."""
    channels: pykka.ActorRef[Any] | None = None
    """The channel-adapter actor: `channel.status`, `channel.reload`."""
    state_prune: pykka.ActorRef[Any] | None = None
    """The state-prune actor: `state.prune`."""


@dataclass(eq=False)
class Pending:
    """One request waiting for its answer; `respond` answers it exactly once."""

    connection: Connection
    request: RequestMessage
    _done: Callable[[], None]
    _answered: bool = False

    @property
    def connection_id(self) -> str:
        return self.connection.connection_id

    @property
    def closed(self) -> bool:
        """The client is gone: an answer would be dropped."""
        return self.connection.closed

    def respond(self, answer: Mapping[str, Any]) -> None:
        if self._answered:
            return
        self._answered = True
        try:
            self.connection.respond(answer)
        finally:
            self._done()


class Router:
    """The listener's handler for client connections (runs on the listener's loop)."""

    def __init__(self, ports: RouterPorts) -> None:
        self._ports = ports
        table: dict[str, Callable[[Pending], None]] = {
            "server.stop": self._server_stop,
            "view.subscribe": self._subscribe,
            "view.unsubscribe": self._unsubscribe,
            "run.start": self._start_run,
            "interaction.submit": self._submit_interaction,
            "interaction.update": self._update_interaction,
            "followUp.add": self._add_follow_up,
            "decision.answer": self._answer_decision,
            "decision.list": self._list_decisions,
            "state.prune": self._state_prune,
            "workflowMessage.reportBranch": functools.partial(self._origin_report, report_branch),
            "workflowTurn.report": functools.partial(self._origin_report, report_turn),
            "sessionView.clearTerminal": functools.partial(
                self._origin_report, clear_terminal_view
            ),
            "channel.status": self._channel_request,
            "channel.reload": self._channel_request,
            "channel.recover": self._recover_channel,
        }
        for operation in (*READS, *COMMANDS):
            table.setdefault(operation, self._database_operation)
        table["run.answer"] = self._answer_checkpoint
        for operation in RUNNER_COMMANDS:
            table[operation] = self._runner_command
        for operation in SNAPSHOT_READS:
            table[operation] = self._snapshot_read
        self._table = table

    @property
    def operations(self) -> frozenset[str]:
        """Every operation the dispatch table routes; the rest are answered `rejected`."""
        return frozenset(self._table)

    def on_connect(self, connection: Connection) -> None:
        return None

    def on_disconnect(self, connection: Connection) -> None:
        ports = self._ports
        _tell(ports.subscriptions, ConnectionClosed(connection.connection_id))
        _tell(ports.coordinators, ReleaseConnection(connection.connection_id))
        _tell(ports.validations, ConnectionGone(connection.connection_id))

    def on_request(self, connection: Connection, request: RequestMessage) -> None:
        ports = self._ports
        if not ports.begin_request():
            connection.respond(
                rejected(request, "unavailable", "serverStopping", "the server is stopping")
            )
            return
        pending = Pending(connection, request, ports.end_request)
        route = self._table.get(request["operation"])
        if route is None:
            pending.respond(_unrouted(request))
            return
        try:
            route(pending)
        except Exception:
            log.exception("routing failed", extra={"action": "operation.error"})
            pending.respond(internal_error(request))

    # --- routes ------------------------------------------------------------------------

    def _database_operation(self, pending: Pending) -> None:
        ports = self._ports
        request = pending.request
        work = functools.partial(handle_operation, request=request, ctx=ports.context)
        done = functools.partial(self._answer, pending, request["operation"] in COMMANDS)
        ports.database.tell(Transact(work, done, request["operation"]))

    def _snapshot_read(self, pending: Pending) -> None:
        ports = self._ports
        request = pending.request
        work = functools.partial(handle_operation, request=request, ctx=ports.context)
        done = functools.partial(self._answer, pending, False)
        ports.reader.tell(Read(work, done, request["operation"]))

    def _runner_command(self, pending: Pending) -> None:
        ports = self._ports
        ports.runner_host.tell(RunCommand(pending.request, ports.context, pending))

    def _submit_interaction(self, pending: Pending) -> None:
        """Held until the durable outcome: the validations actor answers it."""
        self._ports.validations.tell(Submit(pending))

    def _update_interaction(self, pending: Pending) -> None:
        ports = self._ports
        work = functools.partial(
            update_interaction,
            request=pending.request,
            authority=SessionAuthority(pending.connection_id, ports.epochs),
        )
        done = functools.partial(self._answer, pending, False)
        ports.database.tell(Transact(work, done, "interaction.update"))

    def _add_follow_up(self, pending: Pending) -> None:
        ports = self._ports
        work = functools.partial(add_follow_up_command, request=pending.request)
        done = functools.partial(self._answer, pending, False)
        ports.database.tell(Transact(work, done, "followUp.add"))

    def _answer_decision(self, pending: Pending) -> None:
        """`decision.answer`: a person's answer to a protected decision (CLI or Pi); a
        commit that queued the continuation wakes the scheduler."""
        work = functools.partial(answer_decision_command, request=pending.request)
        done = functools.partial(self._answer, pending, True)
        self._ports.database.tell(Transact(work, done, "decision.answer"))

    def _list_decisions(self, pending: Pending) -> None:
        """`decision.list`: one read transaction on the reader actor."""
        work = functools.partial(list_decisions, request=pending.request)
        done = functools.partial(self._answer, pending, False)
        self._ports.reader.tell(Read(work, done, "decision.list"))

    def _answer_checkpoint(self, pending: Pending) -> None:
        """`run.answer`: a person's (the CLI's), or with `sessionId` and
        `coordinatorEpoch` the origin session coordinator's (the model's tool)."""
        payload = pending.request["payload"]
        if "sessionId" not in payload and "coordinatorEpoch" not in payload:
            self._database_operation(pending)
            return
        ports = self._ports
        work = functools.partial(
            answer_from_session,
            request=pending.request,
            ctx=ports.context,
            authority=SessionAuthority(pending.connection_id, ports.epochs),
        )
        done = functools.partial(self._answer, pending, True)
        ports.database.tell(Transact(work, done, "run.answer"))

    def _channel_request(self, pending: Pending) -> None:
        """`channel.status`, `channel.reload`: the channel-adapter actor answers (it owns
        the children's states; the counts come from the reader)."""
        channels = self._ports.channels
        if channels is None:
            pending.respond(_unrouted(pending.request))
            return
        channels.tell(ChannelRequest(pending))

    def _recover_channel(self, pending: Pending) -> None:
        """`channel.recover`: a command like `run.recover`; once durable, the channel
        actor looks for work (a retried attempt is sent by it, never here)."""
        ports = self._ports
        request = pending.request

        def done(result: Reply) -> None:
            self._answer(pending, False, result)
            if ports.channels is not None:
                _tell(ports.channels, ScanChannels())

        work = functools.partial(recover_channel, request=request, ctx=ports.context)
        ports.database.tell(Transact(work, done, request["operation"]))

    def _origin_report(self, report: OriginReport, pending: Pending) -> None:
        """A coordinator's branch or turn report: one transaction, which checks that this
        connection holds the session's active epoch."""
        ports = self._ports
        work = functools.partial(
            report,
            request=pending.request,
            connection_id=pending.connection_id,
            epochs=ports.epochs,
        )
        done = functools.partial(self._answer, pending, True)
        ports.database.tell(Transact(work, done, pending.request["operation"]))

    def _answer(self, pending: Pending, wake: bool, result: Reply) -> None:
        """On the database actor's thread: answer, then wake the scheduler for a command."""
        if result.error is not None:
            pending.respond(failure_response(pending.request, result.error))
            return
        pending.respond(result.value)
        if wake:
            _tell(self._ports.scheduler, Wake())

    def _state_prune(self, pending: Pending) -> None:
        """Chained through the reader (selection, backup) and database (one tree a
        unit) actors; answered once the receipt is stored (domain/_state_prune.py)."""
        if self._ports.state_prune is None:
            pending.respond(_unrouted(pending.request))
            return
        self._ports.state_prune.tell(Prune(pending))

    def _server_stop(self, pending: Pending) -> None:
        request = pending.request
        drain = request["payload"].get("drainSeconds", DEFAULT_DRAIN_S)
        if (
            isinstance(drain, bool)
            or not isinstance(drain, int | float)
            or not 0 <= drain <= MAX_DRAIN_S
        ):
            pending.respond(
                rejected(
                    request,
                    "rejected",
                    "drainInvalid",
                    f"drainSeconds must be a number from 0 to {MAX_DRAIN_S:.0f}",
                )
            )
            return
        pending.respond(
            response(request, "accepted", receipt={"state": "stopping", "drainSeconds": drain})
        )
        self._ports.stop("stop requested", float(drain))

    def _start_run(self, pending: Pending) -> None:
        """Look up the receipt, then resolve the source in a child (off every actor), then
        commit through the database.

        The receipt lookup comes first so that a retry of a handled start (adopted) or a
        reuse of its key with another payload (conflict) is answered from the reader
        actor's snapshot and runs no workflow code; the resolver cache is never asked.
        """
        request = pending.request
        try:
            start = start_request_fields(request)
        except OperationError as exc:
            pending.respond(rejected(request, exc.outcome, exc.code, str(exc)))
            return
        lookup = functools.partial(prior_answer, request=request)
        then = functools.partial(self._after_receipt_lookup, pending, start)
        self._ports.reader.tell(Read(lookup, then, "run.start.receipt"))

    def _after_receipt_lookup(self, pending: Pending, start: StartRequest, found: Reply) -> None:
        """On the reader's thread: answer from the stored receipt, or go on to resolve.

        A failed lookup is not an answer: the commit's own lookup, in its write
        transaction, still decides adopt or conflict. Never raises (a raising reply
        would stop the reader actor).
        """
        try:
            if found.error is None and found.value is not None:
                pending.respond(found.value)
                return
            if found.error is not None:
                log.warning(
                    "receipt lookup failed; resolving",
                    extra={"action": "operation.error", "operation": "run.start"},
                )
            self._ports.resolvers.submit(self._resolve_and_commit, pending, start)
        except Exception:  # the executor is shut down: the server is stopping
            log.exception("run.start not resolved", extra={"action": "operation.error"})
            with contextlib.suppress(Exception):
                pending.respond(internal_error(pending.request))

    def _resolve_and_commit(self, pending: Pending, start: StartRequest) -> None:
        """On a resolver thread: the cached answer, or the resolver child's; then the commit.

        The cache checks every file the definition depends on by its hash, so a hit is
        the answer the resolver would give (it runs no workflow code).
        """
        ports = self._ports
        name, project, agent_dir = start.workflow, start.project_path, ports.agent_dir
        try:
            resolved = ports.definitions.answer(name, project, agent_dir, start.input)
            if resolved is None:
                resolved = resolve_start(
                    name, project, agent_dir, start.input, ports.resolver_children
                )
                ports.definitions.store(name, project, agent_dir, resolved)
        except Exception:
            log.exception("resolver failed", extra={"action": "resolver.error"})
            resolved = {
                "ok": False,
                "code": "definitionInvalid",
                "message": "the workflow could not be loaded",
            }
        work = functools.partial(
            start_run, request=pending.request, ctx=ports.context, start=start, resolved=resolved
        )
        ports.database.tell(
            Transact(work, functools.partial(self._answer, pending, True), "run.start")
        )

    def _subscribe(self, pending: Pending) -> None:
        """`view.subscribe`: parse the view, check a run exists, then install it."""
        request = pending.request
        try:
            spec, revision = view_spec(request)
        except OperationError as exc:
            pending.respond(rejected(request, exc.outcome, exc.code, str(exc)))
            return
        if spec.kind == "sessionView" and pending.request["payload"].get("coordinator") is True:
            self._claim_coordinator(pending, spec)
            return
        if spec.run_id is None:
            self._install(pending, spec, revision)
            return
        run_id = spec.run_id

        def then(found: Reply) -> None:
            # On the reader's thread; never raises (a raising reply stops the reader).
            try:
                if found.error is not None:
                    pending.respond(failure_response(request, found.error))
                elif found.value is None:
                    pending.respond(
                        rejected(request, "notFound", "runNotFound", f"no run {run_id}")
                    )
                else:
                    self._install(pending, spec, revision)
            except Exception:
                log.exception("view.subscribe failed", extra={"action": "operation.error"})
                with contextlib.suppress(Exception):
                    pending.respond(internal_error(request))

        self._ports.reader.tell(
            Read(lambda db: run_view_revision(db, run_id), then, "view.subscribe")
        )

    def _claim_coordinator(self, pending: Pending, spec: ViewSpec) -> None:
        """A coordinator's session view: take the session's active epoch (fencing any
        other connection's), then install a view of its own that names the next message
        while that epoch stays active."""
        assert spec.session_id is not None
        connection_id = pending.connection_id

        def granted(reply: Reply) -> None:
            # On the coordinator actor's thread; never raises (that would stop it).
            try:
                if reply.error is not None or not isinstance(reply.value, CoordinatorGrant):
                    pending.respond(internal_error(pending.request))
                    return
                held = ViewSpec(
                    "sessionView",
                    session_id=spec.session_id,
                    connection_id=connection_id,
                    epoch=reply.value.epoch,
                )
                self._install(pending, held, None, epoch=reply.value.epoch)
            except Exception:
                log.exception("view.subscribe failed", extra={"action": "operation.error"})
                with contextlib.suppress(Exception):
                    pending.respond(internal_error(pending.request))

        self._ports.coordinators.tell(ClaimCoordinator(spec.session_id, connection_id, granted))

    def _install(
        self, pending: Pending, spec: ViewSpec, revision: int | None, *, epoch: int | None = None
    ) -> None:
        request = pending.request
        subscription_id = f"sub-{uuid.uuid4().hex[:12]}"

        def answer(installed: Reply) -> None:
            if installed.value:
                receipt: dict[str, Any] = {"subscriptionId": subscription_id, "kind": spec.kind}
                if epoch is not None:
                    receipt["coordinatorEpoch"] = epoch
                pending.respond(response(request, "accepted", receipt=receipt))
            else:
                pending.respond(
                    rejected(
                        request,
                        "rejected",
                        "tooManySubscriptions",
                        "this connection holds the most subscriptions allowed; unsubscribe one",
                    )
                )

        # A stopped actor raises here, and the request is answered `internal` (never left
        # unanswered: a graceful stop waits for every answer).
        self._ports.subscriptions.tell(
            Subscribe(pending.connection, subscription_id, spec, revision, answer)
        )

    def _unsubscribe(self, pending: Pending) -> None:
        """`view.unsubscribe`: removes a subscription of any kind by its ID."""
        request = pending.request
        subscription_id = request["payload"].get("subscriptionId")
        if not _bounded_id(subscription_id):
            pending.respond(
                rejected(
                    request, "rejected", "subscriptionIdInvalid", "subscriptionId must be an ID"
                )
            )
            return
        assert isinstance(subscription_id, str)

        def answer(result: Reply) -> None:
            if result.value:
                pending.respond(
                    response(request, "accepted", receipt={"subscriptionId": subscription_id})
                )
            else:
                pending.respond(
                    rejected(request, "notFound", "subscriptionNotFound", "no such subscription")
                )

        self._ports.subscriptions.tell(
            Unsubscribe(pending.connection.connection_id, subscription_id, answer)
        )


def view_spec(request: RequestMessage) -> tuple[ViewSpec, int | None]:
    """The view a `view.subscribe` names and the revision the client holds.

    Raises:
        OperationError: an unknown kind, a missing run ID, a bad session ID or revision.
    """
    payload = request["payload"]
    kind = payload.get("kind")
    revision = payload.get("revision")
    if revision is not None and (
        isinstance(revision, bool) or not isinstance(revision, int) or revision < 0
    ):
        raise OperationError("rejected", "revisionInvalid", "revision must be an integer >= 0")
    match kind:
        case "runList":
            return ViewSpec("runList"), None
        case "run":
            run_id = request.get("runId")
            if not _bounded_id(run_id):
                raise OperationError("rejected", "runIdRequired", "a run view needs a runId")
            return ViewSpec("run", run_id=run_id), revision
        case "sessionView":
            session_id = payload.get("sessionId")
            if not _bounded_id(session_id):
                raise OperationError(
                    "rejected",
                    "sessionIdInvalid",
                    f"sessionId must be a string of 1 to {MAX_ID_CHARS} printable characters",
                )
            return ViewSpec("sessionView", session_id=session_id), None
    raise OperationError("rejected", "unknownView", "kind must be runList, run or sessionView")


def _bounded_id(value: object) -> bool:
    """An opaque ID as the schema's `id`: 1 to 256 characters, no control characters."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_ID_CHARS
        and not any(ord(char) < 0x20 or ord(char) == 0x7F for char in value)
    )


def _unrouted(request: RequestMessage) -> dict[str, Any]:
    """The answer to an operation with no route: named, never a closed connection.

    The name is safe to echo: the listener lets a request through only if its operation
    is enumerated or matches the schema's grammar (letters and dots, at most 128).
    """
    operation = request["operation"]
    if operation in client_operations():
        return rejected(
            request,
            "rejected",
            "notImplemented",
            f"operation {operation} is not implemented yet in pi-workflows {__version__}",
        )
    return rejected(request, "rejected", "unknownOperation", f"unknown operation {operation}")


def _tell(ref: pykka.ActorRef[Any], message: Any) -> None:
    with contextlib.suppress(pykka.ActorDeadError):  # stopping: nothing left to tell
        ref.tell(message)
