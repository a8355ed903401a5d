"""The resource-runners actor: claims due resource keys and runs each pass in a child.

Implements workflow-server.md § Resource managers and § Worker scheduling, server side:
the scheduler (the one decider) claims due keys within the capacity shared with workflow
runners, alternating with workflow admissions, and hands them here (`StartPasses`); each
pass runs in its own resource runner child (`pi_workflows.engine.resource_runner`, forked
by the zygote, on a private `ChildChannels` channel), and the child's proposal commits
under the pass's claim and CAS (`CommitReconcile`). A pass's `ctx.workflows.ensure` and
`ctx.effects.ensure` requests are answered through the database actor under the same
claim (`EnsureChildRun`, `ReserveResourceEffect`, `SettleResourceEffect`,
`RetryResourceEffect`). A child that dies without an outcome,
or overruns its deadline (stopped through the process supervisor), commits an `error`
pass, so the key backs off. Recovery step 7 returns every claim a dead server left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Done, Reply, ServerActor
from pi_workflows.actors._database import Committed, Transact
from pi_workflows.actors._scheduler import AdmitReconciles, StartPasses, Wake
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import (
    ChildRunAnswer,
    CommitReconcile,
    EnsureChildRun,
    ReleaseReconcileClaim,
    ReserveResourceEffect,
    RetryResourceEffect,
    SettleResourceEffect,
    pass_result_from_proposal,
    remove_resource_log,
    resource_log_path,
)
from pi_workflows.engine.resource_runner import RESOURCE_RUNNER_FD_ENV
from pi_workflows.storage import (
    ClaimedReconcile,
    ClaimLostError,
    Clock,
    EffectConflictError,
    PassResult,
    ReconcileCommit,
    ResourceEffect,
    ResourceLimitError,
    ResourceVersionConflictError,
    ensure_private_dir,
)
from pi_workflows.supervision import (
    ChannelListener,
    ChildChannelClosed,
    ChildChannels,
    ChildEnded,
    ChildExited,
    ChildFrame,
    ChildSpec,
    crash_point,
)
from pi_workflows.wire.framing import FrameError
from pi_workflows.wire.resource_runner import (
    ChildRunAnswered,
    ChildRunRequested,
    EffectAnswered,
    EffectRequested,
    PassFailed,
    PassProposed,
    PassStart,
    RunnerReadyForPass,
    decode_child_frame,
)

__all__ = [
    "CLAIM_GRACE_MS",
    "DEFAULT_RECONCILE_DEADLINE_S",
    "RECONCILE_DEADLINE_ENV",
    "RESOURCE_RUNNER_MODULE",
    "ResourceRunnersActor",
    "ResourceRunnersConfig",
    "StartReconciling",
    "reconcile_deadline_from_env",
]

log = logging.getLogger(__name__)

RESOURCE_RUNNER_MODULE = "pi_workflows.engine.resource_runner"
DEFAULT_RECONCILE_DEADLINE_S = 60.0
"""How long one pass may run before its child is stopped and the key backs off."""
RECONCILE_DEADLINE_ENV = "PI_WORKFLOWS_RECONCILE_DEADLINE_S"
CLAIM_GRACE_MS = 30_000
"""A pass's claim outlives its deadline by this much: the child is stopped, reaped and
its `error` committed before the claim could expire and let another pass in."""


def reconcile_deadline_from_env(environ: Mapping[str, str] | None = None) -> float:
    """`PI_WORKFLOWS_RECONCILE_DEADLINE_S` as seconds from 0.1 to 3600, or 60.

    Raises:
        ValueError: the value is not such a number (the server does not start).
    """
    raw = (environ if environ is not None else os.environ).get(RECONCILE_DEADLINE_ENV, "")
    if not raw.strip():
        return DEFAULT_RECONCILE_DEADLINE_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0.1 <= value <= 3600:
        raise ValueError(f"{RECONCILE_DEADLINE_ENV} must be a number of seconds from 0.1 to 3600")
    return value


@dataclass(frozen=True, slots=True)
class ResourceRunnersConfig:
    """Facts fixed for one server."""

    owner_id: str
    state_dir: Path
    capacity: int
    """`PI_WORKFLOWS_MAX_WORKERS`: shared with workflow runners."""
    clock: Clock
    deadline_s: float = DEFAULT_RECONCILE_DEADLINE_S
    agent_dir: Path | None = None
    """Pi's agent folder, where a pass's child workflows are discovered too."""


@dataclass(frozen=True, slots=True)
class StartReconciling:
    """From the server once children can start (after startup recovery returned every
    claim, step 7): the first plan."""


@dataclass(frozen=True, slots=True)
class _Committed:
    """Tag: a pass's commit (or the release after a refused commit)."""

    key: str
    result: PassResult | None


