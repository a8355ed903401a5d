"""Client request routing: one dispatch table from operation to the actor that owns it.

Implements workflow-server.md § Live client protocol. The router runs on the listener's
event loop and never blocks it: each request is parsed once, then handed to the one
place that answers it (the database actor, the runner-host actor, the subscription
actor; for `run.start` the reader actor's receipt lookup, then a resolver thread).
Every request is answered exactly once, and the in-flight count (for a graceful stop's
receipts) follows that answer. Answers of the actors come back to the loop as messages
(`Done`, to the router's loop address), so no router code runs on an actor's thread.
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
    Address,
    Backup,
    ChannelRequest,
    ClaimCoordinator,
    ConnectionClosed,
    ConnectionGone,
    Done,
    Prune,
    Read,
    ReleaseConnection,
    Reply,
    ReserveSubscription,
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
    RESOURCE_MANAGER_COMMANDS,
    RESOURCE_MANAGER_READS,
    RUNNER_COMMANDS,
    SNAPSHOT_READS,
    ActiveEpochs,
    AddFollowUp,
    AdoptRun,
    AnswerDecision,
    AnswerFromSession,
    ApplyResourceManager,
    ClearTerminalView,
    ClientOperation,
    CoordinatorGrant,
    ListDecisions,
    LookUpRestart,
    OperationContext,
    OperationError,
    PriorAnswer,
    RecordSessionEvents,
    RecoverChannel,
    ReportBranch,
    ReportTurn,
    ResourceManagerCommand,
    ResourceManagerRead,
    ResourceRef,
    RestartLookup,
    RestartRun,
    ResumeHeadless,
    RunViewRevision,
    SessionAuthority,
    StartRequest,
    StartRun,
    UpdateInteraction,
    ViewSpec,
    apply_spec,
    failure_response,
    internal_error,
    rejected,
    resource_ref,
    response,
    start_request_fields,
)
from pi_workflows.server._definition_cache import DefinitionCache
from pi_workflows.server._resolver import ResolverChildren, resolve_apply, resolve_start
from pi_workflows.wire import Connection
from pi_workflows.wire.protocol import RequestMessage, client_operations

__all__ = ["DEFAULT_DRAIN_S", "Router", "RouterPorts"]

log = logging.getLogger(__name__)

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
    loop: Callable[[Callable[[Any], None]], Address]
    """Makes the address on the listener's loop where the actors' answers come back."""
    epochs: ActiveEpochs = field(default_factory=ActiveEpochs)
    """The coordinator epochs the coordinator actor publishes (origin-session reports)."""
    channels: pykka.ActorRef[Any] | None = None
    """The channel-adapter actor: `channel.status`, `channel.reload`."""
    state_prune: pykka.ActorRef[Any] | None = None
    """The state-prune actor: `state.prune`."""
    state_backup: pykka.ActorRef[Any] | None = None
    """The state-backup actor: `state.backup`."""


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

    def offer_event(self, event: dict[str, Any]) -> None:
        """Offer a progress event of this request (the newest replaces one not yet sent)."""
        self.connection.offer_event(self.request["requestId"], event)


# --- tags: what an answer that comes back to the loop is about ---------------------------


@dataclass(frozen=True, slots=True)
class _Answer:
    """The unit's value is the response; a command's commit may wake the scheduler."""

    pending: Pending
    wake: bool


@dataclass(frozen=True, slots=True)
class _Recovered:
    """`channel.recover`'s answer; once durable, the channel actor looks for work."""

    pending: Pending


@dataclass(frozen=True, slots=True)
class _ReceiptLooked:
    """`run.start`'s receipt lookup: answer from it, or resolve the source."""

    pending: Pending
    start: StartRequest


@dataclass(frozen=True, slots=True)
class _ApplyLooked:
    """`resourceManager.apply`'s receipt lookup: answer from it, or resolve the manager."""

    pending: Pending
    ref: ResourceRef
    spec: Any


