"""A child channel delivers every frame the child wrote before it died.

The runner host records a runner's exit only after its channel's end of file, on the
promise that the listener hands over every complete frame the runner wrote first
(docs/architecture.md, "The exit path"). A pipelined runner writes its next frame
before it reads the reply to the last one, so the server may answer a runner that has
just written a frame and died. These tests force that interleaving with a real child
process on a real socketpair: the handler holds the listener's loop until the child
wrote its second frame and was reaped (SIGKILL), and answers the first frame either
after the death (the write fails with EPIPE) or before it (the child dies with the
reply unread, and the server's next read after the frame is ECONNRESET).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import __version__
from pi_workflows.wire._listener import ClientListener, Connection
from tests.conftest import Processes

pytestmark = pytest.mark.timeout(30)

CHILD = """
import os, signal, socket, sys
channel = socket.socket(fileno=int(sys.argv[1]))
channel.sendall(b'{"n":1}\\n')
os.read(int(sys.argv[2]), 1)  # the server holds the first frame
channel.sendall(b'{"n":2}\\n')
os.kill(os.getpid(), signal.SIGKILL)  # dead right after the write, like a crash point
"""


class _Recorder:
    """A channel handler: answers frame 1 around the child's death; records everything."""

    def __init__(self, child: subprocess.Popen[str], go: int, *, answer_first: bool) -> None:
        self._child = child
        self._go = go
        self._answer_first = answer_first
        self.seen: list[Any] = []
        self.closed = threading.Event()

    def on_message(self, channel: Connection, message: dict[str, Any]) -> None:
        self.seen.append(message["n"])
        if message["n"] != 1:
            return
        if self._answer_first:
            channel.send({"reply": 1})  # lands in the child's buffer; it never reads it
        os.write(self._go, b"x")
        # Blocking the loop on purpose: frame 2 and the death both happen before the
        # listener reads again.
        assert self._child.wait(20) == -9
        if not self._answer_first:
            channel.send({"reply": 1})  # EPIPE: the child is gone

    def on_close(self, channel: Connection) -> None:
        self.seen.append("closed")
        self.closed.set()


@pytest.mark.parametrize("answer_first", [False, True], ids=["answer-after-death", "unread"])
def test_a_dead_childs_last_frame_is_delivered_before_the_end_of_file(
    short_tmp: Path, processes: Processes, answer_first: bool
) -> None:
    failures: list[BaseException] = []
    listener = ClientListener(short_tmp / "host.sock", None, __version__, failures.append)
    listener.start()
    server_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    go_read, go_write = os.pipe()
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(child_end.fileno()), str(go_read)],
            pass_fds=(child_end.fileno(), go_read),
            text=True,
            start_new_session=True,
        )
        processes.started.append(child)
        child_end.close()
        os.close(go_read)
        recorder = _Recorder(child, go_write, answer_first=answer_first)
        listener.attach_channel(server_end, recorder, "child")
        assert recorder.closed.wait(20), f"the channel never ended: {recorder.seen}"
        assert recorder.seen == [1, 2, "closed"], "a frame the child wrote was lost"
        assert failures == []
    finally:
        os.close(go_write)
        listener.stop()
