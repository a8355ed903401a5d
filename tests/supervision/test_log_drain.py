"""Bounded child logs: capped as they are written, head and tail kept (issue 11, item 2).

Real child processes write into the pipe a `LogDrain` made; the file is read as the
test goes. Caps are small here; `tests/server/test_output_caps.py` runs the real cap
through a runner.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pi_workflows.supervision._log_drain import MARKER_MAX_BYTES, LogDrain

pytestmark = pytest.mark.timeout(60)

CAP = 64 * 1024
TAIL = 16 * 1024
WAIT_S = 10.0


@pytest.fixture
def drain() -> Iterator[LogDrain]:
    logs = LogDrain(CAP, TAIL)
    try:
        yield logs
    finally:
        logs.close()


def _child(code: str, output: int) -> subprocess.Popen[bytes]:
    """A Python child whose stdout and stderr are `output` (closed here once it has it)."""
    try:
        return subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=output,
            stderr=output,
        )
    finally:
        os.close(output)


def _wait_for(path: Path, done: Callable[[bytes], bool]) -> bytes:
    """The file's bytes once `done(bytes)` holds (bounded by WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        data = path.read_bytes()
        if done(data) or time.monotonic() > deadline:
            return data
        time.sleep(0.02)


FLOOD = """
import os, sys
os.write(1, b"HEAD\\n")
for i in range(200):
    os.write(1 if i % 2 else 2, bytes([97 + i % 26]) * 4096)
os.write(2, b"\\nTAIL\\n")
sys.stdin.readline()  # wait for the test to look, with the pipe still open
"""


def test_the_file_never_passes_its_cap_and_keeps_the_head_and_the_last_bytes(
    drain: LogDrain, tmp_path: Path
) -> None:
    log = tmp_path / "child.log"
    token, write_end = drain.open(log)
    child = _child(FLOOD, write_end)
    try:
        # Alive and still holding the pipe: the tail is rewritten within a flush interval.
        data = _wait_for(log, lambda d: d.endswith(b"TAIL\n"))
        assert data.endswith(b"TAIL\n"), "the tail appears while the child lives"
        assert len(data) <= CAP + MARKER_MAX_BYTES
        assert data.startswith(b"HEAD\n")
        assert child.stdin is not None
        child.stdin.write(b"\n")
        child.stdin.close()
        assert child.wait(WAIT_S) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(WAIT_S)
    drain.finish(token)
    data = _wait_for(log, lambda d: d.endswith(b"TAIL\n"))
    written = len(b"HEAD\n") + 200 * 4096 + len(b"\nTAIL\n")
    marker = re.search(rb"\n\[pi-workflows: (\d+) bytes of output were dropped[^\n]*\]\n", data)
    assert marker is not None
    head, tail = data[: marker.start()], data[marker.end() :]
    assert len(head) == CAP - TAIL and len(tail) == TAIL
    assert len(head) + len(tail) + int(marker.group(1)) == written, "all kept or counted"


def test_a_log_ends_by_itself_when_every_writer_closed_the_pipe(
    drain: LogDrain, tmp_path: Path
) -> None:
    log = tmp_path / "short.log"
    _token, write_end = drain.open(log)
    child = _child("print('only line')", write_end)
    assert child.wait(WAIT_S) == 0
    assert _wait_for(log, lambda d: d == b"only line\n") == b"only line\n"
    assert oct(log.stat().st_mode & 0o777) == "0o600"


def test_finish_cuts_off_a_descendant_that_keeps_writing(drain: LogDrain, tmp_path: Path) -> None:
    """The child's exit ends its log: an escaped writer gets a closed pipe, not a file."""
    log = tmp_path / "runaway.log"
    token, write_end = drain.open(log)
    writer = _child("import os\nwhile True: os.write(1, b'y' * 65536)", write_end)
    try:
        _wait_for(log, lambda d: len(d) >= CAP - TAIL)
        drain.finish(token)
        assert writer.wait(WAIT_S) != 0, "its pipe was closed: it stops (EPIPE)"
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(WAIT_S)
    assert len(log.read_bytes()) <= CAP + MARKER_MAX_BYTES


def test_a_refused_write_never_blocks_the_child(drain: LogDrain) -> None:
    """A full disk (`/dev/full` refuses every write) drops the bytes, still drains the
    pipe: the child prints 8 MiB and exits as if the log had taken it."""
    token, write_end = drain.open(Path("/dev/full"))
    child = _child("import os\nfor _ in range(128): os.write(1, b'z' * 65536)", write_end)
    try:
        assert child.wait(WAIT_S) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(WAIT_S)
    drain.finish(token)
