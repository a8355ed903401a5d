"""The runner-host actor: owns every live runner epoch of this server.

Implements workflow-server.md § Runner lifecycle, § Runner protocol, § Pause and
cancellation and § Failure classification, server side. It launches admitted runs,
handles the ready handshake, passes runner frames to the database actor and their
replies back, enforces the startup and node deadlines on `Tick`, applies the exit
policy when a runner is reaped, fences runners after pause and cancel, and drains them
at a graceful stop. It never touches SQLite (units of work go to the database actor as
`Transact`) and never signals a process (the process supervisor does).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Reply, ServerActor, tell_if_alive
from pi_workflows.actors._database import Transact
from pi_workflows.actors._process_supervisor import (
    ChildExited,
    Spawn,
    StopChild,
    StopGroup,
)
from pi_workflows.actors._scheduler import Launch, Wake
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import (
    FENCING_COMMANDS,
    LAUNCH_IN_FLIGHT,
    Delta,
    ExitFacts,
    Handled,
    LaunchPlan,
    OperationContext,
    RunnerView,
    apply_message,
    failure_response,
    hand_back,
    handle_operation,
    record_exit,
    record_spawn,
    reply_to,
)
from pi_workflows.engine import Limits, limits_env
from pi_workflows.storage import Clock, ensure_private_dir
from pi_workflows.supervision import ProcessIdentity, crash_point
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.protocol import ProtocolViolation, RequestMessage
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
    "ConnectScheduler",
    "Drain",
    "HandBack",
    "Launch",
    "RunCommand",
    "RunnerChannel",
    "RunnerExited",
    "RunnerFrame",
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


class ChannelAttacher(Protocol):
    """The listener's one method the runner host uses (non-blocking)."""

    def attach_channel_nowait(self, sock: socket.socket, handler: Any, name: str) -> None: ...

    def end_channel_input_nowait(self, sock: socket.socket) -> bool: ...


