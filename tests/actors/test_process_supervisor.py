"""The process supervisor: own process groups, SIGTERM then SIGKILL in ticks, reaping.

No `Ticker` runs: the test sends each `Tick` by hand, so the tick at which a child is
reaped or escalated to SIGKILL is exact. These children are cold-started (no zygote),
so the supervisor notices their exit on its next tick.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows.actors._process_supervisor import LOG_CAP_BYTES, ProcessSupervisorActor
from pi_workflows.actors._ticker import Tick
from pi_workflows.supervision import (
    ChildExited,
    ProcessIdentity,
    Spawn,
    StopChild,
    StopGroup,
    identity_of,
    is_alive,
    signal_group,
)
from pi_workflows.supervision._log_drain import MARKER_MAX_BYTES
from tests.actors.ticks import WAIT_S, SpawnAnswers, handled, wait_exited

pytestmark = pytest.mark.timeout(30)

IGNORES_TERM = (
    "import os, signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "os.write(int(sys.argv[1]), f'{child.pid}\\n'.encode())\n"
    "time.sleep(60)\n"
)
"""Ignores SIGTERM, starts a grandchild in its group, then reports the grandchild's PID."""


@dataclass
class Supervised:
    """The supervisor under test and the exits it reported, in order."""

    ref: Any
    exits: list[ChildExited] = field(default_factory=list)
    ticks: int = 0

    def spawn(
        self, code: str, *args: str, log_path: Path | None = None, pass_fds: tuple[int, ...] = ()
    ) -> ProcessIdentity:
        answers = SpawnAnswers(self.exits)  # exits appended on the actor's thread
        self.ref.tell(
            Spawn(
                [sys.executable, "-c", code, *args],
                dict(os.environ),
                answers,
                log_path=log_path,
                pass_fds=pass_fds,
            )
        )
        return answers.identity(WAIT_S)

    def tick(self, count: int = 1) -> None:
        """Send the next `count` ticks and wait until they are handled."""
        for _ in range(count):
            self.ticks += 1
            self.ref.tell(Tick(self.ticks))
        handled(self.ref)

    def stop(self, identity: ProcessIdentity, grace_ticks: int) -> None:
        self.ref.tell(StopChild(identity, grace_ticks=grace_ticks))
        handled(self.ref)


@pytest.fixture
def supervisor() -> Iterator[Supervised]:
    failures: list[str] = []
    ref = ProcessSupervisorActor.start(lambda name, exc: failures.append(name))
    try:
        yield Supervised(ref)
    finally:
        ref.stop(block=True, timeout=10)  # kills and reaps what is left
    assert not failures


def _report_pipe() -> tuple[Any, int]:
    read_end, write_end = os.pipe()
    return os.fdopen(read_end), write_end


def test_children_get_their_own_group_and_a_start_identity(supervisor: Supervised) -> None:
    identity = supervisor.spawn("import time; time.sleep(60)")
    assert identity == identity_of(identity.pid)
    assert os.getpgid(identity.pid) == identity.pid
    assert os.getpgid(identity.pid) != os.getpgid(0)
    supervisor.stop(identity, grace_ticks=50)  # SIGTERM now; the child honours it
    wait_exited(identity.pid)
    assert supervisor.exits == [], "a cold child's exit is noticed on a tick, not before"
    supervisor.tick()
    assert supervisor.exits == [ChildExited(None, identity, -signal.SIGTERM, killed=False)]
    assert not is_alive(identity)


def test_sigkill_comes_exactly_after_the_grace_ticks_and_stops_the_whole_group(
    supervisor: Supervised,
) -> None:
    report, write_end = _report_pipe()
    identity = supervisor.spawn(IGNORES_TERM, str(write_end), pass_fds=(write_end,))
    with report:
        grandchild = psutil.Process(int(report.readline()))  # SIGTERM is ignored from here
    assert os.getpgid(grandchild.pid) == identity.pid
    supervisor.stop(identity, grace_ticks=3)
    supervisor.tick(2)
    assert is_alive(identity) and grandchild.is_running(), "SIGTERM ignored, grace not over"
    assert supervisor.exits == []
    supervisor.tick()  # the third tick after StopChild: SIGKILL to the group
    wait_exited(identity.pid)
    _gone, alive = psutil.wait_procs([grandchild], timeout=WAIT_S)
    assert not alive, "the whole process group is stopped, not only its leader"
    assert supervisor.exits == [], "killed, but reaped only on the next tick"
    supervisor.tick()
    assert supervisor.exits == [ChildExited(None, identity, -signal.SIGKILL, killed=True)]


def test_a_second_stop_does_not_restart_the_grace(supervisor: Supervised) -> None:
    report, write_end = _report_pipe()
    identity = supervisor.spawn(IGNORES_TERM, str(write_end), pass_fds=(write_end,))
    with report:
        report.readline()
    supervisor.stop(identity, grace_ticks=2)
    supervisor.tick()
    supervisor.stop(identity, grace_ticks=50)  # SIGTERM again; the SIGKILL tick stays
    supervisor.tick()
    wait_exited(identity.pid)
    supervisor.tick()
    assert supervisor.exits == [ChildExited(None, identity, -signal.SIGKILL, killed=True)]


