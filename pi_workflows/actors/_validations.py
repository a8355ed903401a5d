"""The validations actor: held `interaction.submit` responses and validation children.

Implements workflow-server.md § Interactive Pi execution (a provisional `validating`
candidate, a supervised validation child, settle only at the durable outcome) and
client-protocol.md § Commands and uncertain results (the response stays open; a retry
with the same identity waits for the same outcome, on the stored submission ID).

The child's report travels on a private socketpair that the listener's loop reads (as
a runner channel). The report is only a proposal: the submission settles when the
database actor commits it. If the child, or this server, dies first, the candidate is
still `validating` in the database, so the next server validates it again (recovery
step 9); a child that dies without a report rejects it here.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Reply, ServerActor, tell_if_alive
from pi_workflows.actors._database import Transact
from pi_workflows.actors._process_supervisor import ChildExited, KillChild, Spawn
from pi_workflows.actors._reader import Read
from pi_workflows.actors._scheduler import Wake
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import (
    ActiveEpochs,
    SessionAuthority,
    SettledSubmission,
    SubmitStep,
    ValidationJob,
    failure_response,
    held_answer,
    rejected,
    settle_validation,
    submit_interaction,
    validations_to_resume,
)
from pi_workflows.engine.validate import VALIDATOR_FD_ENV
from pi_workflows.storage import ensure_private_dir
from pi_workflows.supervision import ProcessIdentity
from pi_workflows.wire.framing import FrameError
from pi_workflows.wire.protocol import RequestMessage

__all__ = [
    "DEFAULT_VALIDATE_TIMEOUT_S",
    "VALIDATE_TIMEOUT_ENV",
    "VALIDATOR_MODULE",
    "ConnectionGone",
    "ResumeValidations",
    "Submit",
    "ValidationsActor",
    "ValidationsConfig",
    "validate_timeout_from_env",
]

log = logging.getLogger(__name__)

VALIDATOR_MODULE = "pi_workflows.engine.validate"
DEFAULT_VALIDATE_TIMEOUT_S = 60.0
"""How long a validation child may take before it is killed and the candidate rejected."""
VALIDATE_TIMEOUT_ENV = "PI_WORKFLOWS_VALIDATE_TIMEOUT_S"


def validate_timeout_from_env(environ: Mapping[str, str] | None = None) -> float:
    """`PI_WORKFLOWS_VALIDATE_TIMEOUT_S` as seconds from 0.1 to 3600, or 60.

    Raises:
        ValueError: the value is not such a number (the server does not start).
    """
    raw = (environ if environ is not None else os.environ).get(VALIDATE_TIMEOUT_ENV, "")
    if not raw.strip():
        return DEFAULT_VALIDATE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0.1 <= value <= 3600:
        raise ValueError(f"{VALIDATE_TIMEOUT_ENV} must be a number of seconds from 0.1 to 3600")
    return value


_REPORTS = frozenset({"interaction.accepted", "interaction.rejected"})


class Held(Protocol):
    """A request waiting for its answer (the router's `Pending`): answered exactly once."""

    @property
    def request(self) -> RequestMessage: ...

    @property
    def connection_id(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    def respond(self, answer: Mapping[str, Any]) -> None: ...


class ChannelListener(Protocol):
    def attach_channel_nowait(self, sock: socket.socket, handler: Any, name: str) -> None: ...

    def end_channel_input_nowait(self, sock: socket.socket) -> bool: ...


@dataclass(frozen=True, slots=True)
class ValidationsConfig:
    state_dir: Path
    agent_dir: Path
    timeout_s: float = DEFAULT_VALIDATE_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class Submit:
    """An `interaction.submit` from the router."""

    held: Held


@dataclass(frozen=True, slots=True)
class ConnectionGone:
    """A client connection closed: its held submissions stop waiting (nothing undone)."""

    connection_id: str


@dataclass(frozen=True, slots=True)
class ResumeValidations:
    """Recovery step 9, once the actors run: validate every `validating` candidate again."""


@dataclass(frozen=True, slots=True)
class _Submitted:
    held: Held
    reply: Reply


@dataclass(frozen=True, slots=True)
class _Resumed:
    reply: Reply


@dataclass(frozen=True, slots=True)
class _Spawned:
    submission_id: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class _Report:
    submission_id: str
    report: dict[str, Any] = field(repr=False)


@dataclass(frozen=True, slots=True)
class _ChannelEnded:
    submission_id: str


@dataclass(frozen=True, slots=True)
class _Exited:
    submission_id: str
    exited: ChildExited


@dataclass(frozen=True, slots=True)
class _Settled:
    submission_id: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class _Waiter:
    held: Held
    adopted: bool


@dataclass
class _Child:
    socket: socket.socket
    deadline: float
    identity: ProcessIdentity | None = None
    settling: bool = False
    timed_out: bool = False
    waiters: list[_Waiter] = field(default_factory=list)


class ValidatorChannel:
    """The listener's handler for one validation child (on the listener's loop)."""

    def __init__(self, actor: pykka.ActorRef[Any], job: ValidationJob) -> None:
        self._actor = actor
        self._job = job

    def on_message(self, channel: Any, message: dict[str, Any]) -> None:
        kind = message.get("kind")
        if kind == "validation.ready":
            try:
                channel.send(self._job.frame)
            except FrameError:
                channel.close()  # checked before the spawn; a reject follows the close
        elif kind in _REPORTS:
            tell_if_alive(self._actor, _Report(self._job.submission_id, message))
        else:
            channel.close()

    def on_close(self, channel: Any) -> None:
        tell_if_alive(self._actor, _ChannelEnded(self._job.submission_id))


class ValidationsActor(ServerActor):
    """Owns: the held `interaction.submit` responses, by stored submission ID, and the
    validation child of each candidate being validated (at most one per submission).

    Receives: `Submit`, `ConnectionGone`, `ResumeValidations`, `Tick`, and its own
        replies (database units, spawn, report, channel end, exit).
    Sends: `Transact` (`submit_interaction`, `settle_validation`) to the database; `Read`
        (`validations_to_resume`) to the reader; `Spawn` and `KillChild` to the process
        supervisor; responses.
    Invariants: a held response is answered only after its submission's outcome
        committed; a candidate settles once; a child that overruns is killed.
    On failure: reported to the server, which stops; candidates stay `validating` and
        the next start validates them again.
    """

    name = "validations"

    def __init__(
        self,
        config: ValidationsConfig,
        on_actor_failure: ActorFailureHandler,
        *,
        database: pykka.ActorRef[Any],
        reader: pykka.ActorRef[Any],
        supervisor: pykka.ActorRef[Any],
        listener: ChannelListener,
        epochs: ActiveEpochs | None = None,
        scheduler: pykka.ActorRef[Any] | None = None,
    ) -> None:
        super().__init__(on_actor_failure)
        self._config = config
        self._epochs = epochs if epochs is not None else ActiveEpochs()
        """The coordinator epochs (an origin-session submission needs the active one)."""
        self._scheduler = scheduler
        """Woken after an accepted origin-session output requeued its run."""
        self._database = database
        self._reader = reader
        self._supervisor = supervisor
        self._listener = listener
        self._children: dict[str, _Child] = {}

    def on_receive(self, message: Any) -> Any:
        handler = self._routes.get(type(message))
        if handler is None:
            raise TypeError(f"validations actor got {type(message).__name__}")
        handler(message)
        return None

    @functools.cached_property
    def _routes(self) -> dict[type, Callable[[Any], None]]:
        """One entry per message type: the messages this actor receives."""
        return {
            Submit: lambda m: self._submit(m.held),
            _Submitted: lambda m: self._on_submitted(m.held, m.reply),
            ConnectionGone: lambda m: self._forget_connection(m.connection_id),
            ResumeValidations: lambda m: self._resume(),
            _Resumed: lambda m: self._on_resumed(m.reply),
            _Spawned: lambda m: self._on_spawned(m.submission_id, m.reply),
            _Report: lambda m: self._settle(m.submission_id, m.report, ""),
            _ChannelEnded: lambda m: self._on_channel_ended(m.submission_id),
            _Exited: lambda m: self._on_exited(m.submission_id),
            _Settled: lambda m: self._on_settled(m.submission_id, m.reply),
            Tick: lambda m: self._kill_overdue(),
        }

    def _submit(self, held: Held) -> None:
        work = functools.partial(
            submit_interaction,
            request=held.request,
            agent_dir=self._config.agent_dir,
            authority=SessionAuthority(held.connection_id, self._epochs),
        )
        self._transact(work, functools.partial(_Submitted, held), "interaction.submit")

    def _resume(self) -> None:
        me = self.actor_ref
        work = functools.partial(validations_to_resume, agent_dir=self._config.agent_dir)
        self._reader.tell(
            Read(work, lambda reply: tell_if_alive(me, _Resumed(reply)), "interaction.resume")
        )

    def _on_resumed(self, reply: Reply) -> None:
        if reply.error is not None:
            log.error(
                "validations not resumed",
                extra={"action": "validation.resume_failed"},
                exc_info=reply.error,
            )
            return
        for job in reply.value:
            self._start(job)
        if reply.value:
            log.info(
                "validating submissions again after a restart",
                extra={"action": "validation.resumed", "count": len(reply.value)},
            )

    def on_stop(self) -> None:
        """The server stops: held requests are released (a retry adopts the outcome)."""
        for child in self._children.values():
            for waiter in child.waiters:
                waiter.held.respond(
                    rejected(
                        waiter.held.request,
                        "unavailable",
                        "serverStopping",
                        "the server is stopping",
                    )
                )
            child.waiters.clear()

    # --- submissions -----------------------------------------------------------------------

    def _transact(self, work: Any, then: Any, label: str) -> None:
        me = self.actor_ref
        self._database.tell(
            Transact(
                work, lambda reply: tell_if_alive(me, then(reply)), label, hold_when_full=False
            )
        )

    def _on_submitted(self, held: Held, reply: Reply) -> None:
        if reply.error is not None:
            held.respond(failure_response(held.request, reply.error))
            return
        step: SubmitStep = reply.value
        if step.answer is not None:
            held.respond(step.answer)
            return
        assert step.wait_for is not None
        if step.job is not None:
            self._start(step.job)
        child = self._children.get(step.wait_for)
        assert child is not None  # a waited-on candidate always comes with its job
        if held.closed:  # it hung up meanwhile: release it, the child goes on
            self._release(held)
            return
        child.waiters.append(_Waiter(held, step.adopted))

    def _forget_connection(self, connection_id: str) -> None:
        for child in self._children.values():
            gone = [w for w in child.waiters if w.held.connection_id == connection_id]
            child.waiters = [w for w in child.waiters if w.held.connection_id != connection_id]
            for waiter in gone:
                self._release(waiter.held)

    @staticmethod
    def _release(held: Held) -> None:
        """Stop waiting for a gone client: the write is dropped, the in-flight count freed."""
        held.respond(rejected(held.request, "unavailable", "connectionClosed", "closed"))

    # --- children --------------------------------------------------------------------------

    def _start(self, job: ValidationJob) -> None:
        sid = job.submission_id
        if sid in self._children:
            return  # one child per candidate
        config = self._config
        server_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        me = self.actor_ref
        self._listener.attach_channel_nowait(server_end, ValidatorChannel(me, job), "validator")
        self._children[sid] = _Child(server_end, time.monotonic() + config.timeout_s)
        env = dict(os.environ)
        env[VALIDATOR_FD_ENV] = str(child_end.fileno())
        logs = config.state_dir / "logs" / "validators"
        ensure_private_dir(logs)
        project = Path(job.frame.get("projectPath") or config.state_dir)
        self._supervisor.tell(
            Spawn(
                [sys.executable, "-m", VALIDATOR_MODULE],
                env,
                lambda reply: tell_if_alive(me, _Spawned(sid, reply)),
                lambda exited: tell_if_alive(me, _Exited(sid, exited)),
                cwd=project if project.is_dir() else config.state_dir,
                log_path=logs / f"validator-{uuid.uuid4().hex[:16]}.log",
                pass_fds=(child_end.detach(),),
                preloaded=VALIDATOR_MODULE,
                fd_env=VALIDATOR_FD_ENV,
            )
        )

    def _on_spawned(self, sid: str, reply: Reply) -> None:
        child = self._children.get(sid)
        if child is None:
            return
        if reply.error is not None:
            log.error("validation child not started", extra={"action": "validation.spawn_failed"})
            self._end_input(child)
            return
        child.identity = reply.value

    def _end_input(self, child: _Child) -> None:
        """Make the channel end after what the child wrote (its end of file follows)."""
        if not self._listener.end_channel_input_nowait(child.socket):
            with contextlib.suppress(OSError):
                child.socket.close()

    def _on_exited(self, sid: str) -> None:
        child = self._children.get(sid)
        if child is not None:
            # Every frame it wrote is still read; then the channel ends, even if a
            # descendant holds the child's end.
            self._end_input(child)

    def _on_channel_ended(self, sid: str) -> None:
        child = self._children.get(sid)
        if child is None or child.settling:
            return
        if child.timed_out:
            reason = (
                f"validating the output took longer than {self._config.timeout_s:g} s; submit again"
            )
        else:
            reason = (
                "the validation child stopped before it reported a result; submit the output again"
            )
        self._settle(sid, None, reason)

    def _settle(self, sid: str, report: dict[str, Any] | None, reason: str) -> None:
        child = self._children.get(sid)
        if child is None or child.settling:
            return
        child.settling = True
        if child.identity is not None:
            self._supervisor.tell(KillChild(child.identity))  # nothing it started lingers
        work = functools.partial(settle_validation, submission_id=sid, report=report, reason=reason)
        self._transact(work, functools.partial(_Settled, sid), "interaction.settle")

    def _on_settled(self, sid: str, reply: Reply) -> None:
        child = self._children.pop(sid, None)
        if reply.error is None and reply.value.requeued and self._scheduler is not None:
            self._scheduler.tell(Wake())  # the accepted step's run is admissible again
        if child is None:
            return
        for waiter in child.waiters:
            if reply.error is not None:
                waiter.held.respond(failure_response(waiter.held.request, reply.error))
                continue
            settled: SettledSubmission = reply.value
            waiter.held.respond(
                held_answer(waiter.held.request, settled.receipt, adopted=waiter.adopted)
            )
        log.info(
            "submission settled",
            extra={
                "action": "interaction.settled",
                "outcome": None if reply.error else reply.value.receipt.get("outcome"),
            },
        )

    def _kill_overdue(self) -> None:
        now = time.monotonic()
        for child in self._children.values():
            if child.settling or child.timed_out or now < child.deadline:
                continue
            child.timed_out = True
            if child.identity is not None:
                self._supervisor.tell(KillChild(child.identity))
            else:
                self._end_input(child)
