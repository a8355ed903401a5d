"""The channel-adapter actor: one transport-only Telegram child per profile.

Implements workflow-server.md § Supervised channel adapters. The child gets the
complete operator presentation, its allowed identities and its one credential (in its
environment, never argv); it never gets a decision subject, opens SQLite or changes
run state. This actor proposes nothing on the child's word alone: before the child
sends or edits, the database actor reserves the attempt as a managed effect; the
child's result and its answers are recorded by the database actor, fenced by adapter
epoch, attempt and channel revision (`storage/_channels.py`). Children start through
the process supervisor (the one signaller); each start is a fresh adapter epoch.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Address, Done, Reply, ServerActor, answer
from pi_workflows.actors._database import Committed, Transact
from pi_workflows.actors._reader import Read
from pi_workflows.actors._scheduler import Wake
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import (
    AnswerFromChannel,
    AnswerOutcome,
    ChannelConfig,
    ChannelProfile,
    CountChannelWork,
    FindChannelWork,
    InterruptAdapter,
    ProfileScope,
    RecordChannelResult,
    ReserveChannelWork,
    WorkItem,
    failure_response,
    load_profiles,
    response,
)
from pi_workflows.storage import (
    DELIVER,
    ChannelAttempt,
    ChannelResult,
    SettledAttempt,
    ensure_private_dir,
)
from pi_workflows.supervision import (
    ChannelListener,
    ChildChannelClosed,
    ChildChannels,
    ChildEnded,
    ChildEvent,
    ChildExited,
    ChildFrame,
    ChildSpec,
    ChildStarted,
    FrameSink,
    crash_point,
)
from pi_workflows.wire.channel import ChannelSequenceCheck, ChannelStamp, check_message
from pi_workflows.wire.framing import FrameError
from pi_workflows.wire.protocol import ProtocolViolation

__all__ = [
    "ADAPTER_MODULE",
    "POLL_SECONDS_ENV",
    "RETRY_BOUND_ENV",
    "ChannelAdapterActor",
    "ChannelRequest",
    "ChannelsConfig",
    "ScanChannels",
    "StopAdapters",
]

log = logging.getLogger(__name__)

ADAPTER_MODULE: Final = "pi_workflows.engine.channel_adapter"
CHANNEL_FD_ENV: Final = "PI_WORKFLOWS_CHANNEL_FD"
"""The variable naming the child's end of its channel (`engine/channel_adapter.py`)."""
POLL_SECONDS_ENV: Final = "PI_WORKFLOWS_TELEGRAM_POLL_SECONDS"
RETRY_BOUND_ENV: Final = "PI_WORKFLOWS_CHANNEL_RETRY_BOUND_S"
"""Seconds a delivery's not-sent attempts go on before it is `failed` (default 600)."""
DEFAULT_RETRY_BOUND_S: Final = 600.0
SCAN_EVERY_S: Final = 2.0
"""A scan for work at least this often, besides the one after each commit."""
RESTART_BASE_S: Final = 1.0
RESTART_MAX_S: Final = 60.0
STOP_GRACE_TICKS: Final = 20
# Reasons after which a child is not restarted until `channel reload`.
_NO_RESTART: Final = frozenset({"unauthorized"})
# Environment a child inherits from the server (besides its own variables).
_INHERITED: Final = ("PATH", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")


@dataclass(frozen=True, slots=True)
class ChannelsConfig:
    state_dir: Path
    profiles_path: Path
    tick_s: float
    poll_seconds: str | None = None
    """`PI_WORKFLOWS_TELEGRAM_POLL_SECONDS` for the children (tests use 1)."""
    retry_bound_s: float = DEFAULT_RETRY_BOUND_S
    """How long not-sent attempts of one delivery go on (`RETRY_BOUND_ENV`)."""

    @staticmethod
    def retry_bound_from(value: str | None) -> float:
        """`RETRY_BOUND_ENV`'s value in seconds (the default when unset or unusable)."""
        try:
            seconds = float(value) if value else DEFAULT_RETRY_BOUND_S
        except ValueError:
            return DEFAULT_RETRY_BOUND_S
        return seconds if seconds >= 0 else DEFAULT_RETRY_BOUND_S


@dataclass(frozen=True, slots=True)
class ChannelRequest:
    """`channel.status` or `channel.reload` from the router; answered by this actor."""

    held: Any
    """The router's `Pending`: `request` and `respond(answer)`."""


@dataclass(frozen=True, slots=True)
class StopAdapters:
    """The server stops: stop every child and end its channel; `Done` once all ended
    (before the listener stops, so no channel outlives its loop)."""

    reply_to: Address


@dataclass(frozen=True, slots=True)
class ScanChannels:
    """Look for work now (an operator's `channel.recover` reopened a delivery)."""


@dataclass(frozen=True, slots=True)
class _Found:
    """Tag: a scan for work."""


@dataclass(frozen=True, slots=True)
class _Reserved:
    """Tag: one reservation of work for a child's adapter epoch."""

    item: WorkItem
    epoch: str


@dataclass(frozen=True, slots=True)
class _Recorded:
    """Tag: a child's result of a send or edit."""

    profile: str


@dataclass(frozen=True, slots=True)
class _Answered:
    """Tag: a person's answer a child forwarded."""

    profile: str


@dataclass(frozen=True, slots=True)
class _Interrupted:
    """Tag: a child's end, recorded (its in-flight attempts are ambiguous)."""

    profile: str
    epoch: str


@dataclass(frozen=True, slots=True)
class _Counted:
    """Tag: the counts of a `channel.status` or `channel.reload`."""

    held: Any


@dataclass
class _Child:
    profile: ChannelProfile
    epoch: str
    stamp: ChannelStamp
    check: ChannelSequenceCheck
    state: str = "starting"
    channel: FrameSink | None = None
    started: bool = False
    closed: bool = False
    reason: str | None = None
    stopping: bool = False


@dataclass
class _Status:
    state: str
    reason: str | None = None
    adapter_epoch: str | None = None
    failures: int = 0
    restart_at_tick: int | None = None


class ChannelAdapterActor(ServerActor):
    """Owns: the profiles (as last loaded), one adapter child per profile (its adapter
    epoch, channel, identity, envelope sequence in each direction, state), each
    profile's status and restart schedule, one scan for work in flight at most.

    Receives: `Tick`, `Committed`, `ChannelRequest` (status, reload), `ScanChannels`,
        `StopAdapters`, `ChildFrame`, `ChildChannelClosed`, `ChildExited`, and `Done`
        (its units' and spawns' answers).
    Sends: `Spawn`, `StopChild` to the process supervisor (through its `ChildChannels`);
        `Read` (`FindChannelWork`, `CountChannelWork`) to the reader; `Transact`
        (`ReserveChannelWork`, `RecordChannelResult`, `AnswerFromChannel`,
        `InterruptAdapter`) to the database; `channel.present`/`channel.settle` frames
        to children; responses.
    Invariants: a frame is sent only for an attempt the database reserved for that
        child's epoch; a frame is accepted only from the profile's current epoch in
        sequence; a child's in-flight attempts become ambiguous once its channel ended.
    On failure: the server stops; every applying attempt becomes ambiguous at the next
        start (recovery).
    """

    name = "channel-adapter"

    def __init__(
        self,
        config: ChannelsConfig,
        on_actor_failure: ActorFailureHandler,
        *,
        database: pykka.ActorRef[Any],
        reader: pykka.ActorRef[Any],
        supervisor: pykka.ActorRef[Any],
        listener: ChannelListener,
        scheduler: pykka.ActorRef[Any] | None = None,
    ) -> None:
        super().__init__(on_actor_failure)
        self._config = config
        self._scheduler = scheduler
        """Woken after an accepted answer queued the decision's continuation."""
        self._database = database
        self._reader = reader
        self._supervisor = supervisor
        self._listener = listener
        self._loaded = ChannelConfig("missing")
        self._children: dict[str, _Child] = {}
        self._status: dict[str, _Status] = {}
        self._ticks = 0
        self._scanning = False
        self._dirty = True
        self._reserving: set[WorkItem] = set()
        self._stopping = False
        self._stopped_reply_to: Address | None = None
        self._scan_every = max(1, round(SCAN_EVERY_S / config.tick_s))
        self._retry_tick: int | None = None
        """The tick at which the earliest not-sent attempt known here may go again."""
        self._processes: ChildChannels | None = None
        """The children's processes and channels, keyed by adapter epoch (`on_start`)."""

    def on_start(self) -> None:
        self._processes = ChildChannels(
            self.actor_ref,
            self._supervisor,
            self._listener,
            decode=functools.partial(check_message, sender="adapter"),
        )
        self._apply(load_profiles(self._config.profiles_path))

    @property
    def _channels(self) -> ChildChannels:
        assert self._processes is not None
        return self._processes

    def on_receive(self, message: Any) -> Any:
        match message:
            case Done():
                self._on_done(message)
            case ChildFrame():
                self._on_frame(message)
            case ChildExited() | ChildChannelClosed():
                self._on_child_events(message)
            case Tick():
                self._tick()
            case Committed() | ScanChannels():
                self._mark_dirty()
            case StopAdapters(reply_to=reply_to):
                self._stop_all(reply_to)
            case ChannelRequest(held=held):
                self._request(held)
            case _:
                raise TypeError(f"channel adapter actor got {type(message).__name__}")
        return None

    def _on_done(self, done: Done) -> None:
        """An answer: to a unit of work (its tag says which), or to a spawn."""
        match done.tag:
            case _Found():
                self._on_found(done.reply)
            case _Reserved(item=item, epoch=epoch):
                self._on_reserved(item, epoch, done.reply)
            case _Recorded(profile=profile):
                self._on_recorded(profile, done.reply)
            case _Answered(profile=profile):
                self._on_answered(profile, done.reply)
            case _Interrupted(profile=profile, epoch=epoch):
                self._on_interrupted(profile, epoch, done.reply)
            case _Counted(held=held):
                self._on_counted(held, done.reply)
            case _:
                self._on_child_events(done)

    def _on_child_events(self, message: object) -> None:
        self._apply_events(self._channels.handle(message))

    def _apply_events(self, events: list[ChildEvent]) -> None:
        for event in events:
            child = self._by_epoch(event.key)
            if child is None:
                continue
            match event:
                case ChildStarted():
                    self._on_spawned(child)
                case ChildChannelClosed():
                    self._on_channel_ended(child)
                case ChildEnded(exited=exited):
                    self._on_ended(child, exited)

    def _by_epoch(self, epoch: str) -> _Child | None:
        return next((c for c in self._children.values() if c.epoch == epoch), None)

    def on_stop(self) -> None:
        """The server stops: stop every child and end its channel (the supervisor kills
        what is left)."""
        self._stopping = True
        for child in self._children.values():
            self._stop_child(child)
        self._channels.close()

    def _stop_all(self, reply_to: Address) -> None:
        self._stopping = True
        self._stopped_reply_to = reply_to
        for child in list(self._children.values()):
            self._stop_child(child)
            # Its channel ends now (what it wrote is still read); an attempt in flight
            # becomes ambiguous, as after any stop while applying.
            self._apply_events(self._channels.end_input(child.epoch))
        self._maybe_stopped()

    def _maybe_stopped(self) -> None:
        if self._stopped_reply_to is not None and not self._children:
            reply_to, self._stopped_reply_to = self._stopped_reply_to, None
            answer(reply_to, None, Reply(True))

    # --- profiles ---------------------------------------------------------------------

    def _apply(self, loaded: ChannelConfig) -> None:
        """Start, keep or stop children so there is one per profile as loaded.

        A child whose credential, chat, users or API base changed is stopped; its end
        starts the new one (`_on_interrupted`), so two children of one profile never
        run at once. A change of what a profile serves needs no restart.
        """
        self._loaded = loaded
        for name, child in list(self._children.items()):
            new = loaded.profiles.get(name)
            if new is None or new.fingerprint() != child.profile.fingerprint():
                self._stop_child(child)
            else:
                child.profile = new
        for name in list(self._status):
            if name not in loaded.profiles and name not in self._children:
                del self._status[name]
        for name, profile in loaded.profiles.items():
            if name not in self._children:
                self._start(profile)
        if loaded.state == "refused":
            log.warning("channel profiles refused", extra={"action": "channel.profiles_refused"})
        self._mark_dirty()

    def _scopes(self) -> list[ProfileScope]:
        return [
            ProfileScope(child.profile.channel, child.profile.workflows, child.profile.decisions)
            for child in self._children.values()
            if child.state == "ready" and not child.stopping
        ]

    # --- children ---------------------------------------------------------------------

    def _start(self, profile: ChannelProfile) -> None:
        epoch = f"adapter-{uuid.uuid4().hex[:16]}"
        self._children[profile.name] = _Child(
            profile,
            epoch,
            ChannelStamp(epoch, profile.name),
            ChannelSequenceCheck(epoch, profile.name),
        )
        status = self._status.setdefault(profile.name, _Status("starting"))
        status.state, status.reason, status.adapter_epoch = "starting", None, epoch
        status.restart_at_tick = None
        logs = self._config.state_dir / "logs" / "channels"
        ensure_private_dir(logs)
        self._channels.start(
            ChildSpec(
                epoch,
                [sys.executable, "-m", ADAPTER_MODULE],
                self._child_env(profile, epoch),
                CHANNEL_FD_ENV,
                cwd=self._config.state_dir,
                log_path=logs / f"{profile.name}-{epoch}.log",
                name="channel-adapter",
            )
        )
        log.info(
            "channel adapter starting",
            extra={"action": "channel.starting", "profile": profile.name},
        )

    def _child_env(self, profile: ChannelProfile, epoch: str) -> dict[str, str]:
        """Only what the child needs: never the server's own secrets or state paths."""
        env = {key: os.environ[key] for key in _INHERITED if key in os.environ}
        env.update(
            {
                "PI_WORKFLOWS_ADAPTER_EPOCH": epoch,
                "PI_WORKFLOWS_CHANNEL_PROFILE": profile.name,
                "PI_WORKFLOWS_TELEGRAM_TOKEN": profile.bot_token,
                "PI_WORKFLOWS_TELEGRAM_CHAT_ID": str(profile.chat_id),
                "PI_WORKFLOWS_TELEGRAM_ALLOWED_USERS": ",".join(
                    str(user) for user in profile.allowed_user_ids
                ),
                "PI_WORKFLOWS_TELEGRAM_API_BASE": profile.api_base,
            }
        )
        if self._config.poll_seconds:
            env[POLL_SECONDS_ENV] = self._config.poll_seconds
        return env

    def _current(self, profile: str, epoch: str) -> _Child | None:
        child = self._children.get(profile)
        return child if child is not None and child.epoch == epoch else None

    def _on_spawned(self, child: _Child) -> None:
        child.started = True
        if child.stopping:
            self._stop_child(child)

    def _stop_child(self, child: _Child) -> None:
        child.stopping = True
        self._channels.stop(child.epoch, STOP_GRACE_TICKS)

    def _on_channel_ended(self, child: _Child) -> None:
        """Every frame it wrote was read: it may still run (the supervisor stops it)."""
        child.state = "exited"
        if not child.stopping:
            self._channels.stop(child.epoch, STOP_GRACE_TICKS)

    def _on_ended(self, child: _Child, exited: ChildExited | None) -> None:
        """Reaped (or never started), its channel at end of file: its in-flight attempts
        become ambiguous, then it is restarted or gone."""
        if child.closed:
            return
        child.closed = True
        child.state = "exited"
        if child.reason is None and not child.stopping:
            child.reason = "spawnFailed" if exited is None else f"exit {exited.returncode}"
        if exited is None:
            log.error("channel adapter not started", extra={"action": "channel.spawn_failed"})
        unit = InterruptAdapter(child.profile.channel, child.epoch)
        tag = _Interrupted(child.profile.name, child.epoch)
        self._database.tell(Transact(unit, self.actor_ref, tag, hold_when_full=True))

    def _on_interrupted(self, profile: str, epoch: str, reply: Reply) -> None:
        if reply.error is not None:
            # Not written: the attempts stay applying and the next start makes them
            # ambiguous; this server must not send them again meanwhile.
            raise reply.error
        if reply.value:
            log.warning(
                "channel attempts interrupted by the adapter's end are ambiguous",
                extra={"action": "channel.ambiguous", "profile": profile, "count": reply.value},
            )
        child = self._current(profile, epoch)
        if child is None:
            return
        del self._children[profile]
        self._maybe_stopped()
        status = self._status.get(profile)
        if status is None:
            return
        if child.stopping and not self._stopping:
            new = self._loaded.profiles.get(profile)
            if new is not None:
                self._start(new)  # a reload replaced its profile
            return
        status.state = "exited"
        status.reason = child.reason or "channel closed"
        log.warning(
            "channel adapter exited",
            extra={"action": "channel.exited", "profile": profile, "reason": status.reason},
        )
        if self._stopping or status.reason in _NO_RESTART:
            return
        status.failures += 1
        delay = min(RESTART_BASE_S * 2 ** (status.failures - 1), RESTART_MAX_S)
        status.restart_at_tick = self._ticks + max(1, round(delay / self._config.tick_s))

    # --- ticks and scans ----------------------------------------------------------------

    def _tick(self) -> None:
        self._ticks += 1
        if self._stopping:
            return
        for name, status in self._status.items():
            due = status.restart_at_tick
            if due is not None and self._ticks >= due and name not in self._children:
                profile = self._loaded.profiles.get(name)
                if profile is not None:
                    self._start(profile)
        if self._ticks % self._scan_every == 0:
            self._dirty = True
        if self._retry_tick is not None and self._ticks >= self._retry_tick:
            self._retry_tick, self._dirty = None, True
        self._scan()

    def _mark_dirty(self) -> None:
        self._dirty = True

    def _scan(self) -> None:
        if self._scanning or not self._dirty:
            return
        scopes = self._scopes()
        if not scopes:
            return
        self._dirty = False
        self._scanning = True
        self._reader.tell(Read(FindChannelWork(scopes), self.actor_ref, _Found()))

    def _child_for_channel(self, channel: str) -> _Child | None:
        for child in self._children.values():
            if child.profile.channel == channel and child.state == "ready" and not child.stopping:
                return child
        return None

    def _on_found(self, reply: Reply) -> None:
        self._scanning = False
        if reply.error is not None:
            log.error("channel scan failed", extra={"action": "channel.scan_failed"})
            return
        for item in reply.value:
            child = self._child_for_channel(item.channel)
            if child is None or item in self._reserving:
                continue
            self._reserving.add(item)
            unit = ReserveChannelWork(item, child.epoch)
            tag = _Reserved(item, child.epoch)
            self._database.tell(Transact(unit, self.actor_ref, tag, hold_when_full=True))

    def _on_reserved(self, item: WorkItem, epoch: str, reply: Reply) -> None:
        self._reserving.discard(item)
        if reply.error is not None:
            log.error("channel reservation failed", extra={"action": "channel.reserve_failed"})
            return
        attempt: ChannelAttempt | None = reply.value
        if attempt is None:
            return
        crash_point("server.channel.after_reserve")
        child = next((c for c in self._children.values() if c.epoch == epoch), None)
        if child is None or child.channel is None or child.closed:
            return  # it ended: its end makes this attempt ambiguous (same database order)
        frame: dict[str, Any] = {
            **child.stamp.envelope(),
            "attemptId": attempt.attempt_id,
            "channelRevision": attempt.channel_revision,
        }
        if attempt.kind == DELIVER:
            frame["kind"] = "channel.present"
            frame["presentation"] = attempt.request["presentation"]
        else:
            frame["kind"] = "channel.settle"
            frame["messageIds"] = attempt.request["messageIds"]
            frame["text"] = attempt.request["text"]
        try:
            check_message(frame, sender="server")
            child.channel.send(frame)
            crash_point("server.channel.after_send")
        except (ProtocolViolation, FrameError):
            # Reserved but never sent: the child's end (we close it) makes it ambiguous;
            # the operator decides. Never expected: the presentation is bounded.
            log.exception("channel frame refused", extra={"action": "channel.frame_refused"})
            child.channel.close()

    # --- frames from a child ------------------------------------------------------------

    def _on_frame(self, message: ChildFrame) -> None:
        child = self._by_epoch(message.key)
        if child is None:
            log.warning("frame from a stale adapter refused", extra={"action": "channel.stale"})
            with contextlib.suppress(Exception):
                message.channel.close()
            return
        frame = message.message  # checked against channel.v1 where it was read
        try:
            _in_sequence(child, frame)
        except ProtocolViolation:
            log.warning(
                "bad frame from a channel adapter; closing its channel",
                extra={"action": "channel.rejected", "profile": child.profile.name},
            )
            message.channel.close()
            return
        child.channel = message.channel
        kind = frame["kind"]
        if kind == "channel.ready":
            self._on_ready(child)
        elif kind in ("channel.present", "channel.settle"):
            self._record(child, frame)
        elif kind == "channel.answer":
            self._answer(child, frame)
        elif kind == "channel.exiting":
            child.reason = str(frame.get("reason", "exiting"))[:64]

    def _on_ready(self, child: _Child) -> None:
        child.state = "ready"
        status = self._status.setdefault(child.profile.name, _Status("ready"))
        status.state, status.reason, status.failures = "ready", None, 0
        status.adapter_epoch = child.epoch
        log.info(
            "channel adapter ready",
            extra={"action": "channel.ready", "profile": child.profile.name},
        )
        self._dirty = True
        self._scan()

    def _record(self, child: _Child, frame: dict[str, Any]) -> None:
        raw = frame["result"]
        result = ChannelResult(
            status=raw["status"],
            message_ids=tuple(raw.get("messageIds", ())),
            http_status=raw.get("httpStatus"),
            reason=raw.get("reason"),
            retry_after_ms=raw.get("retryAfterMs"),
        )
        unit = RecordChannelResult(
            child.profile.channel,
            child.epoch,
            frame["attemptId"],
            frame["channelRevision"],
            result,
            round(self._config.retry_bound_s * 1000),
        )
        tag = _Recorded(child.profile.name)
        self._database.tell(Transact(unit, self.actor_ref, tag, hold_when_full=True))

    def _on_recorded(self, profile: str, reply: Reply) -> None:
        if reply.error is not None:
            log.error("channel result not recorded", extra={"action": "channel.result_failed"})
            return
        settled: SettledAttempt | None = reply.value
        if settled is None:
            log.warning(
                "stale channel result refused",
                extra={"action": "channel.stale", "profile": profile},
            )
            return
        crash_point("server.channel.after_result")
        log.info(
            "channel attempt settled",
            extra={
                "action": "channel.settled",
                "profile": profile,
                "operation": settled.kind,
                "outcome": settled.state,
                "run_id": settled.run_id,
            },
        )
        if settled.retry_at is not None:
            self._wake_for_retry(settled.retry_at)
        self._dirty = True
        self._scan()

    def _wake_for_retry(self, retry_at: int) -> None:
        """Scan again when a not-sent attempt may go again (the stored `retry_at` is
        what holds it back; this only saves waiting for the next regular scan)."""
        delay_s = max(0.0, retry_at / 1000 - time.time())
        due = self._ticks + max(1, int(delay_s / self._config.tick_s) + 1)
        if self._retry_tick is None or due < self._retry_tick:
            self._retry_tick = due

    def _answer(self, child: _Child, frame: dict[str, Any]) -> None:
        name = child.profile.name
        unit = AnswerFromChannel(
            child.profile.channel, name, frame["eventId"], dict(frame["answer"])
        )
        tag = _Answered(name)
        # The child confirmed the update: a full disk must not drop it, nor run it ahead
        # of the result before it (a reply needs that result's message IDs).
        self._database.tell(Transact(unit, self.actor_ref, tag, hold_when_full=True))

    def _on_answered(self, profile: str, reply: Reply) -> None:
        if reply.error is not None:
            log.error("channel answer failed", extra={"action": "channel.answer_failed"})
            return
        outcome: AnswerOutcome = reply.value
        if outcome.outcome == "accepted" and self._scheduler is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                self._scheduler.tell(Wake())
        log.info(
            "channel answer",
            extra={
                "action": "channel.answer",
                "profile": profile,
                "outcome": outcome.outcome,
                "reason": outcome.code,
                "run_id": outcome.run_id,
            },
        )
        self._dirty = True
        self._scan()

    # --- status and reload ----------------------------------------------------------------

    def _request(self, held: Any) -> None:
        operation = held.request["operation"]
        if operation == "channel.reload":
            self._apply(load_profiles(self._config.profiles_path))
        channels = [profile.channel for profile in self._loaded.profiles.values()]
        self._reader.tell(Read(CountChannelWork(channels), self.actor_ref, _Counted(held)))

    def _on_counted(self, held: Any, reply: Reply) -> None:
        if reply.error is not None:
            held.respond(failure_response(held.request, reply.error))
            return
        counts = reply.value
        profiles = []
        for name, profile in sorted(self._loaded.profiles.items()):
            status = self._status.get(name, _Status("stopped"))
            count = counts.get(profile.channel)
            item: dict[str, Any] = {
                "profile": name,
                "state": status.state,
                "pending": count.pending if count is not None else 0,
                "retrying": count.retrying if count is not None else 0,
                "ambiguous": count.ambiguous if count is not None else 0,
                "failed": count.failed if count is not None else 0,
                "workflows": sorted(profile.workflows),
                "decisions": sorted(profile.decisions),
            }
            if status.reason is not None:
                item["reason"] = status.reason
            profiles.append(item)
        receipt: dict[str, Any] = {"config": self._loaded.state, "profiles": profiles}
        if self._loaded.error is not None:
            receipt["error"] = self._loaded.error
        if held.request["operation"] == "channel.reload":
            receipt["reloaded"] = True
        held.respond(response(held.request, "accepted", receipt=receipt))


def _in_sequence(child: _Child, frame: dict[str, Any] | None) -> None:
    """Check a frame that passed `channel.v1` against the child's epoch and sequence.

    Raises:
        ProtocolViolation: it broke the protocol (`frame` None), or is out of sequence.
    """
    if frame is None:
        raise ProtocolViolation("the frame broke channel.v1", schema_name="channel.v1")
    child.check.check(frame)  # type: ignore[arg-type]
