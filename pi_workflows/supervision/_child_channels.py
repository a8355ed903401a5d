"""One owner for children that talk on a private channel: spawn, identity, frames, end.

Implements workflow-server.md § Process supervision for every child with a private
socketpair (runners, validation children, channel adapters, later resource runners):
the spawn goes through the process supervisor (the one signaller), frames reach the
owning actor as `ChildFrame`s checked where they were read, and a child ends for its
owner only once it was reaped and its channel reached end of file, so no frame it sent
before it died is lost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pi_workflows._address import Address, Done, Reply
from pi_workflows.supervision._messages import ChildExited, KillChild, Spawn, StopChild
from pi_workflows.supervision._process import ProcessIdentity
from pi_workflows.wire import ProtocolViolation

__all__ = [
    "ChannelListener",
    "ChildChannelClosed",
    "ChildChannels",
    "ChildEnded",
    "ChildEvent",
    "ChildFrame",
    "ChildSpec",
    "ChildStarted",
    "ChildTag",
    "FrameSink",
]

log = logging.getLogger(__name__)


class FrameSink(Protocol):
    """A child's channel as its owner sees it: frames out (from any thread), close."""

    def send(self, message: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class ChannelListener(Protocol):
    """The listener's two non-blocking calls the owner uses (`wire.ClientListener`)."""

    def attach_channel_nowait(self, sock: socket.socket, handler: Any, name: str) -> None: ...

    def end_channel_input_nowait(self, sock: socket.socket) -> bool: ...


Decode = Callable[[Mapping[str, Any]], Any]
"""Checks one decoded frame where it was read and returns its record; raises
`ProtocolViolation` (or any error) for a frame that broke the child's protocol."""


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """How to start one child with a private channel."""

    key: str
    """The owner's name for the child (a runner epoch, a submission ID, an adapter epoch)."""
    argv: Sequence[str]
    env: Mapping[str, str] = field(repr=False)
    """The child's environment (may hold credentials: never logged); `fd_env` is added."""
    fd_env: str
    """The variable that tells the child which descriptor is its end of the channel."""
    cwd: Path | None = None
    log_path: Path | None = None
    """Where its stdout and stderr go (bounded by the supervisor)."""
    preloaded: str | None = None
    """The zygote's module for this program (forked warm), or None (a cold interpreter)."""
    name: str = "child"
    """The channel's name in the listener's logs."""


@dataclass(frozen=True, slots=True)
class ChildTag:
    """The tag of this component's spawns: the supervisor's answers name the child."""

    key: str


@dataclass(frozen=True, slots=True)
class ChildFrame:
    """To the owner: one frame of a child's channel, checked where it was read."""

    key: str
    channel: FrameSink = field(repr=False)
    message: Any
    """The decoded record (the frame itself without a decoder); None when it broke the
    protocol, and `violation` says how."""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    violation: str | None = None


@dataclass(frozen=True, slots=True)
class ChildChannelClosed:
    """To the owner (told by the listener's loop): the channel reached end of file."""

    key: str


@dataclass(frozen=True, slots=True)
class ChildStarted:
    """Event: the supervisor started the child; this is its exact identity."""

    key: str
    identity: ProcessIdentity


@dataclass(frozen=True, slots=True)
class ChildEnded:
    """Event: the child is reaped (or never started) and its channel is at end of file:
    every frame it wrote was told to the owner before this."""

    key: str
    exited: ChildExited | None
    """None when the spawn failed: no process ever ran."""


ChildEvent = ChildStarted | ChildChannelClosed | ChildEnded


@dataclass
class _Child:
    socket: socket.socket
    identity: ProcessIdentity | None = None
    exited: ChildExited | None = None
    reaped: bool = False
    channel_closed: bool = False
    stop_on_start: StopChild | KillChild | None = None
    """A stop asked for before the spawn was answered: sent once it is."""


class _Handler:
    """The listener's handler for one child channel (runs on the listener's loop)."""

    def __init__(self, owner: Address, key: str, decode: Decode | None) -> None:
        self._owner = owner
        self._key = key
        self._decode = decode

    def on_message(self, channel: FrameSink, message: dict[str, Any]) -> None:
        frame = ChildFrame(self._key, channel, message)
        if self._decode is not None:
            try:
                frame = ChildFrame(self._key, channel, self._decode(message), message)
            except ProtocolViolation as exc:
                frame = ChildFrame(self._key, channel, None, message, str(exc))
            except Exception:  # a child's frame never takes the server down
                log.exception("child frame not decoded", extra={"action": "channel.rejected"})
                frame = ChildFrame(self._key, channel, None, message, "invalid message")
        _tell(self._owner, frame)

    def on_close(self, channel: FrameSink) -> None:
        # Every frame the child sent has been told to the owner before this.
        _tell(self._owner, ChildChannelClosed(self._key))


class ChildChannels:
    """The children of one actor that each talk on a private channel.

    Owned by that actor and used only on its thread: `start` spawns, `handle` takes the
    supervisor's answers and the channel's end (the owner routes them here) and returns
    what they mean as events. Frames go straight to the owner as `ChildFrame`s.

    **Blocking:** nothing here blocks; every request is a message.
    **Stop:** `close` (the owner's `on_stop`) ends every channel; the supervisor's own
    stop kills every child.
    """

    def __init__(
        self,
        owner: Address,
        supervisor: Address,
        listener: ChannelListener,
        *,
        decode: Decode | None = None,
    ) -> None:
        self._owner = owner
        self._supervisor = supervisor
        self._listener = listener
        self._decode = decode
        self._children: dict[str, _Child] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._children

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._children))

    def identity(self, key: str) -> ProcessIdentity | None:
        child = self._children.get(key)
        return child.identity if child is not None else None

    def start(self, spec: ChildSpec) -> None:
        """Spawn `spec`'s child with a new channel (`ChildStarted` or `ChildEnded` follow).

        Raises:
            ValueError: a child of that key is still known.
        """
        if spec.key in self._children:
            raise ValueError(f"a child {spec.key} is still known")
        server_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        handler = _Handler(self._owner, spec.key, self._decode)
        self._listener.attach_channel_nowait(server_end, handler, spec.name)
        self._children[spec.key] = _Child(server_end)
        env = {**spec.env, spec.fd_env: str(child_end.fileno())}
        self._supervisor.tell(
            Spawn(
                spec.argv,
                env,
                self._owner,
                ChildTag(spec.key),
                cwd=spec.cwd,
                log_path=spec.log_path,
                pass_fds=(child_end.detach(),),  # the supervisor closes it once spawned
                preloaded=spec.preloaded,
                fd_env=spec.fd_env if spec.preloaded is not None else None,
            )
        )

    def handle(self, message: object) -> list[ChildEvent]:
        """Take a message the owner received for its children; the events it means.

        `Done` and `ChildExited` tagged `ChildTag` (the supervisor's answers) and
        `ChildChannelClosed`; anything else (an unknown or forgotten child) means nothing.
        """
        match message:
            case Done(tag=ChildTag(key=key), reply=reply):
                return self._spawned(key, reply)
            case ChildExited(tag=ChildTag(key=key)):
                return self._reaped(key, message)
            case ChildChannelClosed(key=key):
                return self._closed(key)
        return []

    def stop(self, key: str, grace_ticks: int) -> None:
        """SIGTERM the child's group, SIGKILL after `grace_ticks` (the supervisor); a
        child whose spawn is not answered yet is stopped once it is."""
        self._order(key, lambda identity: StopChild(identity, grace_ticks))

    def kill(self, key: str) -> None:
        """SIGKILL the child's group now (or as soon as its spawn is answered)."""
        self._order(key, KillChild)

    def _order(self, key: str, make: Callable[[ProcessIdentity], StopChild | KillChild]) -> None:
        child = self._children.get(key)
        if child is None or child.reaped:
            return
        if child.identity is None:
            child.stop_on_start = make(ProcessIdentity(0, 0, ""))
            return
        self._supervisor.tell(make(child.identity))

    def end_input(self, key: str) -> list[ChildEvent]:
        """Make the channel end after what the child already wrote (end of file follows,
        even if a descendant still holds the child's end)."""
        child = self._children.get(key)
        if child is None or child.channel_closed:
            return []
        if self._listener.end_channel_input_nowait(child.socket):
            return []
        # The listener stopped: nothing reads the channel again.
        with contextlib.suppress(OSError):
            child.socket.close()
        return self._closed(key)

    def close(self) -> None:
        """The owner stops: end every channel (the supervisor kills what still runs)."""
        for key in list(self._children):
            self.end_input(key)

    def _spawned(self, key: str, reply: Reply) -> list[ChildEvent]:
        child = self._children.get(key)
        if child is None:
            return []
        if reply.error is not None:
            log.error("child not started", extra={"action": "child.spawn_failed"})
            child.reaped = True  # no process: nothing will ever write to its channel
            with contextlib.suppress(OSError):
                self._listener.end_channel_input_nowait(child.socket)
            del self._children[key]
            return [ChildEnded(key, None)]
        child.identity = reply.value
        if child.stop_on_start is not None:
            self._supervisor.tell(dataclasses.replace(child.stop_on_start, identity=reply.value))
        return [ChildStarted(key, reply.value)]

    def _reaped(self, key: str, exited: ChildExited) -> list[ChildEvent]:
        child = self._children.get(key)
        if child is None:
            return []
        child.reaped, child.exited = True, exited
        events = self.end_input(key)
        return events + self._ended(key)

    def _closed(self, key: str) -> list[ChildEvent]:
        child = self._children.get(key)
        if child is None or child.channel_closed:
            return []
        child.channel_closed = True
        return [ChildChannelClosed(key), *self._ended(key)]

    def _ended(self, key: str) -> list[ChildEvent]:
        child = self._children.get(key)
        if child is None or not (child.reaped and child.channel_closed):
            return []
        del self._children[key]
        return [ChildEnded(key, child.exited)]


def _tell(owner: Address, message: object) -> None:
    """Tell the owner from the listener's loop, which nothing a child sends may stop.

    The owner that stopped raises (pykka's `ActorDeadError`; its child ends with it).
    pykka is not imported here: children import this package and must not load it.
    """
    try:
        owner.tell(message)
    except Exception:  # noqa: BLE001 - see above: the loop carries on
        log.debug("a child channel's owner is gone", extra={"action": "child.owner_gone"})
