"""The process supervisor: own process groups, SIGTERM then SIGKILL in ticks, reaping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from pi_workflows.actors._base import wait_reply
from pi_workflows.actors._process_supervisor import (
    ChildExited,
    ProcessSupervisorActor,
    Spawn,
    StopChild,
)
from pi_workflows.actors._ticker import Ticker
from pi_workflows.supervision import ProcessIdentity, identity_of, is_alive, signal_group

pytestmark = pytest.mark.timeout(30)

IGNORES_TERM = (
    "import signal, time, subprocess, sys\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def supervisor() -> Iterator[Any]:
    failures: list[str] = []
    ref = ProcessSupervisorActor.start(lambda name, exc: failures.append(name))
    ticker = Ticker(0.02)
    ticker.register(ref)
    ticker.start()
    try:
        yield ref
    finally:
        ticker.stop()
        ref.stop(block=True, timeout=10)
    assert not failures


def _spawn(
    supervisor: Any, code: str, exits: list[ChildExited], done: threading.Event
) -> ProcessIdentity:
    def on_exit(exited: ChildExited) -> None:
        exits.append(exited)
        done.set()

    identity: ProcessIdentity = wait_reply(
        lambda deliver: supervisor.tell(
            Spawn([sys.executable, "-c", code], dict(os.environ), deliver, on_exit)
        ),
        10,
    )
    return identity


def test_children_get_their_own_group_and_a_start_identity(supervisor: Any) -> None:
    exits: list[ChildExited] = []
    done = threading.Event()
    identity = _spawn(supervisor, "import time; time.sleep(60)", exits, done)
    assert identity == identity_of(identity.pid)
    assert os.getpgid(identity.pid) == identity.pid
    assert os.getpgid(identity.pid) != os.getpgid(0)
    supervisor.tell(StopChild(identity, grace_ticks=50))
    assert done.wait(10)
    assert exits[0].returncode == -15 and not exits[0].killed
    assert not is_alive(identity)


def test_a_child_ignoring_sigterm_is_killed_with_its_group(supervisor: Any, tmp_path: Any) -> None:
    exits: list[ChildExited] = []
    done = threading.Event()
    identity = _spawn(supervisor, IGNORES_TERM, exits, done)
    process = psutil.Process(identity.pid)
    while not process.children():
        psutil.wait_procs([process], timeout=0.05)
    grandchild = process.children()[0]
    supervisor.tell(StopChild(identity, grace_ticks=5))
    assert done.wait(10)
    assert exits[0].killed and exits[0].returncode == -9
    gone, _ = psutil.wait_procs([grandchild], timeout=10)
    assert gone, "the whole process group is stopped, not only its leader"


def test_an_exiting_child_is_reaped_and_reported(supervisor: Any) -> None:
    exits: list[ChildExited] = []
    done = threading.Event()
    identity = _spawn(supervisor, "raise SystemExit(3)", exits, done)
    assert done.wait(10)
    assert exits == [ChildExited(identity, 3, False)]
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


def test_a_childs_output_file_stays_bounded(
    supervisor: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pi_workflows.actors._process_supervisor as module  # noqa: PLC0415

    monkeypatch.setattr(module, "LOG_CAP_BYTES", 64 * 1024)
    log = tmp_path / "child.log"
    read_end, write_end = os.pipe()
    code = (
        "import os, sys, time\n"
        "for _ in range(64):\n"
        "    sys.stdout.write('x' * 16384)\n"
        "    sys.stdout.flush()\n"
        f"os.write({write_end}, b'1')\n"
        "time.sleep(60)\n"
    )
    done = threading.Event()

    def on_exit(_: ChildExited) -> None:
        done.set()

    identity: ProcessIdentity = wait_reply(
        lambda deliver: supervisor.tell(
            Spawn(
                [sys.executable, "-c", code],
                dict(os.environ),
                deliver,
                on_exit,
                log_path=log,
                pass_fds=(write_end,),
            )
        ),
        10,
    )
    assert os.read(read_end, 1) == b"1", "the child wrote 1 MiB"
    os.close(read_end)
    pause, deadline = threading.Event(), time.monotonic() + 10
    while log.stat().st_size > module.LOG_CAP_BYTES:  # the next few ticks truncate it
        assert time.monotonic() < deadline, "the output file was never bounded"
        pause.wait(0.02)
    supervisor.tell(StopChild(identity, grace_ticks=5))
    assert done.wait(10)
    assert log.stat().st_size <= module.LOG_CAP_BYTES