@dataclass(frozen=True, slots=True)
class _ChildEnsured:
    """Tag: a pass's `ctx.workflows.ensure`, answered to its child."""

    key: str


@dataclass(frozen=True, slots=True)
class _EffectStepped:
    """Tag: a pass's `ctx.effects.ensure` step, answered to its child."""

    key: str


@dataclass
class _Pass:
    """One pass in flight: its claim, its child's deadline and what the child said."""

    claimed: ClaimedReconcile
    deadline: float
    """`time.monotonic()` at which the child is stopped."""
    started_ms: int
    outcome: PassProposed | PassFailed | None = None
    channel: Any = None
    """The child's channel once it said ready: the pass's requests are answered on it."""
    timed_out: bool = False
    committing: bool = False


class ResourceRunnersActor(ServerActor):
    """Owns: every resource pass in flight (`_Pass`, by reconcile ID) and its child's
    channel (`ChildChannels`).

    Receives: `StartReconciling`, `StartPasses` (keys the scheduler admitted and
        claimed), `Tick`, `Wake`, `Committed` (any commit may have enqueued a key),
        `ChildFrame`, `ChildChannelClosed`, `ChildExited`, and `Done` (its units' and
        spawns' answers).
    Sends: `Transact` (`CommitReconcile`,
        `ReleaseReconcileClaim`) to the database; `Spawn`, `KillChild` to the process
        supervisor (through its `ChildChannels`); `AdmitReconciles` and `Wake` to the
        scheduler, which alone decides which keys start.
    Invariants: no pass starts before startup recovery returned the claims (step 7); a
        pass commits only once its child is reaped and its channel drained, so two
        passes of a key never run at once; every claimed pass commits one outcome or
        releases its claim.
    On failure: reported to the server, which stops; claims expire (or the next start
        returns them) and the keys are reconciled again.
    """

    name = "resource-runners"

    def __init__(
        self,
        config: ResourceRunnersConfig,
        on_actor_failure: ActorFailureHandler,
        *,
        database: pykka.ActorRef[Any],
        supervisor: pykka.ActorRef[Any],
        listener: ChannelListener,
        scheduler: pykka.ActorRef[Any] | None = None,
    ) -> None:
        super().__init__(on_actor_failure)
        self._config = config
        self._database = database
        self._supervisor = supervisor
        self._listener = listener
        self._scheduler = scheduler
        self._passes: dict[str, _Pass] = {}
        self._children: ChildChannels | None = None
        """Made in `on_start`, once this actor's own address exists."""
        self._started = False

    def on_start(self) -> None:
        self._children = ChildChannels(
            self.actor_ref, self._supervisor, self._listener, decode=decode_child_frame
        )

    def on_stop(self) -> None:
        """The server stops: channels end, the supervisor kills the children; their
        claims are returned by the next start (recovery step 7)."""
        self._channels.close()

    @property
    def _channels(self) -> ChildChannels:
        assert self._children is not None
        return self._children

    def on_receive(self, message: Any) -> Any:
        match message:
            case StartReconciling():
                # Startup recovery (step 7) already returned every claim a dead server
                # held: the scheduler may admit due keys now.
                self._started = True
                self._admit_reconciles()
            case StartPasses(claimed=claimed):
                for each in claimed:
                    self._start(each)
            case Done(tag=_Committed(key=key, result=result), reply=reply):
                self._on_committed(key, result, reply)
            case Done(tag=_ChildEnsured() | _EffectStepped()):
                self._on_request_done(message)
            case Tick():
                self._stop_overdue()
            case Wake() | Committed():
                self._wake_scheduler()
            case ChildFrame():
                self._on_frame(message)
            case Done() | ChildExited() | ChildChannelClosed():
                for event in self._channels.handle(message):
                    if isinstance(event, ChildEnded):
                        self._on_ended(event.key)
            case _:
                raise TypeError(f"resource runners got {type(message).__name__}")
        return None

    def _transact(self, unit: object, tag: object) -> None:
        # A full disk delays passes (`hold_when_full`); it is not an error.
        self._database.tell(Transact(unit, self.actor_ref, tag, hold_when_full=True))

    # --- planning --------------------------------------------------------------------------

    def _admit_reconciles(self) -> None:
        """Recovery step 7 is done: the scheduler may admit (and claim) due keys."""
        if self._scheduler is None:
            return
        ttl_ms = round(self._config.deadline_s * 1000) + CLAIM_GRACE_MS
        with contextlib.suppress(pykka.ActorDeadError):
            self._scheduler.tell(AdmitReconciles(self.actor_ref, ttl_ms))

    def _wake_scheduler(self) -> None:
        """A key may be due, or a slot free: the scheduler decides (one decider)."""
        if self._started and self._scheduler is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                self._scheduler.tell(Wake())

    # --- passes ----------------------------------------------------------------------------

    def _start(self, claimed: ClaimedReconcile) -> None:
        config, resource = self._config, claimed.resource
        key = claimed.claim.reconcile_id
        self._passes[key] = _Pass(
            claimed, time.monotonic() + config.deadline_s, config.clock.now_ms()
        )
        if not isinstance(resource.source_identity.get("path"), str):
            self._passes[key].outcome = PassFailed("badSource")
            self._commit(key)
            return
        logs = config.state_dir / "logs" / "resource-runners"
        ensure_private_dir(logs)
        project = Path(resource.project_path)
        self._channels.start(
            ChildSpec(
                key,
                [sys.executable, "-m", RESOURCE_RUNNER_MODULE],
                dict(os.environ),
                RESOURCE_RUNNER_FD_ENV,
                cwd=project if project.is_dir() else config.state_dir,
                # One file per resource, truncated by each pass: the last pass's log
                # (a manager's traceback) stays, and a polling key never piles up files.
                log_path=resource_log_path(config.state_dir, resource.uid),
                preloaded=RESOURCE_RUNNER_MODULE,
                name="resource-runner",
            )
        )
        log.info(
            "reconcile pass started",
            extra={"action": "resource.pass_started", "reconcile_id": key},
        )

    def _on_frame(self, frame: ChildFrame) -> None:
        running = self._passes.get(frame.key)
        if running is None or running.outcome is not None or running.timed_out:
            return
        match frame.message:
            case ChildRunRequested():
                claim = running.claimed.claim
                unit = EnsureChildRun(
                    claim,
                    request_key=frame.message.request_key,
                    input_fingerprint=frame.message.input_fingerprint,
                    workflow_name=frame.message.workflow,
                    resolved=frame.message.resolved,
                )
                self._transact(unit, _ChildEnsured(frame.key))
            case EffectRequested():
                self._transact(_effect_unit(running, frame.message), _EffectStepped(frame.key))
            case RunnerReadyForPass():
                running.channel = frame.channel
                try:
                    frame.channel.send(self._start_frame(running).to_wire())
                except FrameError:  # a spec and status past one frame: never a crash here
                    running.outcome = PassFailed("resourceTooLarge")
                    self._channels.kill(frame.key)
            case PassProposed() | PassFailed():
                running.outcome = frame.message
                self._channels.kill(frame.key)  # its work is done; nothing it started stays
            case _:
                running.outcome = PassFailed("protocolError")
                self._channels.kill(frame.key)

    def _on_request_done(self, done: Done) -> None:
        """A pass's request was answered by the database: pass the answer on."""
        tag, reply = done.tag, done.reply
        if isinstance(tag, _ChildEnsured):
            self._on_child_ensured(tag.key, reply)
        elif isinstance(tag, _EffectStepped):
            self._answer(tag.key, _effect_answer(reply))

    def _on_child_ensured(self, key: str, reply: Reply) -> None:
        answer: ChildRunAnswer | None = reply.value if reply.error is None else None
        if answer is not None and answer.created:
            # Durable: the reservation and the queued run committed together.
            crash_point("server.resource.ensure.child_reserved")
            if self._scheduler is not None:  # the new run waits in the queue
                with contextlib.suppress(pykka.ActorDeadError):
                    self._scheduler.tell(Wake())
        if answer is None:
            code = "claimLost" if isinstance(reply.error, ClaimLostError) else "ensureFailed"
            self._answer(key, ChildRunAnswered(None, error_code=code, error=code))
            return
        self._answer(
            key,
            ChildRunAnswered(
                answer.run_id, answer.state, answer.output, answer.error_code, answer.error
            ),
        )

    def _answer(self, key: str, answer: ChildRunAnswered | EffectAnswered) -> None:
        """Send an answer to a pass still waiting for it (a stopped one gets nothing)."""
        running = self._passes.get(key)
        if running is None or running.outcome is not None or running.channel is None:
            return
        try:
            running.channel.send(answer.to_wire())
        except (FrameError, OSError):  # too large, or the child is gone: the pass fails
            running.outcome = PassFailed("answerFailed")
            self._channels.kill(key)

    def _start_frame(self, running: _Pass) -> PassStart:
        resource = running.claimed.resource
        remaining = max(1, round((running.deadline - time.monotonic()) * 1000))
        return PassStart(
            manager=resource.manager,
            path=str(resource.source_identity["path"]),
            source_digest=resource.source_digest,
            reconcile_id=running.claimed.claim.reconcile_id,
            resource={
                "manager": resource.manager,
                "key": resource.key,
                "uid": resource.uid,
                "generation": resource.generation,
                "resourceVersion": resource.resource_version,
                "spec": resource.spec,
                "status": resource.status,
                "conditions": list(resource.conditions),
                "deletionRequested": resource.deletion_requested_at is not None,
                "finalizers": list(resource.finalizers),
            },
            deadline_ms=remaining,
            project_path=resource.project_path,
            agent_dir=None if self._config.agent_dir is None else str(self._config.agent_dir),
        )

    def _stop_overdue(self) -> None:
        now = time.monotonic()
        for key, running in self._passes.items():
            if running.outcome is None and not running.timed_out and now >= running.deadline:
                running.timed_out = True
                log.warning(
                    "reconcile pass overran its deadline; stopping it",
                    extra={"action": "resource.pass_timed_out", "reconcile_id": key},
                )
                self._channels.kill(key)  # the supervisor signals the child's group

    def _on_ended(self, key: str) -> None:
        """Reaped and drained: only now may the key's next pass start."""
        if key in self._passes:
            self._commit(key)

    def _commit(self, key: str) -> None:
        running = self._passes[key]
        if running.committing:
            return
        running.committing = True
        result = self._result(running)
        self._transact(CommitReconcile(running.claimed.claim, result), _Committed(key, result))

    def _result(self, running: _Pass) -> PassResult:
        duration = max(0, self._config.clock.now_ms() - running.started_ms)
        outcome = running.outcome
        if isinstance(outcome, PassProposed):
            try:
                return pass_result_from_proposal(running.claimed.claim, outcome.result, duration)
            except ValueError:
                return _error("invalidResult", duration)
        if isinstance(outcome, PassFailed):
            return _error(outcome.error_class, duration)
        return _error("deadlineExceeded" if running.timed_out else "runnerExited", duration)

    def _on_committed(self, key: str, result: PassResult | None, reply: Reply) -> None:
        running = self._passes.get(key)
        if running is None:
            return
        claim = running.claimed.claim
        error = reply.error
        if isinstance(error, ResourceLimitError) and result is not None:
            # The proposal broke a bound storage checks: the pass is an error.
            retry = _error("invalidResult", result.duration_ms or 0)
            self._transact(CommitReconcile(claim, retry), _Committed(key, None))
            return
        if isinstance(error, ResourceVersionConflictError) and result is not None:
            # A new spec or a deletion arrived during the pass: it read an old version.
            self._transact(ReleaseReconcileClaim(claim), _Committed(key, None))
            return
        del self._passes[key]
        if isinstance(reply.value, ReconcileCommit) and reply.value.removed:
            # The last finalizer went: the resource is gone, and so is its pass log.
            remove_resource_log(self._config.state_dir, reply.value.uid)
        outcome = result.outcome if result is not None else "released"
        if error is not None:
            log.warning(
                "reconcile pass not committed",
                extra={"action": "resource.commit_refused", "reason": type(error).__name__},
            )
        else:
            log.info(
                "reconcile pass committed",
                extra={"action": "resource.pass_committed", "reconcile_id": key, "reason": outcome},
            )
        self._wake_scheduler()  # a slot of the shared capacity is free again


def _effect_unit(
    running: _Pass, step: EffectRequested
) -> ReserveResourceEffect | SettleResourceEffect | RetryResourceEffect:
    claim = running.claimed.claim
    if step.op == "reserve":
        return ReserveResourceEffect(claim, step.key, step.kind, step.request)
    if step.op == "retry":
        return RetryResourceEffect(claim, step.key)
    outcome: Literal["applied", "rejected"] = "applied" if step.outcome == "applied" else "rejected"
    return SettleResourceEffect(
        claim, step.key, outcome, step.result, step.error, observed=step.observed
    )


def _effect_answer(reply: Reply) -> EffectAnswered:
    if reply.error is not None:
        error = reply.error
        if isinstance(error, EffectConflictError):
            code = str(getattr(error, "reason", "effectConflict"))
        elif isinstance(error, ClaimLostError):
            code = "claimLost"
        else:
            code = "effectFailed"
        return EffectAnswered(None, error_code=code, error=code)
    effect: ResourceEffect = reply.value
    return EffectAnswered(effect.decision.value, effect.state, effect.result, effect.error)


def _error(error_class: str, duration_ms: int) -> PassResult:
    return PassResult(outcome="error", error_class=error_class, duration_ms=duration_ms)
