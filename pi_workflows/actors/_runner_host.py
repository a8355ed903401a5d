"""The runner-host actor: owns every live runner epoch of this server.

Implements workflow-server.md § Runner lifecycle, § Runner protocol, § Pause and
cancellation and § Failure classification, server side. It launches admitted runs,
handles the ready handshake, passes runner frames to the database actor and their
replies back, enforces the startup and node deadlines on `Tick`, applies the exit
policy when a runner is reaped, fences runners after pause and cancel, and drains them
at a graceful stop. It never touches SQLite (units of work go to the database actor as
`Transact`) and never signals a process (the process supervisor does); its runners'
channels are a `ChildChannels` of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Address, Done, Reply, ServerActor, answer
from pi_workflows.actors._database import Transact
from pi_workflows.actors._retention import RequestSweep
from pi_workflows.actors._scheduler import Launch, Wake
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import (
    FENCING_COMMANDS,
    LAUNCH_IN_FLIGHT,
    ApplyRunnerMessage,
    Barrier,
    ClientOperation,
    Delta,
    ExitFacts,
    HandBackRun,
    Handled,
    LaunchPlan,
    OperationContext,
    RecordRunnerExit,
    RecordSpawn,
    RunnerView,
    failure_response,
    reply_to,
)
from pi_workflows.engine import Limits, limits_env
from pi_workflows.storage import Clock, ensure_private_dir
from pi_workflows.supervision import (
    ChannelListener,
    ChildChannelClosed,
    ChildChannels,
    ChildEnded,
    ChildExited,
    ChildFrame,
    ChildSpec,
    ChildStarted,
    FrameSink,
    ProcessIdentity,
    StopGroup,
    crash_point,
)
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.protocol import RequestMessage
from pi_workflows.wire.runner import RunnerAddress, RunnerMessage, RunnerReply

__all__ = [
    "AGENT_DIR_ENV",
    "LAUNCH_ENV",
    "RUNNER_FD_ENV",
    "RUNNER_GRACE_TICKS",
    "RUNNER_MODULE",
    "STARTUP_DEADLINE_MS",
    "STATE_DIR_ENV",
    "ActiveRunner",
    "ConnectRetention",
    "ConnectScheduler",
    "Drain",
    "HandBack",
    "Launch",
    "RunCommand",
    "RunnerHostActor",
    "RunnerHostConfig",
    "refuse_frame",
]

log = logging.getLogger(__name__)

STARTUP_DEADLINE_MS = 20_000
"""A runner must send `runner.ready` this long after its launch was recorded."""
LAUNCH_WAIT_MS = 2_000
"""How long a command refused for want of a launch's claim waits for the launch."""
RUNNER_GRACE_TICKS = 40
"""SIGTERM to SIGKILL grace for a runner group, in ticks (10 s at the default tick)."""
RUNNER_FD_ENV = "PI_WORKFLOWS_RUNNER_FD"
LAUNCH_ENV = "PI_WORKFLOWS_LAUNCH"
AGENT_DIR_ENV = "PI_WORKFLOWS_AGENT_DIR"
STATE_DIR_ENV = "PI_WORKFLOWS_STATE_DIR"
"""The server's state folder, for a runner's private per-step files (pi's bridge config
and stderr log); popped by the runner like the agent folder."""
RUNNER_MODULE = "pi_workflows.engine.runner"


# --- messages ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunnerHostConfig:
    """Facts the runner host needs to launch runners; fixed for one server."""

    owner_id: str
    state_dir: Path
    agent_dir: Path
    clock: Clock
    env: Mapping[str, str] = field(repr=False, default_factory=lambda: dict(os.environ))
    """The base environment of every runner (may hold credentials: never logged)."""
    default_limits: Limits = field(default_factory=Limits)
    """The server default `memory_mb` and `processes` of every node that sets none."""


@dataclass(frozen=True, slots=True)
class ConnectRetention:
    """Tell the retention actor after each runner's exit is recorded (a sweep trigger)."""

    retention: pykka.ActorRef[Any]


@dataclass(frozen=True, slots=True)
class ConnectScheduler:
    """Where to send `Wake` when a slot frees (the scheduler starts after this actor)."""

    scheduler: pykka.ActorRef[Any]


