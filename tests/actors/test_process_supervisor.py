"""The process supervisor: own process groups, SIGTERM then SIGKILL in ticks, reaping.

No `Ticker` runs: the test sends each `Tick` by hand, so the tick at which a child is
reaped, escalated to SIGKILL or has its output file bounded is exact. These children are
cold-started (no zygote), so the supervisor notices their exit on its next tick.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows.actors._base import wait_reply
from pi_workflows.actors._process_supervisor import (
    LOG_CHECK_TICKS,
    ChildExited,
    ProcessSupervisorActor,
    Spawn,
    StopChild,
)
from pi_workflows.actors._ticker import Tick
from pi_workflows.supervision import ProcessIdentity, identity_of, is_alive, signal_group
from tests.actors.ticks import WAIT_S, handled, wait_exited

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
        identity: ProcessIdentity = wait_reply(
            lambda deliver: self.ref.tell(
                Spawn(
                    [sys.executable, "-c", code, *args],
                    dict(os.environ),
                    deliver,
                    self.exits.append,  # called on the actor's thread when it reaps
                    log_path=log_path,
                    pass_fds=pass_fds,
                )
            ),
            WAIT_S,
        )
        return identity

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
    assert supervisor.exits == [ChildExited(identity, -signal.SIGTERM, killed=False)]
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
    assert supervisor.exits == [ChildExited(identity, -signal.SIGKILL, killed=True)]


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
    assert supervisor.exits == [ChildExited(identity, -signal.SIGKILL, killed=True)]


def test_an_exiting_child_is_reaped_and_reported_on_the_next_tick(
    supervisor: Supervised,
) -> None:
    identity = supervisor.spawn("raise SystemExit(3)")
    wait_exited(identity.pid)
    handled(supervisor.ref)
    assert supervisor.exits == []
    assert psutil.Process(identity.pid).status() == psutil.STATUS_ZOMBIE, "not reaped yet"
    supervisor.tick()
    assert supervisor.exits == [ChildExited(identity, 3, False)]
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


def test_a_childs_output_file_is_bounded_every_few_ticks(
    supervisor: Supervised, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pi_workflows.actors._process_supervisor as module  # noqa: PLC0415

    monkeypatch.setattr(module, "LOG_CAP_BYTES", 64 * 1024)
    log = tmp_path / "child.log"
    report, write_end = _report_pipe()
    code = (
        "import os, sys, time\n"
        "for _ in range(64):\n"
        "    sys.stdout.write('x' * 16384)\n"
        "    sys.stdout.flush()\n"
        "os.write(int(sys.argv[1]), b'1')\n"
        "time.sleep(60)\n"
    )
    identity = supervisor.spawn(code, str(write_end), log_path=log, pass_fds=(write_end,))
    with report:
        assert report.read(1) == "1", "the child wrote 1 MiB"
    supervisor.tick(LOG_CHECK_TICKS - 1)
    assert log.stat().st_size == 64 * 16384, "checked only every LOG_CHECK_TICKS ticks"
    supervisor.tick()
    assert log.stat().st_size <= module.LOG_CAP_BYTES
    supervisor.stop(identity, grace_ticks=5)
    wait_exited(identity.pid)
    supervisor.tick()
    assert [exited.identity for exited in supervisor.exits] == [identity]