class FrameSink(Protocol):
    """A runner channel as the runner host sees it: frames out, close."""

    def send(self, message: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


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
class ConnectScheduler:
    """Where to send `Wake` when a slot frees (the scheduler starts after this actor)."""

    scheduler: pykka.ActorRef[Any]


@dataclass(frozen=True, slots=True)
class RunnerFrame:
    """One frame from a runner's private channel, checked where it was read."""

    runner_epoch: str
    channel: FrameSink
    message: RunnerMessage | None
    """None when the frame broke `runner.v1`; `violation` says how."""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    violation: str | None = None


@dataclass(frozen=True, slots=True)
class RunnerExited:
    """The process supervisor reaped a runner."""

    runner_epoch: str
    exited: ChildExited


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    """A runner's channel reached end of file: no frame of it is still to come."""

    runner_epoch: str


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
    request: RequestMessage
    context: OperationContext
    responder: Responder
    reply: Reply
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

    `reply` is called once no runner of this server is left.
    """

    reply: Callable[[Reply], None]


@dataclass(frozen=True, slots=True)
class HandBack:
    """Graceful stop, part two (the drain period ended): hand back every run still held."""

    reply: Callable[[Reply], None]
    """Receives the number of runs handed back."""


@dataclass(frozen=True, slots=True)
class _Spawned:
    runner_epoch: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class _Applied:
    runner_epoch: str
    channel: FrameSink
    reply: Reply


@dataclass(frozen=True, slots=True)
class _ExitRecorded:
    runner_epoch: str
    run_id: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class _Recorded:
    runner_epoch: str
    reply: Reply


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
    channel_socket: socket.socket | None = field(default=None, repr=False)
    """The server's end of the runner's channel (owned by the listener's loop)."""
    channel_closed: bool = False
    exited: ChildExited | None = None
    held: list[RunnerFrame] = field(default_factory=list)
    """Frames that came before the spawn was reported (a pre-forked runner can connect
    before the supervisor's reply): applied after its identity is queued for commit."""

    @property
    def finished(self) -> bool:
        """Reaped, and every frame it sent before it died has been applied.

        The exit report and the runner's last frames travel different paths (the
        supervisor, the listener), so the outcome waits for the channel's end of file
        and its answers: a `run.finished` sent just before exit is never lost as stale.
        """
        return self.exited is not None and self.channel_closed and self.in_flight == 0

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


class RunnerChannel:
    """The listener's handler for one runner channel: checks frames, tells the host."""

    def __init__(self, host: pykka.ActorRef[Any], runner_epoch: str) -> None:
        self._host = host
        self._epoch = runner_epoch

    def on_message(self, channel: FrameSink, message: dict[str, Any]) -> None:
        # Checked here, on the listener's loop, so neither actor parses a raw frame.
        try:
            frame = RunnerFrame(self._epoch, channel, RunnerMessage.from_wire(message))
        except ProtocolViolation as exc:
            frame = RunnerFrame(self._epoch, channel, None, message, str(exc))
        with contextlib.suppress(pykka.ActorDeadError):  # stopping: the exit decides
            self._host.tell(frame)

    def on_close(self, channel: FrameSink) -> None:
        # Every frame the runner sent has been told to the host before this.
        with contextlib.suppress(pykka.ActorDeadError):
            self._host.tell(ChannelClosed(self._epoch))


class RunnerHostActor(ServerActor):
    """Owns: every live runner epoch (`ActiveRunner`), the drain state.

    Receives: `Launch`, `RunnerFrame`, `RunnerExited`, `ChannelClosed`, `RunCommand`, `Tick`,
        `Drain`, `HandBack`, `ConnectScheduler`, and its own database replies.
    Sends: `Transact` to the database actor; `Spawn`, `StopChild`, `StopGroup` to the
        process supervisor; frames to runner channels; `Wake` to the scheduler.
    Invariants: a frame is answered only after its write committed; a fenced or settled
        runner's frames are answered `claimLost` without touching the database; every
        runner launched gets one recorded outcome.
    On failure: reported to the server, which stops; runners end with the zygote and
        recovery hands their runs back.
    """

    name = "runner-host"

    def __init__(
        self,
        config: RunnerHostConfig,
        database: pykka.ActorRef[Any],
        supervisor: pykka.ActorRef[Any],
        listener: ChannelAttacher,
        on_actor_failure: ActorFailureHandler,
    ) -> None:
        super().__init__(on_actor_failure)
        self._config = config
        self._database = database
        self._supervisor = supervisor
        self._listener = listener
        self._scheduler: pykka.ActorRef[Any] | None = None
        self._active: dict[str, ActiveRunner] = {}
        self._draining = False
        self._drained: list[Callable[[Reply], None]] = []
        self._awaiting_launch: dict[str, list[_AwaitingLaunch]] = {}
        """Commands held for a launch in flight, by run ID."""

    def on_receive(self, message: Any) -> Any:
        handler = self._routes.get(type(message))
        if handler is None:
            raise TypeError(f"runner host got {type(message).__name__}")
        handler(message)
        return None

    @functools.cached_property
    def _routes(self) -> dict[type, Callable[[Any], None]]:
        """One entry per message type: the messages this actor receives."""
        return {
            RunnerFrame: self._on_frame,
            _Applied: lambda m: self._on_applied(m.runner_epoch, m.channel, m.reply),
            Launch: lambda m: self._launch(m.plan),
            _Spawned: lambda m: self._on_spawned(m.runner_epoch, m.reply),
            RunnerExited: lambda m: self._on_exited(m.runner_epoch, m.exited),
            ChannelClosed: lambda m: self._on_channel_closed(m.runner_epoch),
            _ExitRecorded: lambda m: self._on_exit_recorded(m.run_id, m.reply),
            RunCommand: lambda m: self._command(m.request, m.context, m.responder),
            _CommandDone: self._command_done,
            Tick: lambda m: self._on_tick(),
            Drain: lambda m: self._drain(m.reply),
            HandBack: lambda m: self._hand_back_all(m.reply),
            _Recorded: lambda m: None,
            ConnectScheduler: self._connect,
        }

    def _connect(self, message: ConnectScheduler) -> None:
        self._scheduler = message.scheduler

    # --- launch ----------------------------------------------------------------------------

    def _transact(
        self,
        work: Callable[[Any], Any],
        done: Callable[[Reply], Any],
        label: str,
        *,
        client: bool = False,
    ) -> None:
        """Send a unit of work. A runner's messages, spawns and exits wait out a full disk
        in order (`hold_when_full`); a client's command is refused at once instead."""
        me = self.actor_ref
        self._database.tell(
            Transact(
                work, lambda reply: tell_if_alive(me, done(reply)), label, hold_when_full=not client
            )
        )

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
        epoch = plan.runner_epoch
        server_end, runner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.attach_channel_nowait(
            server_end, RunnerChannel(self.actor_ref, epoch), epoch
        )
        self._active[epoch].channel_socket = server_end
        env = dict(config.env)
        env[RUNNER_FD_ENV] = str(runner_end.fileno())
        env[LAUNCH_ENV] = dumps(plan.envelope).decode("utf-8")
        env[AGENT_DIR_ENV] = str(config.agent_dir)
        env[STATE_DIR_ENV] = str(config.state_dir)
        env.update(limits_env(config.default_limits))
        logs = config.state_dir / "logs" / "runners"
        ensure_private_dir(logs)
        me = self.actor_ref
        project = Path(plan.project_path) if plan.project_path else config.state_dir
        self._supervisor.tell(
            Spawn(
                [sys.executable, "-m", RUNNER_MODULE],
                env,
                lambda reply: tell_if_alive(me, _Spawned(epoch, reply)),
                lambda exited: tell_if_alive(me, RunnerExited(epoch, exited)),
                cwd=project if project.is_dir() else config.state_dir,
                log_path=logs / f"{epoch}.log",
                pass_fds=(runner_end.detach(),),
                preloaded=RUNNER_MODULE,
                fd_env=RUNNER_FD_ENV,
            )
        )

    def _on_spawned(self, epoch: str, reply: Reply) -> None:
        runner = self._active.get(epoch)
        if runner is None:
            return
        if reply.error is not None:
            log.error(
                "runner spawn failed",
                extra={"action": "runner.spawn_failed", "run_id": runner.run_id},
            )
            runner.channel_closed = True  # no process: nothing will ever write to it
            self._on_exited(epoch, ChildExited(ProcessIdentity(0, 0, ""), 127, False))
            return
        runner.identity = reply.value
        crash_point("server.launch.after_spawn")
        work = functools.partial(record_spawn, runner_epoch=epoch, identity=reply.value)
        self._transact(work, functools.partial(_Recorded, epoch), "runner.spawned")
        # The database applies units in order: the identity commits before any frame.
        held, runner.held = runner.held, []
        for frame in held:
            self._on_frame(frame)

    # --- frames ----------------------------------------------------------------------------

    def _on_frame(self, frame: RunnerFrame) -> None:
        runner = self._active.get(frame.runner_epoch)
        refusal = refuse_frame(runner, frame)
        if refusal is not None:
            frame.channel.send(refusal)
            return
        assert runner is not None and frame.message is not None
        if runner.identity is None:
            runner.held.append(frame)
            return
        work = functools.partial(
            apply_message, view=runner.view(self._draining), message=frame.message
        )
        done = functools.partial(_Applied, frame.runner_epoch, frame.channel)
        runner.in_flight += 1
        self._transact(work, done, "runner.message")

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

    def _on_exited(self, epoch: str, exited: ChildExited) -> None:
        runner = self._active.get(epoch)
        if runner is None:
            return
        self._stop_registered(runner)  # the server reaps what a dead runner registered
        runner.exited = exited
        if not runner.channel_closed and (
            runner.channel_socket is None
            or not self._listener.end_channel_input_nowait(runner.channel_socket)
        ):
            runner.channel_closed = True  # nothing will read the channel again
        # Otherwise the channel delivers every frame the runner wrote, then its end of
        # file, even if a descendant still holds the runner's end.
        if runner.finished:
            self._record_exit(runner)

    def _on_channel_closed(self, epoch: str) -> None:
        runner = self._active.get(epoch)
        if runner is None:
            return
        runner.channel_closed = True
        if runner.finished:
            self._record_exit(runner)

    def _record_exit(self, runner: ActiveRunner) -> None:
        assert runner.exited is not None
        del self._active[runner.plan.runner_epoch]
        work = functools.partial(
            record_exit, facts=runner.facts(), returncode=runner.exited.returncode
        )
        done = functools.partial(_ExitRecorded, runner.plan.runner_epoch, runner.run_id)
        self._transact(work, done, "runner.exit")

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
        work = functools.partial(handle_operation, request=request, ctx=context, claim=claim)
        done = functools.partial(
            _CommandDone,
            request,
            context,
            responder,
            presented_claim=claim is not None,
            retried=retried,
        )
        self._transact(work, done, request["operation"], client=True)

    def _command_done(self, message: _CommandDone) -> None:
        request, responder, reply = message.request, message.responder, message.reply
        if self._await_launch(message):
            return
        if reply.error is not None:
            responder.respond(failure_response(request, reply.error))
            return
        answer = reply.value
        if answer["outcome"] == "accepted" and request["operation"] in FENCING_COMMANDS:
            crash_point(f"server.lifecycle.{request['operation'].split('.')[1]}.before_fence")
            # The commit fenced the runner (its claim is released): now stop its group.
            self._fence(str(request.get("runId")))
        responder.respond(answer)
        self._wake_scheduler()

    def _await_launch(self, message: _CommandDone) -> bool:
        """Hold a command refused for want of a claim no runner here had yet: the
        admission that claimed the run commits before its `Launch` reaches this actor."""
        answer = message.reply.value
        if message.retried or message.presented_claim or message.reply.error is not None:
            return False
        if (answer.get("error") or {}).get("code") != LAUNCH_IN_FLIGHT:
            return False
        run_id = str(message.request.get("runId") or "")
        until = self._config.clock.now_ms() + LAUNCH_WAIT_MS
        held = _AwaitingLaunch(message.request, message.context, message.responder, until)
        self._awaiting_launch.setdefault(run_id, []).append(held)
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
        if runner.identity is not None:
            self._supervisor.tell(StopChild(runner.identity, RUNNER_GRACE_TICKS))

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

    def _drain(self, reply: Callable[[Reply], None]) -> None:
        self._draining = True
        self._drained.append(reply)
        self._retry_awaiting(0, everything=True)  # no launch comes now: answer them as they are
        for runner in list(self._active.values()):
            if not runner.settled and runner.at_boundary:
                # Nothing external in flight: a pure node may run again, so hand it back now.
                self._hand_back(runner)
        self._check_drained()

    def _check_drained(self) -> None:
        if self._draining and not self._active:
            for reply in self._drained:
                reply(Reply(0))
            self._drained.clear()

    def _hand_back(self, runner: ActiveRunner) -> None:
        facts = runner.facts()
        runner.settled = True
        self._stop_runner(runner)
        work = functools.partial(hand_back, facts=facts)
        del self._active[runner.plan.runner_epoch]
        self._transact(
            work, functools.partial(_Recorded, runner.plan.runner_epoch), "runner.hand_back"
        )

    def _hand_back_all(self, reply: Callable[[Reply], None]) -> None:
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
        # The database keeps order: this answers after every hand-back queued before it.
        self._database.tell(
            Transact(
                functools.partial(_count, len(runners)),
                reply,
                "runner.hand_back_all",
                hold_when_full=True,  # behind the hand-backs, even those a full disk holds
            )
        )

    def _wake_scheduler(self) -> None:
        if self._scheduler is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                self._scheduler.tell(Wake())


def refuse_frame(runner: ActiveRunner | None, frame: RunnerFrame) -> dict[str, Any] | None:
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
        or message.runner_epoch != frame.runner_epoch
        or message.run_id != runner.run_id
        or message.generation != runner.plan.claim.generation
    ):
        return reply_to(message, "claimLost", error=("claimLost", "stale runner"))
    return None


def _count(count: int, db: Any) -> int:
    return count


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
