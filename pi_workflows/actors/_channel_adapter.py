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
import socket
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Reply, ServerActor, tell_if_alive
from pi_workflows.actors._database import Committed, Transact
from pi_workflows.actors._process_supervisor import ChildExited, Spawn, StopChild
from pi_workflows.actors._reader import Read
from pi_workflows.actors._scheduler import Wake
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import (
    AnswerOutcome,
    ChannelConfig,
    ChannelProfile,
    ProfileScope,
    WorkItem,
    answer_from_channel,
    counts_by_channel,
    failure_response,
    find_work,
    interrupt_adapter,
    load_profiles,
    record_result,
    reserve_work,
    response,
)
from pi_workflows.storage import (
    DELIVER,
    ChannelAttempt,
    ChannelResult,
    SettledAttempt,
    ensure_private_dir,
)
from pi_workflows.supervision import ProcessIdentity
from pi_workflows.wire.channel import ChannelSequenceCheck, ChannelStamp, check_message
from pi_workflows.wire.framing import FrameError
from pi_workflows.wire.protocol import ProtocolViolation

__all__ = [
    "ADAPTER_MODULE",
    "POLL_SECONDS_ENV",
    "ChannelAdapterActor",
    "ChannelRequest",
    "ChannelsConfig",
    "ScanChannels",
    "StopAdapters",
]

log = logging.getLogger(__name__)

ADAPTER_MODULE: Final = "pi_workflows.engine.channel_adapter"
POLL_SECONDS_ENV: Final = "PI_WORKFLOWS_TELEGRAM_POLL_SECONDS"
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


@dataclass(frozen=True, slots=True)
class ChannelRequest:
    """`channel.status` or `channel.reload` from the router; answered by this actor."""

    held: Any
    """The router's `Pending`: `request` and `respond(answer)`."""


@dataclass(frozen=True, slots=True)
class StopAdapters:
    """The server stops: stop every child and end its channel; reply once all ended
    (before the listener stops, so no channel outlives its loop)."""

    reply: Callable[[Reply], None]


@dataclass(frozen=True, slots=True)
class ScanChannels:
    """Look for work now (an operator's `channel.recover` reopened a delivery)."""


@dataclass(frozen=True, slots=True)
class _Frame:
    profile: str
    epoch: str
    channel: Any
    message: dict[str, Any] = field(repr=False)


@dataclass(frozen=True, slots=True)
class _ChannelEnded:
    profile: str
    epoch: str


@dataclass(frozen=True, slots=True)
class _Spawned:
    profile: str
    epoch: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class _Exited:
    profile: str
    epoch: str
    exited: ChildExited


@dataclass(frozen=True, slots=True)
class _Found:
    reply: Reply


@dataclass(frozen=True, slots=True)
class _Reserved:
    item: WorkItem
    epoch: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class _Recorded:
    profile: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class _Answered:
    profile: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class _Interrupted:
    profile: str
    epoch: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class _Counted:
    held: Any
    reply: Reply


@dataclass
class _Child:
    profile: ChannelProfile
    epoch: str
    socket: socket.socket
    stamp: ChannelStamp
    check: ChannelSequenceCheck
    state: str = "starting"
    channel: Any | None = None
    identity: ProcessIdentity | None = None
    exited: bool = False
    closed: bool = False
    interrupted: bool = False
    reason: str | None = None
    stopping: bool = False


@dataclass
class _Status:
    state: str
    reason: str | None = None
    adapter_epoch: str | None = None
    failures: int = 0
    restart_at_tick: int | None = None


def _reply_to(actor: pykka.ActorRef[Any], make: Callable[[Reply], Any], reply: Reply) -> None:
    tell_if_alive(actor, make(reply))


class AdapterChannel:
    """The listener's handler for one adapter child's channel (on the listener's loop)."""

    def __init__(self, actor: pykka.ActorRef[Any], profile: str, epoch: str) -> None:
        self._actor = actor
        self._profile = profile
        self._epoch = epoch

    def on_message(self, channel: Any, message: dict[str, Any]) -> None:
        tell_if_alive(self._actor, _Frame(self._profile, self._epoch, channel, message))

    def on_close(self, channel: Any) -> None:
        tell_if_alive(self._actor, _ChannelEnded(self._profile, self._epoch))