def test_an_exiting_child_is_reaped_and_reported_on_the_next_tick(
    supervisor: Supervised,
) -> None:
    identity = supervisor.spawn("raise SystemExit(3)")
    wait_exited(identity.pid)
    handled(supervisor.ref)
    assert supervisor.exits == []
    assert psutil.Process(identity.pid).status() == psutil.STATUS_ZOMBIE, "not reaped yet"
    supervisor.tick()
    assert supervisor.exits == [ChildExited(None, identity, 3, False)]
    assert supervisor.ref.proxy().child_count.get(timeout=WAIT_S) == 0
    with pytest.raises(psutil.NoSuchProcess):
        psutil.Process(identity.pid).status()


def test_a_reused_pid_is_not_the_same_process() -> None:
    me = identity_of(os.getpid())
    assert me is not None and is_alive(me)
    assert not is_alive(ProcessIdentity(me.pid, me.start_ticks - 100, me.boot_id))
    assert not is_alive(ProcessIdentity(me.pid, me.start_ticks, "another-boot"))
    assert me.boot_id and me.start_ticks > 0


def test_signal_group_never_hits_a_process_with_another_identity() -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        real = identity_of(sleeper.pid)
        assert real is not None
        stale = ProcessIdentity(real.pid, real.start_ticks + 1, real.boot_id)
        assert not signal_group(stale, signal.SIGKILL)
        assert sleeper.poll() is None, "a mismatched identity is never signalled"
        assert signal_group(real, signal.SIGKILL)
        assert sleeper.wait(10) == -signal.SIGKILL
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait(10)


def test_a_childs_log_stays_within_its_cap_while_it_prints_and_keeps_its_last_lines(
    supervisor: Supervised, tmp_path: Path
) -> None:
    log = tmp_path / "child.log"
    report, write_end = _report_pipe()
    flood = 3 * LOG_CAP_BYTES  # 24 MiB: more than the cap, in a few seconds at most
    code = (
        "import os, sys\n"
        "sys.stdout.write('first line\\n'); sys.stdout.flush()\n"
        f"for _ in range({flood // 65536}):\n"
        "    os.write(1, b'x' * 65536)\n"
        "os.write(int(sys.argv[1]), b'1')\n"
        "sys.stdin.read(1)\n"  # /dev/null: end of file at once
        "sys.stderr.write('last line\\n')\n"
    )
    identity = supervisor.spawn(code, str(write_end), log_path=log, pass_fds=(write_end,))
    with report:
        assert report.read(1) == "1", "the child wrote everything"
    bound = LOG_CAP_BYTES + MARKER_MAX_BYTES
    assert log.stat().st_size <= bound, "bounded as it was written, with no tick at all"
    wait_exited(identity.pid)
    supervisor.tick()  # reaped: the log gets what is left in the pipe, then its tail
    assert [exited.identity for exited in supervisor.exits] == [identity]
    data = _wait_for_tail(log, b"last line\n", lambda data: _accounted(data) == flood)
    assert len(data) <= bound
    assert data.startswith(b"first line\n")
    assert data.count(b"[pi-workflows: ") == 1, "one marker line"
    assert _accounted(data) == flood, "every byte is kept or counted"


def _accounted(data: bytes) -> int:
    """The bytes of `x` a log kept plus those its marker counts as dropped."""
    dropped = re.search(rb"\[pi-workflows: (\d+) bytes of output were dropped", data)
    return data.count(b"x") + (int(dropped.group(1)) if dropped else 0)


def _wait_for_tail(
    log: Path, tail: bytes, settled: Callable[[bytes], bool] = lambda _data: True
) -> bytes:
    """The log once it ends with `tail` and is `settled` (the drain thread writes the
    marker and tail just after the reap; a read racing that rewrite can see the new tail
    behind the old marker, so the test waits for the final state, not only the tail)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        data = log.read_bytes()
        if (data.endswith(tail) and settled(data)) or time.monotonic() > deadline:
            return data
        time.sleep(0.02)


FOREGROUND_THEN_MARK = (
    'sleep 300 & FG=$!; for _ in $(seq 40); do sleep 300 & done; wait "$FG"; touch "$0"'
)
"""A shell that waits on its first `sleep` among 41, then leaves a mark: the command that
must never run once its group is stopped, whatever order its members die in."""


def test_a_stopped_group_never_acts_on_a_member_that_died_first(
    supervisor: Supervised, tmp_path: Path
) -> None:
    marker = tmp_path / "took-effect"
    shell = subprocess.Popen(
        ["sh", "-c", FOREGROUND_THEN_MARK, str(marker)], start_new_session=True
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while len(psutil.Process(shell.pid).children()) < 41:
            assert time.monotonic() < deadline, "the shell never started its sleeps"
            time.sleep(0.01)
        identity = identity_of(shell.pid)
        assert identity is not None
        sleeps = psutil.Process(shell.pid).children()
        supervisor.ref.tell(StopGroup(identity))
        handled(supervisor.ref)
        assert shell.wait(timeout=WAIT_S) == -signal.SIGKILL
        _, alive = psutil.wait_procs(sleeps, timeout=WAIT_S)
        assert alive == [], "every member of the group is gone"
        assert not marker.exists(), "the shell went on after its sleep died"
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()
