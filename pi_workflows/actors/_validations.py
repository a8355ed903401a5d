"""The validations actor: held `interaction.submit` responses and validation children.

Implements workflow-server.md § Interactive Pi execution (a provisional `validating`
candidate, a supervised validation child, settle only at the durable outcome) and
client-protocol.md § Commands and uncertain results (the response stays open; a retry
with the same identity waits for the same outcome, on the stored submission ID).

The child's report travels on a private socketpair (`ChildChannels`, as a runner's
channel). The report is only a proposal: the submission settles when the
database actor commits it. If the child, or this server, dies first, the candidate is
still `validating` in the database, so the next server validates it again (recovery
step 9); a child that dies without a report rejects it here.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Done, Reply, ServerActor
from pi_workflows.actors._database import Transact
from pi_workflows.actors._reader import Read
from pi_workflows.actors._scheduler import Wake
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import (
    ActiveEpochs,
    SessionAuthority,
    SettledSubmission,
    SettleValidation,
    SubmitInteraction,
    SubmitStep,
    ValidationJob,
    ValidationsToResume,
    failure_response,
    held_answer,
    rejected,
)
from pi_workflows.engine.validate import VALIDATOR_FD_ENV
from pi_workflows.storage import ensure_private_dir
from pi_workflows.supervision import (
    ChannelListener,
    ChildChannelClosed,
    ChildChannels,
    ChildExited,
    ChildFrame,
    ChildSpec,
    FrameSink,
)
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

_SAFE_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""A run ID usable as a folder name (server-made IDs always are)."""

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
    """Tag: a submission's unit of work."""

    held: Held


@dataclass(frozen=True, slots=True)
class _Resumed:
    """Tag: the read of candidates a dead server left `validating`."""


@dataclass(frozen=True, slots=True)
class _Settled:
    """Tag: a candidate's settlement."""

    submission_id: str


@dataclass(frozen=True, slots=True)
class _Waiter:
    held: Held
    adopted: bool


@dataclass
class _Candidate:
    """One candidate being validated, and who waits for its outcome."""

    job: ValidationJob
    deadline: float
    settling: bool = False
    timed_out: bool = False
    waiters: list[_Waiter] = field(default_factory=list)