class ChannelAdapterActor(ServerActor):
    """Owns: the profiles (as last loaded), one adapter child per profile (its adapter
    epoch, channel, identity, envelope sequence in each direction, state), each
    profile's status and restart schedule, one scan for work in flight at most.

    Receives: `Tick`, `Committed`, `ChannelRequest` (status, reload), `ScanChannels`,
        and its own replies (spawn, frames, channel end, exit, database units).
    Sends: `Spawn`, `StopChild` to the process supervisor; `Read` (`find_work`,
        `counts_by_channel`) to the reader; `Transact` (`reserve_work`,
        `record_result`, `answer_from_channel`, `interrupt_adapter`) to the database;
        `channel.present`/`channel.settle` frames to children; responses.
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
        listener: Any,
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
        self._stopped_reply: Callable[[Reply], None] | None = None
        self._scan_every = max(1, round(SCAN_EVERY_S / config.tick_s))

    def on_start(self) -> None:
        self._apply(load_profiles(self._config.profiles_path))

    def on_receive(self, message: Any) -> Any:
        handler = self._routes.get(type(message))
        if handler is None:
            raise TypeError(f"channel adapter actor got {type(message).__name__}")
        handler(message)
        return None

    @functools.cached_property
    def _routes(self) -> dict[type, Callable[[Any], None]]:
        return {
            Tick: lambda m: self._tick(),
            Committed: lambda m: self._mark_dirty(),
            ScanChannels: lambda m: self._mark_dirty(),
            StopAdapters: lambda m: self._stop_all(m.reply),
            ChannelRequest: lambda m: self._request(m.held),
            _Frame: self._on_frame,
            _ChannelEnded: lambda m: self._on_channel_ended(m.profile, m.epoch),
            _Spawned: lambda m: self._on_spawned(m.profile, m.epoch, m.reply),
            _Exited: lambda m: self._on_exited(m.profile, m.epoch, m.exited),
            _Found: lambda m: self._on_found(m.reply),
            _Reserved: lambda m: self._on_reserved(m.item, m.epoch, m.reply),
            _Recorded: lambda m: self._on_recorded(m.profile, m.reply),
            _Answered: lambda m: self._on_answered(m.profile, m.reply),
            _Interrupted: lambda m: self._on_interrupted(m.profile, m.epoch, m.reply),
            _Counted: lambda m: self._on_counted(m.held, m.reply),
        }

    def on_stop(self) -> None:
        """The server stops: stop every child (the supervisor kills what is left)."""
        self._stopping = True
        for child in self._children.values():
            self._stop_child(child)

    def _stop_all(self, reply: Callable[[Reply], None]) -> None:
        self._stopping = True
        self._stopped_reply = reply
        for child in list(self._children.values()):
            self._stop_child(child)
            # Its channel ends now (what it wrote is still read); an attempt in flight
            # becomes ambiguous, as after any stop while applying.
            self._end_input(child)
        self._maybe_stopped()

    def _maybe_stopped(self) -> None:
        if self._stopped_reply is not None and not self._children:
            reply, self._stopped_reply = self._stopped_reply, None
            reply(Reply(True))

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
        server_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        me = self.actor_ref
        self._listener.attach_channel_nowait(
            server_end, AdapterChannel(me, profile.name, epoch), "channel-adapter"
        )
        self._children[profile.name] = _Child(
            profile,
            epoch,
            server_end,
            ChannelStamp(epoch, profile.name),
            ChannelSequenceCheck(epoch, profile.name),
        )
        status = self._status.setdefault(profile.name, _Status("starting"))
        status.state, status.reason, status.adapter_epoch = "starting", None, epoch
        status.restart_at_tick = None
        logs = self._config.state_dir / "logs" / "channels"
        ensure_private_dir(logs)
        name = profile.name
        self._supervisor.tell(
            Spawn(
                [sys.executable, "-m", ADAPTER_MODULE],
                self._child_env(profile, epoch, child_end.fileno()),
                lambda reply: tell_if_alive(me, _Spawned(name, epoch, reply)),
                lambda exited: tell_if_alive(me, _Exited(name, epoch, exited)),
                cwd=self._config.state_dir,
                log_path=logs / f"{name}-{epoch}.log",
                pass_fds=(child_end.detach(),),
            )
        )
        log.info("channel adapter starting", extra={"action": "channel.starting", "profile": name})

    def _child_env(self, profile: ChannelProfile, epoch: str, fd: int) -> dict[str, str]:
        """Only what the child needs: never the server's own secrets or state paths."""
        env = {key: os.environ[key] for key in _INHERITED if key in os.environ}
        env.update(
            {
                "PI_WORKFLOWS_CHANNEL_FD": str(fd),
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

    def _on_spawned(self, profile: str, epoch: str, reply: Reply) -> None:
        child = self._current(profile, epoch)
        if child is None:
            if reply.error is None:  # replaced meanwhile: stop the one that started
                self._supervisor.tell(StopChild(reply.value, STOP_GRACE_TICKS))
            return
        if reply.error is not None:
            log.error("channel adapter not started", extra={"action": "channel.spawn_failed"})
            child.exited = True
            child.reason = "spawnFailed"
            self._end_input(child)
            return
        child.identity = reply.value
        if child.stopping:
            self._stop_child(child)

    def _stop_child(self, child: _Child) -> None:
        child.stopping = True
        if child.identity is not None and not child.exited:
            self._supervisor.tell(StopChild(child.identity, STOP_GRACE_TICKS))

    def _end_input(self, child: _Child) -> None:
        if not self._listener.end_channel_input_nowait(child.socket):
            with contextlib.suppress(OSError):
                child.socket.close()
            self._on_channel_ended(child.profile.name, child.epoch)

    def _on_exited(self, profile: str, epoch: str, exited: ChildExited) -> None:
        child = self._current(profile, epoch)
        if child is None:
            return
        child.exited = True
        if child.reason is None and not child.stopping:
            child.reason = f"exit {exited.returncode}"
        # Every frame it wrote is still read; then its channel ends.
        self._end_input(child)

    def _on_channel_ended(self, profile: str, epoch: str) -> None:
        child = self._current(profile, epoch)
        if child is None or child.closed:
            return
        child.closed = True
        child.state = "exited"
        if not child.exited and child.identity is not None:
            self._supervisor.tell(StopChild(child.identity, STOP_GRACE_TICKS))
        me = self.actor_ref
        work = functools.partial(
            interrupt_adapter, channel=child.profile.channel, adapter_epoch=epoch
        )
        self._database.tell(
            Transact(
                work,
                lambda reply: tell_if_alive(me, _Interrupted(profile, epoch, reply)),
                "channel.interrupt",
                hold_when_full=True,
            )
        )

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
        me = self.actor_ref
        self._reader.tell(
            Read(
                functools.partial(find_work, scopes=scopes),
                lambda reply: tell_if_alive(me, _Found(reply)),
                "channel.scan",
            )
        )

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
        me = self.actor_ref
        for item in reply.value:
            child = self._child_for_channel(item.channel)
            if child is None or item in self._reserving:
                continue
            self._reserving.add(item)
            epoch = child.epoch
            self._database.tell(
                Transact(
                    functools.partial(reserve_work, item=item, adapter_epoch=epoch),
                    functools.partial(_reply_to, me, functools.partial(_Reserved, item, epoch)),
                    "channel.reserve",
                    hold_when_full=True,
                )
            )

    def _on_reserved(self, item: WorkItem, epoch: str, reply: Reply) -> None:
        self._reserving.discard(item)
        if reply.error is not None:
            log.error("channel reservation failed", extra={"action": "channel.reserve_failed"})
            return
        attempt: ChannelAttempt | None = reply.value
        if attempt is None:
            return
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
        except (ProtocolViolation, FrameError):
            # Reserved but never sent: the child's end (we close it) makes it ambiguous;
            # the operator decides. Never expected: the presentation is bounded.
            log.exception("channel frame refused", extra={"action": "channel.frame_refused"})
            child.channel.close()

    # --- frames from a child ------------------------------------------------------------

    def _on_frame(self, message: _Frame) -> None:
        child = self._current(message.profile, message.epoch)
        if child is None:
            log.warning(
                "frame from a stale adapter refused",
                extra={"action": "channel.stale", "profile": message.profile},
            )
            with contextlib.suppress(Exception):
                message.channel.close()
            return
        try:
            frame = check_message(message.message, sender="adapter")
            child.check.check(frame)  # type: ignore[arg-type]
        except ProtocolViolation:
            log.warning(
                "bad frame from a channel adapter; closing its channel",
                extra={"action": "channel.rejected", "profile": message.profile},
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
        )
        me = self.actor_ref
        name = child.profile.name
        work = functools.partial(
            record_result,
            channel=child.profile.channel,
            adapter_epoch=child.epoch,
            attempt_id=frame["attemptId"],
            channel_revision=frame["channelRevision"],
            result=result,
        )
        self._database.tell(
            Transact(
                work,
                lambda reply: tell_if_alive(me, _Recorded(name, reply)),
                "channel.result",
                hold_when_full=True,
            )
        )

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
        self._dirty = True
        self._scan()

    def _answer(self, child: _Child, frame: dict[str, Any]) -> None:
        me = self.actor_ref
        name = child.profile.name
        work = functools.partial(
            answer_from_channel,
            channel=child.profile.channel,
            profile=name,
            event_id=frame["eventId"],
            answer=dict(frame["answer"]),
        )
        self._database.tell(
            Transact(
                work,
                lambda reply: tell_if_alive(me, _Answered(name, reply)),
                "channel.answer",
                hold_when_full=False,
            )
        )

    def _on_answered(self, profile: str, reply: Reply) -> None:
        if reply.error is not None:
            log.error("channel answer failed", extra={"action": "channel.answer_failed"})
            return
        outcome: AnswerOutcome = reply.value
        if outcome.outcome == "accepted" and self._scheduler is not None:
            tell_if_alive(self._scheduler, Wake())
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
        me = self.actor_ref
        channels = [profile.channel for profile in self._loaded.profiles.values()]
        self._reader.tell(
            Read(
                functools.partial(counts_by_channel, channels=channels),
                lambda reply: tell_if_alive(me, _Counted(held, reply)),
                "channel.status",
            )
        )

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
                "ambiguous": count.ambiguous if count is not None else 0,
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