@dataclass(frozen=True, slots=True)
class _RestartLooked:
    """`run.restart`'s lookup: answer from it, or resolve the current source."""

    pending: Pending


@dataclass(frozen=True, slots=True)
class _RunFound:
    """`view.subscribe` of a run: whether the run exists."""

    pending: Pending
    spec: ViewSpec
    revision: int | None


@dataclass(frozen=True, slots=True)
class _Reserved:
    """A coordinator's `view.subscribe`: whether its subscription place is held."""

    pending: Pending
    spec: ViewSpec
    subscription_id: str


@dataclass(frozen=True, slots=True)
class _Granted:
    """A coordinator's `view.subscribe`: the session's epoch it was granted."""

    pending: Pending
    spec: ViewSpec
    subscription_id: str


@dataclass(frozen=True, slots=True)
class _Installed:
    """A subscription was installed (True) or refused for too many (False)."""

    pending: Pending
    subscription_id: str
    kind: str
    epoch: int | None


@dataclass(frozen=True, slots=True)
class _Unsubscribed:
    pending: Pending
    subscription_id: str


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
            "state.backup": self._state_backup,
            "workflowMessage.reportBranch": self._origin_report,
            "workflowTurn.report": self._origin_report,
            "sessionEvents.record": self._origin_report,
            "sessionView.clearTerminal": self._origin_report,
            "channel.status": self._channel_request,
            "channel.reload": self._channel_request,
            "channel.recover": self._recover_channel,
            "run.adopt": self._hand_over,
            "run.resumeHeadless": self._hand_over,
        }
        for operation in (*READS, *COMMANDS):
            table.setdefault(operation, self._database_operation)
        table["run.answer"] = self._answer_checkpoint
        table["run.restart"] = self._restart_run
        for operation in RUNNER_COMMANDS:
            table[operation] = self._runner_command
        for operation in RESOURCE_MANAGER_READS:
            table[operation] = self._resource_manager_read
        for operation in RESOURCE_MANAGER_COMMANDS:
            table[operation] = self._resource_manager_command
        table["resourceManager.apply"] = self._apply_resource
        for operation in SNAPSHOT_READS:
            table[operation] = self._snapshot_read
        self._table = table

    @functools.cached_property
    def _address(self) -> Address:
        """Where the actors' answers come back: `_on_done`, on the listener's loop."""
        return self._ports.loop(self._on_done)

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

    # --- answers, on the loop ----------------------------------------------------------

    def _on_done(self, message: Any) -> None:
        """An actor's answer, on the listener's loop: continue the request it names."""
        if not isinstance(message, Done):
            log.error("router got %s", type(message).__name__, extra={"action": "operation.error"})
            return
        tag, reply = message.tag, message.reply
        try:
            self._continue(tag, reply)
        except Exception:
            log.exception("answering failed", extra={"action": "operation.error"})
            pending = getattr(tag, "pending", None)
            if isinstance(pending, Pending):
                pending.respond(internal_error(pending.request))

    def _continue(self, tag: object, reply: Reply) -> None:
        match tag:
            case _Answer(pending=pending, wake=wake):
                self._answer(pending, wake, reply)
            case _Recovered(pending=pending):
                self._answer(pending, False, reply)
                if self._ports.channels is not None:
                    _tell(self._ports.channels, ScanChannels())
            case _ReceiptLooked(pending=pending, start=start):
                self._after_receipt_lookup(pending, start, reply)
            case _RestartLooked(pending=pending):
                self._after_restart_lookup(pending, reply)
            case _ApplyLooked():
                self._after_apply_lookup(tag, reply)
            case _RunFound(pending=pending, spec=spec, revision=revision):
                self._after_run_found(pending, spec, revision, reply)
            case _Reserved():
                self._after_reserve(tag, reply)
            case _Granted():
                self._after_grant(tag, reply)
            case _Installed():
                self._after_install(tag, reply)
            case _Unsubscribed(pending=pending, subscription_id=subscription_id):
                self._after_unsubscribe(pending, subscription_id, reply)
            case _:
                raise TypeError(f"router got an answer tagged {type(tag).__name__}")

    def _answer(self, pending: Pending, wake: bool, result: Reply) -> None:
        """Answer, then wake the scheduler for a command."""
        if isinstance(result.error, pykka.ActorDeadError):  # an actor stopped: so do we
            pending.respond(
                rejected(pending.request, "unavailable", "serverStopping", "the server is stopping")
            )
            return
        if result.error is not None:
            pending.respond(failure_response(pending.request, result.error))
            return
        pending.respond(result.value)
        if wake:
            _tell(self._ports.scheduler, Wake())

    def _write(self, unit: object, tag: object) -> None:
        self._ports.database.tell(Transact(unit, self._address, tag))

    def _read(self, unit: object, tag: object) -> None:
        self._ports.reader.tell(Read(unit, self._address, tag))

    # --- routes ------------------------------------------------------------------------

    def _database_operation(self, pending: Pending) -> None:
        request = pending.request
        unit = ClientOperation(request, self._ports.context)
        self._write(unit, _Answer(pending, request["operation"] in COMMANDS))

    def _snapshot_read(self, pending: Pending) -> None:
        self._read(ClientOperation(pending.request, self._ports.context), _Answer(pending, False))

    def _runner_command(self, pending: Pending) -> None:
        ports = self._ports
        ports.runner_host.tell(RunCommand(pending.request, ports.context, pending))

    def _submit_interaction(self, pending: Pending) -> None:
        """Held until the durable outcome: the validations actor answers it."""
        self._ports.validations.tell(Submit(pending))

    def _authority(self, pending: Pending) -> SessionAuthority:
        return SessionAuthority(pending.connection_id, self._ports.epochs)

    def _update_interaction(self, pending: Pending) -> None:
        unit = UpdateInteraction(pending.request, self._authority(pending))
        self._write(unit, _Answer(pending, False))

    def _add_follow_up(self, pending: Pending) -> None:
        self._write(AddFollowUp(pending.request), _Answer(pending, False))

    def _answer_decision(self, pending: Pending) -> None:
        """`decision.answer`: a person's answer to a protected decision (CLI or Pi); a
        commit that queued the continuation wakes the scheduler."""
        self._write(AnswerDecision(pending.request), _Answer(pending, True))

    def _list_decisions(self, pending: Pending) -> None:
        """`decision.list`: one read transaction on the reader actor."""
        self._read(ListDecisions(pending.request), _Answer(pending, False))

    def _answer_checkpoint(self, pending: Pending) -> None:
        """`run.answer`: a person's (the CLI's), or with `sessionId` and
        `coordinatorEpoch` the origin session coordinator's (the model's tool)."""
        payload = pending.request["payload"]
        if "sessionId" not in payload and "coordinatorEpoch" not in payload:
            self._database_operation(pending)
            return
        unit = AnswerFromSession(pending.request, self._ports.context, self._authority(pending))
        self._write(unit, _Answer(pending, True))

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
        self._write(RecoverChannel(pending.request, self._ports.context), _Recovered(pending))

    def _hand_over(self, pending: Pending) -> None:
        """`run.adopt`, `run.resumeHeadless`: a command whose transaction reads the
        coordinator epochs (an origin session open in a Pi keeps its run); a commit that
        put the run back in the admission line wakes the scheduler."""
        request, ports = pending.request, self._ports
        unit: AdoptRun | ResumeHeadless
        if request["operation"] == "run.adopt":
            unit = AdoptRun(request, ports.context, ports.epochs)
        else:
            unit = ResumeHeadless(request, ports.context, ports.epochs)
        self._write(unit, _Answer(pending, True))

    def _origin_report(self, pending: Pending) -> None:
        """A coordinator's branch or turn report, or its terminal-view clear: one
        transaction, which checks that this connection holds the session's active epoch."""
        report = _ORIGIN_REPORTS[pending.request["operation"]]
        unit = report(pending.request, pending.connection_id, self._ports.epochs)
        self._write(unit, _Answer(pending, True))

    def _state_prune(self, pending: Pending) -> None:
        """Chained through the reader (selection, backup) and database (one tree a
        unit) actors by the state-prune actor; answered once the receipt is stored."""
        if self._ports.state_prune is None:
            pending.respond(_unrouted(pending.request))
            return
        self._ports.state_prune.tell(Prune(pending))

    def _state_backup(self, pending: Pending) -> None:
        """Copied by the state-backup actor on its own read connection; answered once
        the receipt is stored, also when the client went away meanwhile."""
        if self._ports.state_backup is None:
            pending.respond(_unrouted(pending.request))
            return
        self._ports.state_backup.tell(Backup(pending))

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
        self._read(PriorAnswer(request), _ReceiptLooked(pending, start))

    def _after_receipt_lookup(self, pending: Pending, start: StartRequest, found: Reply) -> None:
        """Answer from the stored receipt, or go on to resolve.

        A failed lookup is not an answer: the commit's own lookup, in its write
        transaction, still decides adopt or conflict.
        """
        if found.error is None and found.value is not None:
            pending.respond(found.value)
            return
        if found.error is not None:
            log.warning(
                "receipt lookup failed; resolving",
                extra={"action": "operation.error", "operation": "run.start"},
            )
        try:
            self._ports.resolvers.submit(self._resolve_and_commit, pending, start)
        except RuntimeError:  # the executor is shut down: the server is stopping
            pending.respond(
                rejected(pending.request, "unavailable", "serverStopping", "the server is stopping")
            )

    def _resolve_and_commit(self, pending: Pending, start: StartRequest) -> None:
        """On a resolver thread: resolve, then the commit (whose answer comes back to the
        loop)."""
        unit = StartRun(pending.request, self._ports.context, start, self._resolve(start))
        self._commit_resolved(pending, unit)

    def _resolve(self, start: StartRequest) -> dict[str, Any]:
        """On a resolver thread: the cached answer, or the resolver child's.

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
        return resolved

    def _commit_resolved(self, pending: Pending, unit: StartRun | RestartRun) -> None:
        try:
            self._write(unit, _Answer(pending, True))
            # Woken now, not only after the answer: the admission round's unit then
            # reaches the database while the start still runs, joins its group commit
            # and claims the run in the same COMMIT when a slot is free (one commit less
            # on a run's way). It runs after the start (the database keeps order); the
            # wake after the answer covers a round that came too late.
            _tell(self._ports.scheduler, Wake())
        except pykka.ActorDeadError:  # the server is stopping
            self._address.tell(Done(_Answer(pending, False), Reply(error=_stopping())))

    def _resource_manager_read(self, pending: Pending) -> None:
        """`resourceManager.list|get`: one read transaction on the reader actor."""
        unit = ResourceManagerRead(pending.request, self._ports.context)
        self._read(unit, _Answer(pending, False))

    def _resource_manager_command(self, pending: Pending) -> None:
        """`resourceManager.reconcile|delete`: a command on the database actor; its
        commit may make a key due, so the scheduler is woken."""
        unit = ResourceManagerCommand(pending.request, self._ports.context)
        self._write(unit, _Answer(pending, True))

    def _apply_resource(self, pending: Pending) -> None:
        """`resourceManager.apply`: check the request, look up its receipt, resolve the
        manager in a resolver child (the server never loads manager code), then commit
        after the server's source check (`ApplyResourceManager`)."""
        request = pending.request
        try:
            ref = resource_ref(request, self._ports.context)
            spec = apply_spec(request)
        except OperationError as exc:
            pending.respond(rejected(request, exc.outcome, exc.code, str(exc)))
            return
        self._read(PriorAnswer(request), _ApplyLooked(pending, ref, spec))

    def _after_apply_lookup(self, tag: _ApplyLooked, found: Reply) -> None:
        pending = tag.pending
        if found.error is None and found.value is not None:
            pending.respond(found.value)
            return
        try:
            self._ports.resolvers.submit(self._resolve_and_apply, pending, tag.ref, tag.spec)
        except RuntimeError:  # the executor is shut down: the server is stopping
            pending.respond(
                rejected(pending.request, "unavailable", "serverStopping", "the server is stopping")
            )

    def _resolve_and_apply(self, pending: Pending, ref: ResourceRef, spec: Any) -> None:
        """On a resolver thread: the resolver child's proposal, then the commit."""
        ports = self._ports
        try:
            resolved = resolve_apply(
                ref.manager, ref.discovery_project, ports.agent_dir, spec, ports.resolver_children
            )
        except Exception:
            log.exception("resolver failed", extra={"action": "resolver.error"})
            resolved = {
                "ok": False,
                "code": "definitionInvalid",
                "message": "the resource manager could not be loaded",
            }
        unit = ApplyResourceManager(pending.request, ports.context, resolved)
        try:
            self._write(unit, _Answer(pending, True))
        except pykka.ActorDeadError:  # the server is stopping
            self._address.tell(Done(_Answer(pending, False), Reply(error=_stopping())))

    def _restart_run(self, pending: Pending) -> None:
        """`run.restart`: look up the receipt and the finished run on the reader, resolve
        the workflow's current source in a child (off every actor), then commit.

        A restart runs the source as it is now, resolved the way `run.start` resolves
        it; the server never imports workflow code.
        """
        self._read(LookUpRestart(pending.request), _RestartLooked(pending))

    def _after_restart_lookup(self, pending: Pending, found: Reply) -> None:
        if found.error is not None:
            pending.respond(failure_response(pending.request, found.error))
            return
        lookup = found.value
        assert isinstance(lookup, RestartLookup)
        if lookup.answer is not None:
            pending.respond(lookup.answer)
            return
        try:
            self._ports.resolvers.submit(self._resolve_and_restart, pending, lookup.source)
        except RuntimeError:  # the executor is shut down: the server is stopping
            pending.respond(
                rejected(pending.request, "unavailable", "serverStopping", "the server is stopping")
            )

    def _resolve_and_restart(self, pending: Pending, source: StartRequest | None) -> None:
        """On a resolver thread: the current source (none to resolve when the run is
        missing or unfinished: the commit refuses it), then the commit."""
        resolved = None if source is None else self._resolve(source)
        self._commit_resolved(pending, RestartRun(pending.request, self._ports.context, resolved))

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
        self._read(RunViewRevision(spec.run_id), _RunFound(pending, spec, revision))

    def _after_run_found(
        self, pending: Pending, spec: ViewSpec, revision: int | None, found: Reply
    ) -> None:
        request = pending.request
        if found.error is not None:
            pending.respond(failure_response(request, found.error))
        elif found.value is None:
            pending.respond(rejected(request, "notFound", "runNotFound", f"no run {spec.run_id}"))
        else:
            self._install(pending, spec, revision)

    def _claim_coordinator(self, pending: Pending, spec: ViewSpec) -> None:
        """A coordinator's session view: hold a subscription place first, then take the
        session's active epoch (fencing any other connection's), then install a view of
        its own in that place that names the next message while that epoch stays active.

        Every refusal comes before the epoch moves: a malformed view (`view_spec`) and a
        connection with too many subscriptions (the place) change nothing, so the active
        coordinator stays active. Once the place is held the install cannot be refused.
        """
        subscription_id = f"sub-{uuid.uuid4().hex[:12]}"
        tag = _Reserved(pending, spec, subscription_id)
        self._ports.subscriptions.tell(
            ReserveSubscription(pending.connection_id, subscription_id, self._address, tag)
        )

    def _after_reserve(self, tag: _Reserved, reserved: Reply) -> None:
        pending, spec = tag.pending, tag.spec
        if reserved.error is not None:
            pending.respond(internal_error(pending.request))
            return
        if not reserved.value:
            pending.respond(_too_many_subscriptions(pending.request))
            return
        assert spec.session_id is not None
        granted = _Granted(pending, spec, tag.subscription_id)
        claim = ClaimCoordinator(spec.session_id, pending.connection_id, self._address, granted)
        self._ports.coordinators.tell(claim)

    def _after_grant(self, tag: _Granted, reply: Reply) -> None:
        pending, spec = tag.pending, tag.spec
        if reply.error is not None or not isinstance(reply.value, CoordinatorGrant):
            # Give the held place back (no answer wanted).
            _tell(
                self._ports.subscriptions,
                Unsubscribe(pending.connection_id, tag.subscription_id),
            )
            pending.respond(internal_error(pending.request))
            return
        held = ViewSpec(
            "sessionView",
            session_id=spec.session_id,
            connection_id=pending.connection_id,
            epoch=reply.value.epoch,
        )
        self._install(
            pending, held, None, epoch=reply.value.epoch, subscription_id=tag.subscription_id
        )

    def _install(
        self,
        pending: Pending,
        spec: ViewSpec,
        revision: int | None,
        *,
        epoch: int | None = None,
        subscription_id: str | None = None,
    ) -> None:
        """Install a subscription (in its reserved place when `subscription_id` names one)."""
        if subscription_id is None:
            subscription_id = f"sub-{uuid.uuid4().hex[:12]}"
        tag = _Installed(pending, subscription_id, spec.kind, epoch)
        # A stopped actor raises here, and the request is answered `internal` (never left
        # unanswered: a graceful stop waits for every answer).
        self._ports.subscriptions.tell(
            Subscribe(pending.connection, subscription_id, spec, revision, self._address, tag)
        )

    def _after_install(self, tag: _Installed, installed: Reply) -> None:
        request = tag.pending.request
        if installed.value:
            receipt: dict[str, Any] = {"subscriptionId": tag.subscription_id, "kind": tag.kind}
            if tag.epoch is not None:
                receipt["coordinatorEpoch"] = tag.epoch
            tag.pending.respond(response(request, "accepted", receipt=receipt))
        else:
            tag.pending.respond(_too_many_subscriptions(request))

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
        tag = _Unsubscribed(pending, subscription_id)
        self._ports.subscriptions.tell(
            Unsubscribe(pending.connection.connection_id, subscription_id, self._address, tag)
        )

    def _after_unsubscribe(self, pending: Pending, subscription_id: str, result: Reply) -> None:
        request = pending.request
        if result.value:
            pending.respond(
                response(request, "accepted", receipt={"subscriptionId": subscription_id})
            )
        else:
            pending.respond(
                rejected(request, "notFound", "subscriptionNotFound", "no such subscription")
            )


_OriginReport = ReportBranch | ReportTurn | RecordSessionEvents | ClearTerminalView
_ORIGIN_REPORTS: Mapping[str, Callable[[RequestMessage, str, ActiveEpochs], _OriginReport]] = {
    "workflowMessage.reportBranch": ReportBranch,
    "workflowTurn.report": ReportTurn,
    "sessionEvents.record": RecordSessionEvents,
    "sessionView.clearTerminal": ClearTerminalView,
}
"""The unit of each origin-session operation (request, connection ID, epochs)."""


def _too_many_subscriptions(request: RequestMessage) -> dict[str, Any]:
    return rejected(
        request,
        "rejected",
        "tooManySubscriptions",
        "this connection holds the most subscriptions allowed; unsubscribe one",
    )


def _stopping() -> Exception:
    return pykka.ActorDeadError("the server is stopping")


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