class ValidationsActor(ServerActor):
    """Owns: the held `interaction.submit` responses, by stored submission ID, and the
    validation child of each candidate being validated (at most one per submission;
    its channel is a `ChildChannels` of this actor's).

    Receives: `Submit`, `ConnectionGone`, `ResumeValidations`, `Tick`, `ChildFrame`,
        `ChildChannelClosed`, `ChildExited`, and `Done` (its units' and spawns' answers).
    Sends: `Transact` (`SubmitInteraction`, `SettleValidation`) to the database; `Read`
        (`ValidationsToResume`) to the reader; `Spawn`, `KillChild` to the process
        supervisor (through its `ChildChannels`); responses.
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
        self._candidates: dict[str, _Candidate] = {}
        self._children: ChildChannels | None = None
        """Made in `on_start`, once this actor's own address exists."""

    def on_start(self) -> None:
        self._children = ChildChannels(self.actor_ref, self._supervisor, self._listener)

    @property
    def _channels(self) -> ChildChannels:
        assert self._children is not None
        return self._children

    def on_receive(self, message: Any) -> Any:
        match message:
            case Submit(held=held):
                self._submit(held)
            case Done(tag=_Submitted(held=held), reply=reply):
                self._on_submitted(held, reply)
            case Done(tag=_Resumed(), reply=reply):
                self._on_resumed(reply)
            case Done(tag=_Settled(submission_id=sid), reply=reply):
                self._on_settled(sid, reply)
            case ChildFrame(key=sid, channel=channel, message=frame):
                self._on_frame(sid, channel, frame)
            case Done() | ChildExited() | ChildChannelClosed():
                for event in self._channels.handle(message):
                    if isinstance(event, ChildChannelClosed):
                        self._on_channel_ended(event.key)
            case ConnectionGone(connection_id=connection_id):
                self._forget_connection(connection_id)
            case ResumeValidations():
                self._reader.tell(
                    Read(ValidationsToResume(self._config.agent_dir), self.actor_ref, _Resumed())
                )
            case Tick():
                self._kill_overdue()
            case _:
                raise TypeError(f"validations actor got {type(message).__name__}")
        return None

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
        """The server stops: held requests are released (a retry adopts the outcome), and
        every validation channel ends (the supervisor kills what still runs)."""
        for candidate in self._candidates.values():
            for waiter in candidate.waiters:
                waiter.held.respond(
                    rejected(
                        waiter.held.request,
                        "unavailable",
                        "serverStopping",
                        "the server is stopping",
                    )
                )
            candidate.waiters.clear()
        self._channels.close()

    # --- submissions -----------------------------------------------------------------------

    def _submit(self, held: Held) -> None:
        unit = SubmitInteraction(
            held.request,
            self._config.agent_dir,
            SessionAuthority(held.connection_id, self._epochs),
        )
        self._database.tell(Transact(unit, self.actor_ref, _Submitted(held)))

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
        candidate = self._candidates.get(step.wait_for)
        assert candidate is not None  # a waited-on candidate always comes with its job
        if held.closed:  # it hung up meanwhile: release it, the child goes on
            self._release(held)
            return
        candidate.waiters.append(_Waiter(held, step.adopted))

    def _forget_connection(self, connection_id: str) -> None:
        for candidate in self._candidates.values():
            gone = [w for w in candidate.waiters if w.held.connection_id == connection_id]
            candidate.waiters = [
                w for w in candidate.waiters if w.held.connection_id != connection_id
            ]
            for waiter in gone:
                self._release(waiter.held)

    @staticmethod
    def _release(held: Held) -> None:
        """Stop waiting for a gone client: the write is dropped, the in-flight count freed."""
        held.respond(rejected(held.request, "unavailable", "connectionClosed", "closed"))

    # --- children --------------------------------------------------------------------------

    def _start(self, job: ValidationJob) -> None:
        sid = job.submission_id
        if sid in self._candidates:
            return  # one child per candidate
        config = self._config
        self._candidates[sid] = _Candidate(job, time.monotonic() + config.timeout_s)
        # One folder per run, so the run's deletion by state retention removes its logs.
        run_id = str(job.frame.get("runId") or "")
        logs = config.state_dir / "logs" / "validators"
        if _SAFE_NAME.fullmatch(run_id):
            logs = logs / run_id
        ensure_private_dir(logs)
        project = Path(job.frame.get("projectPath") or config.state_dir)
        self._channels.start(
            ChildSpec(
                sid,
                [sys.executable, "-m", VALIDATOR_MODULE],
                dict(os.environ),
                VALIDATOR_FD_ENV,
                cwd=project if project.is_dir() else config.state_dir,
                log_path=logs / f"validator-{uuid.uuid4().hex[:16]}.log",
                preloaded=VALIDATOR_MODULE,
                name="validator",
            )
        )

    def _on_frame(self, sid: str, channel: FrameSink, frame: Mapping[str, Any]) -> None:
        candidate = self._candidates.get(sid)
        if candidate is None or candidate.settling:
            return
        kind = frame.get("kind")
        if kind == "validation.ready":
            try:
                channel.send(candidate.job.frame)
            except FrameError:
                channel.close()  # checked before the spawn; a reject follows the close
        elif kind in _REPORTS:
            self._settle(sid, frame, "")
        else:
            channel.close()

    def _on_channel_ended(self, sid: str) -> None:
        candidate = self._candidates.get(sid)
        if candidate is None or candidate.settling:
            return
        if candidate.timed_out:
            reason = (
                f"validating the output took longer than {self._config.timeout_s:g} s; submit again"
            )
        else:
            reason = (
                "the validation child stopped before it reported a result; submit the output again"
            )
        self._settle(sid, None, reason)

    def _settle(self, sid: str, report: Mapping[str, Any] | None, reason: str) -> None:
        candidate = self._candidates.get(sid)
        if candidate is None or candidate.settling:
            return
        candidate.settling = True
        self._channels.kill(sid)  # nothing it started lingers
        unit = SettleValidation(sid, report, reason)
        self._database.tell(Transact(unit, self.actor_ref, _Settled(sid)))

    def _on_settled(self, sid: str, reply: Reply) -> None:
        candidate = self._candidates.pop(sid, None)
        if reply.error is None and reply.value.requeued and self._scheduler is not None:
            self._scheduler.tell(Wake())  # the accepted step's run is admissible again
        if candidate is None:
            return
        for waiter in candidate.waiters:
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
        for sid, candidate in self._candidates.items():
            if candidate.settling or candidate.timed_out or now < candidate.deadline:
                continue
            candidate.timed_out = True
            self._channels.kill(sid)