class Responder(Protocol):
    """Where a client command's response goes (the router's handle on one request)."""

    def respond(self, response: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class RunCommand:
    """A client command on a run that may hold a live runner (`run.pause`, `run.resume`,
    `run.cancel`): it presents that runner's claim, and a committed pause or cancel
    fences the runner before the client hears the answer."""

    request: RequestMessage
    context: OperationContext
    responder: Responder


@dataclass(frozen=True, slots=True)
class _CommandDone:
    """Tag: a client command's unit of work."""

    request: RequestMessage
    context: OperationContext
    responder: Responder
    presented_claim: bool
    """The command presented a live runner's claim (False: none was known)."""
    retried: bool


@dataclass(slots=True)
class _AwaitingLaunch:
    """A command answered `claimLost` while no runner of its run was known: the
    scheduler's admission had claimed the run and its `Launch` was still on the way.
    It is sent once more when the launch arrives, or at `until`."""

    request: RequestMessage
    context: OperationContext
    responder: Responder
    until: int


@dataclass(frozen=True, slots=True)
class Drain:
    """Graceful stop, part one: hand runs back at their next durable boundary.

    `reply_to` is told `Done` once no runner of this server is left.
    """

    reply_to: Address


@dataclass(frozen=True, slots=True)
class HandBack:
    """Graceful stop, part two (the drain period ended): hand back every run still held."""

    reply_to: Address
    """Told `Done` with the number of runs handed back, once their hand-backs committed."""


@dataclass(frozen=True, slots=True)
class _Applied:
    """Tag: one runner frame's unit of work."""

    runner_epoch: str
    channel: FrameSink


@dataclass(frozen=True, slots=True)
class _ExitRecorded:
    """Tag: a runner's recorded outcome."""

    runner_epoch: str
    run_id: str


@dataclass(frozen=True, slots=True)
class _Recorded:
    """Tag: a unit whose answer only needs logging (a spawn record, a hand-back)."""

    runner_epoch: str


@dataclass(frozen=True, slots=True)
class _HandedBackAll:
    """Tag: the barrier after every hand-back of `HandBack`."""

    reply_to: Address


# --- state -------------------------------------------------------------------------------


@dataclass
class ActiveRunner:
    """One launched runner generation, as the server knows it. Internal."""

    plan: LaunchPlan
    identity: ProcessIdentity | None = None
    ready: bool = False
    settled: bool = False
    """True once the run left `running` through this runner, or a command fenced it."""
    claim_lost: bool = False
    stop_requested: bool = False
    timed_out_attempt: str | None = None
    """The attempt whose node deadline passed, if that is why the runner was stopped."""
    attempt: tuple[str, str, int | None] | None = None
    """The running attempt: (attempt ID, node kind, deadline_at)."""
    effect_open: bool = False
    registered: dict[int, ProcessIdentity] = field(default_factory=dict)
    """Process groups the runner registered (its shell commands), by PID."""
    offered: set[str] = field(default_factory=set)
    """Digests of the content references sent to this runner: all it may `content.read`."""
    in_flight: int = 0
    """Frames sent to the database and not answered yet."""
    ended: ChildEnded | None = None
    """The runner was reaped and its channel reached end of file (`ChildChannels`)."""
    held: list[ChildFrame] = field(default_factory=list)
    """Frames that came before the spawn was reported (a pre-forked runner can connect
    before the supervisor's reply): applied after its identity is queued for commit."""

    @property
    def finished(self) -> bool:
        """Reaped, and every frame it sent before it died has been applied.

        The exit report and the runner's last frames travel different paths (the
        supervisor, the listener), so the outcome waits for the channel's end of file
        and its answers: a `run.finished` sent just before exit is never lost as stale.
        """
        return self.ended is not None and self.in_flight == 0

    @property
    def returncode(self) -> int:
        """The runner's exit code, or 127 when it never started."""
        exited = self.ended.exited if self.ended is not None else None
        return exited.returncode if exited is not None else 127

    @property
    def run_id(self) -> str:
        return self.plan.run_id

    def view(self, draining: bool) -> RunnerView:
        return RunnerView(
            self.plan.run_id,
            self.plan.runner_epoch,
            self.plan.claim,
            self.plan.command,
            self.identity,
            frozenset(self.offered),
            draining,
        )

    def facts(self) -> ExitFacts:
        return ExitFacts(
            self.plan.run_id,
            self.plan.runner_epoch,
            self.plan.claim,
            self.settled,
            self.stop_requested,
            self.claim_lost,
            self.timed_out_attempt,
        )

    def apply(self, delta: Delta) -> None:
        """Take in what one accepted (or refused) message changed."""
        self.ready |= delta.ready
        self.settled |= delta.settled
        self.claim_lost |= delta.claim_lost
        self.offered |= delta.offered
        if delta.started is not None:
            self.attempt = delta.started
        if delta.attempt_ended:
            self.attempt = None
        if delta.effect_open is not None:
            self.effect_open = delta.effect_open
        if delta.registered is not None:
            self.registered[delta.registered.pid] = delta.registered
        if delta.unregistered is not None:
            self.registered.pop(delta.unregistered, None)

    @property
    def at_boundary(self) -> bool:
        """Nothing external is in flight: handing the run back now repeats nothing."""
        return not self.effect_open and not self.registered


class RunnerHostActor(ServerActor):
    """Owns: every live runner epoch (`ActiveRunner`), its child channel (`ChildChannels`),
    the drain state.

    Receives: `Launch`, `ChildFrame`, `ChildChannelClosed`, `ChildExited`, `RunCommand`,
        `Tick`, `Drain`, `HandBack`, `ConnectScheduler`, and `Done` (its units' and its
        spawns' answers).
    Sends: `Transact` to the database actor; `Spawn` (through its `ChildChannels`),
        `StopChild`, `StopGroup` to the process supervisor; frames to runner channels;
        `Wake` to the scheduler.
    Invariants: a frame is answered only after its write committed; a fenced or settled
        runner's frames are answered `claimLost` without touching the database; every
        runner launched gets one recorded outcome, after every frame it sent was applied.
    On failure: reported to the server, which stops; runners end with the zygote and
        recovery hands their runs back.
    """

    name = "runner-host"

    def __init__(
        self,
        config: RunnerHostConfig,
        database: pykka.ActorRef[Any],
        supervisor: pykka.ActorRef[Any],
        listener: ChannelListener,
        on_actor_failure: ActorFailureHandler,
    ) -> None:
        super().__init__(on_actor_failure)
        self._config = config
        self._database = database
        self._supervisor = supervisor
        self._listener = listener
        self._scheduler: pykka.ActorRef[Any] | None = None
        self._retention: pykka.ActorRef[Any] | None = None
        self._active: dict[str, ActiveRunner] = {}
        self._children: ChildChannels | None = None
        """Made in `on_start`, once this actor's own address exists."""
        self._draining = False
        self._drained: list[Address] = []
        self._awaiting_launch: dict[str, list[_AwaitingLaunch]] = {}
        """Commands held for a launch in flight, by run ID."""

    def on_start(self) -> None:
        self._children = ChildChannels(
            self.actor_ref, self._supervisor, self._listener, decode=RunnerMessage.from_wire
        )

    def on_stop(self) -> None:
        """The server stops: every runner channel ends (the supervisor kills the rest)."""
        self._channels.close()

    @property
    def _channels(self) -> ChildChannels:
        assert self._children is not None
        return self._children

    def on_receive(self, message: Any) -> Any:
        match message:
            case Done():
                self._on_done(message)
            case ChildFrame():
                self._on_frame(message)
            case ChildExited() | ChildChannelClosed():
                self._on_child_events(message)
            case Launch(plan=plan):
                self._launch(plan)
            case RunCommand(request=request, context=context, responder=responder):
                self._command(request, context, responder)
            case Tick():
                self._on_tick()
            case Drain(reply_to=reply_to):
                self._drain(reply_to)
            case HandBack(reply_to=reply_to):
                self._hand_back_all(reply_to)
            case ConnectScheduler(scheduler=scheduler):
                self._scheduler = scheduler
            case ConnectRetention(retention=retention):
                self._retention = retention
            case _:
                raise TypeError(f"runner host got {type(message).__name__}")
        return None

    def _on_done(self, done: Done) -> None:
        """An answer: to a unit of work (its tag says which), or to a spawn."""
        match done.tag:
            case _Applied(runner_epoch=epoch, channel=channel):
                self._on_applied(epoch, channel, done.reply)
            case _CommandDone():
                self._command_done(done.tag, done.reply)
            case _ExitRecorded(run_id=run_id):
                self._on_exit_recorded(run_id, done.reply)
            case _HandedBackAll(reply_to=reply_to):
                answer(reply_to, None, done.reply)
            case _Recorded():
                pass
            case _:
                self._on_child_events(done)

    def _on_child_events(self, message: object) -> None:
        for event in self._channels.handle(message):
            match event:
                case ChildStarted(key=epoch, identity=identity):
                    self._on_spawned(epoch, identity)
                case ChildEnded(key=epoch):
                    self._on_ended(epoch, event)

    # --- launch ----------------------------------------------------------------------------

    def _transact(self, unit: object, tag: object, *, client: bool = False) -> None:
        """Send a unit of work. A runner's messages, spawns and exits wait out a full disk
        in order (`hold_when_full`); a client's command is refused at once instead."""
        self._database.tell(Transact(unit, self.actor_ref, tag, hold_when_full=not client))

    def _launch(self, plan: LaunchPlan) -> None:
        crash_point("server.launch.after_commit")
        runner = ActiveRunner(plan)
        self._active[plan.runner_epoch] = runner
        for held in self._awaiting_launch.pop(plan.run_id, []):
            self._command(held.request, held.context, held.responder, retried=True)
        if self._draining:
            self._hand_back(runner)  # claimed just before the stop: the next server runs it
            self._check_drained()
            return
        self._spawn(plan)

    def _spawn(self, plan: LaunchPlan) -> None:
        config = self._config
        env = dict(config.env)
        env[LAUNCH_ENV] = dumps(plan.envelope).decode("utf-8")
        env[AGENT_DIR_ENV] = str(config.agent_dir)
        env[STATE_DIR_ENV] = str(config.state_dir)
        env.update(limits_env(config.default_limits))
        logs = config.state_dir / "logs" / "runners"
        ensure_private_dir(logs)
        project = Path(plan.project_path) if plan.project_path else config.state_dir
        self._channels.start(
            ChildSpec(
                plan.runner_epoch,
                [sys.executable, "-m", RUNNER_MODULE],
                env,
                RUNNER_FD_ENV,
                cwd=project if project.is_dir() else config.state_dir,
                log_path=logs / f"{plan.runner_epoch}.log",
                preloaded=RUNNER_MODULE,
                name=plan.runner_epoch,
            )
        )

    def _on_spawned(self, epoch: str, identity: ProcessIdentity) -> None:
        runner = self._active.get(epoch)
        if runner is None:
            return
        runner.identity = identity
        crash_point("server.launch.after_spawn")
        self._transact(RecordSpawn(epoch, identity), _Recorded(epoch))
        # The database applies units in order: the identity commits before any frame.
        held, runner.held = runner.held, []
        for frame in held:
            self._on_frame(frame)

    # --- frames ----------------------------------------------------------------------------

    def _on_frame(self, frame: ChildFrame) -> None:
        runner = self._active.get(frame.key)
        refusal = refuse_frame(runner, frame)
        if refusal is not None:
            frame.channel.send(refusal)
            return
        assert runner is not None and frame.message is not None
        if runner.identity is None:
            runner.held.append(frame)
            return
        unit = ApplyRunnerMessage(runner.view(self._draining), frame.message)
        runner.in_flight += 1
        self._transact(unit, _Applied(frame.key, frame.channel))

    def _on_applied(self, epoch: str, channel: FrameSink, reply: Reply) -> None:
        runner = self._active.get(epoch)
        if runner is not None:
            runner.in_flight -= 1
        if reply.error is not None:
            log.error(
                "runner message failed", extra={"action": "runner.error"}, exc_info=reply.error
            )
            channel.close()
        else:
            handled: Handled = reply.value
            if runner is not None:
                runner.apply(handled.delta)
            for frame in handled.frames:
                if frame.get("kind") == "command":
                    crash_point("server.ready.before_command")
                channel.send(frame)
            if runner is not None and handled.delta.handed_back:
                log.info(
                    "run handed back at a durable boundary",
                    extra={"action": "runner.handed_back", "run_id": runner.run_id},
                )
                self._stop_runner(runner)
        if runner is not None and runner.finished:
            self._record_exit(runner)

    # --- exits -----------------------------------------------------------------------------

    def _on_ended(self, epoch: str, ended: ChildEnded) -> None:
        """Reaped, and its channel delivered every frame it wrote (or it never started)."""
        runner = self._active.get(epoch)
        if runner is None:
            return
        if ended.exited is None:
            log.error(
                "runner spawn failed",
                extra={"action": "runner.spawn_failed", "run_id": runner.run_id},
            )
        self._stop_registered(runner)  # the server reaps what a dead runner registered
        runner.ended = ended
        if runner.finished:
            self._record_exit(runner)

    def _record_exit(self, runner: ActiveRunner) -> None:
        del self._active[runner.plan.runner_epoch]
        self._stop_registered(runner)  # a frame applied after the exit may have registered
        unit = RecordRunnerExit(runner.facts(), runner.returncode)
        self._transact(unit, _ExitRecorded(runner.plan.runner_epoch, runner.run_id))

    def _on_exit_recorded(self, run_id: str, reply: Reply) -> None:
        log.info(
            "runner exited",
            extra={
                "action": "runner.exited",
                "run_id": run_id,
                "reason": str(reply.value if reply.error is None else type(reply.error).__name__),
            },
        )
        self._wake_scheduler()
        if self._retention is not None:  # a sweep waits for idle; it checks that itself
            with contextlib.suppress(pykka.ActorDeadError):
                self._retention.tell(RequestSweep("runnerExit"))
        self._check_drained()

    # --- fencing, deadlines, stop ----------------------------------------------------------

    def _runner_of(self, run_id: str) -> ActiveRunner | None:
        """The live runner of `run_id`, if any.

        A settled runner (fenced, or done with the run) that has not exited yet is not
        it: its claim is released, so a command right after a pause must not present it.
        """
        return next(
            (r for r in self._active.values() if r.run_id == run_id and not r.settled), None
        )

    def _command(
        self,
        request: RequestMessage,
        context: OperationContext,
        responder: Responder,
        *,
        retried: bool = False,
    ) -> None:
        runner = self._runner_of(str(request.get("runId") or ""))
        claim = runner.plan.claim if runner is not None else None
        tag = _CommandDone(request, context, responder, claim is not None, retried)
        self._transact(ClientOperation(request, context, claim), tag, client=True)

    def _command_done(self, done: _CommandDone, reply: Reply) -> None:
        request, responder = done.request, done.responder
        if self._await_launch(done, reply) or self._retry_released(done, reply):
            return
        if reply.error is not None:
            responder.respond(failure_response(request, reply.error))
            return
        result = reply.value
        if result["outcome"] == "accepted" and request["operation"] in FENCING_COMMANDS:
            crash_point(f"server.lifecycle.{request['operation'].split('.')[1]}.before_fence")
            # The commit fenced the runner (its claim is released): now stop its group.
            self._fence(str(request.get("runId")))
        responder.respond(result)
        self._wake_scheduler()

    def _await_launch(self, done: _CommandDone, reply: Reply) -> bool:
        """Hold a command refused for want of a claim no runner here had yet: the
        admission that claimed the run commits before its `Launch` reaches this actor."""
        if done.retried or done.presented_claim or reply.error is not None:
            return False
        if (reply.value.get("error") or {}).get("code") != LAUNCH_IN_FLIGHT:
            return False
        run_id = str(done.request.get("runId") or "")
        until = self._config.clock.now_ms() + LAUNCH_WAIT_MS
        held = _AwaitingLaunch(done.request, done.context, done.responder, until)
        self._awaiting_launch.setdefault(run_id, []).append(held)
        return True

    def _retry_released(self, done: _CommandDone, reply: Reply) -> bool:
        """Send once more, as it is, a command whose presented claim its runner had
        released in the meantime (it parked, waited or finished, committed before the
        command): the refusal stored nothing, and the runner is settled here by now
        (the database actor answers in order), so the retry goes without a claim."""
        if done.retried or not done.presented_claim or reply.error is not None:
            return False
        if reply.value.get("outcome") != "claimLost":
            return False
        self._command(done.request, done.context, done.responder, retried=True)
        return True

    def _retry_awaiting(self, now: int, *, everything: bool = False) -> None:
        """Send held commands whose launch did not come in time once more, as they are."""
        for run_id in list(self._awaiting_launch):
            held = self._awaiting_launch[run_id]
            due = [h for h in held if everything or h.until <= now]
            kept = [h for h in held if h not in due]
            if kept:
                self._awaiting_launch[run_id] = kept
            else:
                del self._awaiting_launch[run_id]
            for h in due:
                self._command(h.request, h.context, h.responder, retried=True)

    def _fence(self, run_id: str) -> None:
        runner = self._runner_of(run_id)
        if runner is None:
            return
        runner.settled = True
        self._stop_runner(runner)

    def _stop_runner(self, runner: ActiveRunner) -> None:
        runner.stop_requested = True
        self._stop_registered(runner)
        self._channels.stop(runner.plan.runner_epoch, RUNNER_GRACE_TICKS)

    def _stop_registered(self, runner: ActiveRunner) -> None:
        for identity in runner.registered.values():
            self._supervisor.tell(StopGroup(identity))
        runner.registered.clear()

    def _on_tick(self) -> None:
        now = self._config.clock.now_ms()
        self._retry_awaiting(now)
        self._check_deadlines(now)

    def _check_deadlines(self, now: int) -> None:
        for runner in self._active.values():
            if runner.stop_requested or runner.settled or runner.identity is None:
                continue
            if runner.in_flight:
                continue  # it waits for the server (a full disk holds its write): not late
            if not runner.ready:
                if now - runner.plan.launched_at > STARTUP_DEADLINE_MS:
                    self._stop_runner(runner)
                continue
            attempt = runner.attempt
            if attempt is not None and attempt[2] is not None and now > attempt[2]:
                runner.timed_out_attempt = attempt[0]
                self._stop_runner(runner)

    def _drain(self, reply_to: Address) -> None:
        self._draining = True
        self._drained.append(reply_to)
        self._retry_awaiting(0, everything=True)  # no launch comes now: answer them as they are
        for runner in list(self._active.values()):
            if not runner.settled and runner.at_boundary:
                # Nothing external in flight: a pure node may run again, so hand it back now.
                self._hand_back(runner)
        self._check_drained()

    def _check_drained(self) -> None:
        if self._draining and not self._active:
            for reply_to in self._drained:
                answer(reply_to, None, Reply(0))
            self._drained.clear()

    def _hand_back(self, runner: ActiveRunner) -> None:
        facts = runner.facts()
        runner.settled = True
        self._stop_runner(runner)
        del self._active[runner.plan.runner_epoch]
        self._transact(HandBackRun(facts), _Recorded(runner.plan.runner_epoch))

    def _hand_back_all(self, reply_to: Address) -> None:
        runners = list(self._active.values())
        for runner in runners:
            if runner.effect_open:
                log.warning(
                    "stopping with an effect still applying; it will be ambiguous",
                    extra={"action": "runner.drain_timeout", "run_id": runner.run_id},
                )
            elif runner.registered:  # an agent step's pi: the step is presented again
                log.info(
                    "stopping a step's registered processes; the step runs again",
                    extra={"action": "runner.drain_timeout", "run_id": runner.run_id},
                )
            self._hand_back(runner)
        # The database keeps order: this answers after every hand-back queued before it,
        # even those a full disk holds (`hold_when_full`).
        self._transact(Barrier(len(runners)), _HandedBackAll(reply_to))

    def _wake_scheduler(self) -> None:
        if self._scheduler is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                self._scheduler.tell(Wake())


def refuse_frame(runner: ActiveRunner | None, frame: ChildFrame) -> dict[str, Any] | None:
    """The reply to a frame that must not reach the database, or None to apply it.

    A frame that broke the schema is `rejected`. Generation and epoch come first, before
    the payload is read: a stale, settled or unknown runner gets `claimLost`.
    """
    message = frame.message
    if message is None:
        error = ("protocolRejected", frame.violation or "invalid message")
        return _reply_to_raw(frame.raw, runner, "rejected", error)
    if (
        runner is None
        or runner.settled
        or message.runner_epoch != frame.key
        or message.run_id != runner.run_id
        or message.generation != runner.plan.claim.generation
    ):
        return reply_to(message, "claimLost", error=("claimLost", "stale runner"))
    return None


def _reply_to_raw(
    raw: Mapping[str, Any], runner: ActiveRunner | None, outcome: Any, error: tuple[str, str]
) -> dict[str, Any]:
    """A reply to a frame that broke the schema, from whatever fields it had."""

    def text(key: str, fallback: str) -> str:
        value = raw.get(key)
        return value if isinstance(value, str) and value else fallback

    generation = raw.get("generation")
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        generation = 0
    address = RunnerAddress(
        text("runId", runner.run_id if runner else "unknown"),
        generation,
        text("runnerEpoch", "unknown"),
    )
    return RunnerReply.build(address, text("messageId", "unknown"), outcome, error=error).to_wire()
