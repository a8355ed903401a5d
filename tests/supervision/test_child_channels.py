"""The one child-channel owner: real children, a real listener loop and process supervisor.

A child's frames reach its owner as `ChildFrame`s, checked where they were read; a
child ends for its owner (`ChildEnded`) only once it was reaped and its channel reached
end of file, so every frame it wrote before it died comes first. A spawn that fails
ends the child at once; the listener's stop closes the channel of a child still running.
"""

from __future__ import annotations

import os
import queue
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka
import pytest

from pi_workflows import __version__
from pi_workflows.actors import Done, ProcessSupervisorActor
from pi_workflows.supervision import (
    ChildChannelClosed,
    ChildChannels,
    ChildEnded,
    ChildExited,
    ChildFrame,
    ChildSpec,
    ChildStarted,
)
from pi_workflows.wire import ClientListener, ProtocolViolation
from tests.actors.ticks import WAIT_S, tick

pytestmark = pytest.mark.timeout(60)

FD_ENV = "TEST_CHANNEL_FD"

WRITES_THEN_EXITS = r"""
import os, socket, sys
from pi_workflows.wire.framing import encode_frame
sock = socket.socket(fileno=int(os.environ["TEST_CHANNEL_FD"]))
for n in range(int(sys.argv[1])):
    sock.sendall(encode_frame({"kind": "note", "n": n}))
sock.sendall(encode_frame({"kind": "bad"}))
os._exit(3)  # dies with the frames still unread by the server
"""

CLOSES_THEN_WAITS = r"""
import os, socket, time
socket.socket(fileno=int(os.environ["TEST_CHANNEL_FD"])).close()
time.sleep(60)
"""

WAITS = r"""
import time
time.sleep(60)
"""


@dataclass(frozen=True, slots=True)
class Start:
    spec: ChildSpec


@dataclass(frozen=True, slots=True)
class Stop:
    key: str


def decode(frame: Mapping[str, Any]) -> Mapping[str, Any]:
    if frame.get("kind") != "note":
        raise ProtocolViolation("not a note", schema_name="test.v1")
    return frame


class Owner(pykka.ThreadingActor):
    """An actor that owns children through `ChildChannels` and records what it hears."""

    def __init__(self, supervisor: pykka.ActorRef[Any], listener: ClientListener) -> None:
        super().__init__()
        self.heard: queue.Queue[object] = queue.Queue()
        self._supervisor = supervisor
        self._listener = listener
        self._children: ChildChannels | None = None

    def on_start(self) -> None:
        self._children = ChildChannels(
            self.actor_ref, self._supervisor, self._listener, decode=decode
        )

    def on_receive(self, message: Any) -> Any:
        assert self._children is not None
        match message:
            case Start(spec=spec):
                self._children.start(spec)
            case Stop(key=key):
                self._children.stop(key, grace_ticks=1)
            case ChildFrame():
                self.heard.put(message)
            case Done() | ChildExited() | ChildChannelClosed():
                for event in self._children.handle(message):
                    self.heard.put(event)
        return None


@dataclass
class Rig:
    owner: pykka.ActorRef[Any]
    heard: queue.Queue[object]
    supervisor: pykka.ActorRef[Any]
    listener: ClientListener
    ticks: int = 0

    def start(self, key: str, code: str, *args: str) -> None:
        argv = [sys.executable, "-c", code, *args]
        self.owner.tell(Start(ChildSpec(key, argv, dict(os.environ), FD_ENV)))

    def until(self, kind: type[object]) -> list[object]:
        """Everything heard up to and including the first `kind`, ticking the supervisor
        (a cold child is reaped on a tick)."""
        seen: list[object] = []
        for _ in range(int(WAIT_S / 0.05)):
            self.ticks += 1
            tick(self.supervisor, self.ticks)
            try:
                while True:
                    item = self.heard.get(timeout=0.05)
                    seen.append(item)
                    if isinstance(item, kind):
                        return seen
            except queue.Empty:
                continue
        raise AssertionError(f"no {kind.__name__}; heard {seen}")


@pytest.fixture
def rig(short_tmp: Path) -> Iterator[Rig]:
    failures: list[str] = []
    supervisor = ProcessSupervisorActor.start(lambda name, exc: failures.append(name))
    listener = ClientListener(short_tmp / "s.sock", None, __version__, lambda exc: None)
    listener.start()
    owner = Owner.start(supervisor, listener)
    heard = owner.proxy().heard.get(timeout=WAIT_S)
    try:
        yield Rig(owner, heard, supervisor, listener)
    finally:
        owner.stop(block=True, timeout=WAIT_S)
        listener.stop()
        supervisor.stop(block=True, timeout=WAIT_S)  # kills and reaps what is left
    assert failures == []


def test_every_frame_a_dying_child_wrote_comes_before_its_end(rig: Rig) -> None:
    rig.start("child-1", WRITES_THEN_EXITS, "200")
    heard = rig.until(ChildEnded)
    frames = [item for item in heard if isinstance(item, ChildFrame)]
    assert [frame.message["n"] for frame in frames if frame.message is not None] == list(range(200))
    (bad,) = [frame for frame in frames if frame.message is None]
    assert bad.violation == "not a note" and bad.raw == {"kind": "bad"}
    assert any(isinstance(item, ChildStarted) for item in heard)
    ended = heard[-1]
    assert isinstance(ended, ChildEnded) and ended.exited is not None
    assert ended.key == "child-1" and ended.exited.returncode == 3
    closed = [i for i, item in enumerate(heard) if isinstance(item, ChildChannelClosed)]
    assert len(closed) == 1 and closed[0] > heard.index(bad), "end of file after every frame"


def test_a_channel_closed_by_a_live_child_ends_it_only_once_it_is_reaped(rig: Rig) -> None:
    rig.start("child-2", CLOSES_THEN_WAITS)
    heard = rig.until(ChildChannelClosed)
    assert not any(isinstance(item, ChildEnded) for item in heard), "still running"
    rig.owner.tell(Stop("child-2"))
    ended = rig.until(ChildEnded)[-1]
    assert isinstance(ended, ChildEnded) and ended.exited is not None
    assert ended.exited.returncode < 0, "stopped by a signal"


def test_a_spawn_that_fails_ends_the_child_at_once(rig: Rig) -> None:
    spec = ChildSpec("child-3", ["/nonexistent/program"], dict(os.environ), FD_ENV)
    rig.owner.tell(Start(spec))
    heard = rig.until(ChildEnded)
    assert heard[-1] == ChildEnded("child-3", None)
    assert not any(isinstance(item, ChildStarted) for item in heard)


def test_the_listeners_stop_closes_the_channel_of_a_child_still_running(rig: Rig) -> None:
    rig.start("child-4", WAITS)
    rig.until(ChildStarted)
    rig.listener.stop()  # it used to wait for every child channel to end by itself
    heard = rig.until(ChildChannelClosed)
    assert heard[-1] == ChildChannelClosed("child-4")
