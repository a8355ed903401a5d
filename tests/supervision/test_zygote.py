"""The zygote: warm forks in their own sessions, exact exits, loss and restart."""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows.actors._process_supervisor import ProcessSupervisorActor
from pi_workflows.supervision import (
    ChildExited,
    ProcessIdentity,
    Spawn,
    StopChild,
    identity_of,
    is_alive,
)
from pi_workflows.supervision._zygote_client import Zygote, ZygoteUnavailable
from pi_workflows.wire.canonical import dumps
from tests.actors.ticks import SpawnAnswers, tick

pytestmark = pytest.mark.timeout(60)

RESOLVER = "pi_workflows.engine.resolve"

PROBE = '''
"""A test program for the zygote: ignores SIGTERM and leaves a double-forked grandchild."""
import os, signal, sys, time

def main():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    report = int(os.environ["PROBE_FD"])
    if os.fork() == 0:  # double fork: the grandchild is nobody's child but stays in the group
        if os.fork() == 0:
            os.write(report, f"{os.getpid()}\\n".encode())
            time.sleep(300)
        os._exit(0)
    os.write(report, f"{os.getpid()}\\n".encode())
    time.sleep(300)
    return 0
'''


QUICK = '''
"""A test program for the zygote: exits at once, often before its spawn was answered."""

def main():
    return 0
'''


@pytest.fixture
def zygote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Zygote]:
    (tmp_path / "piw_probe.py").write_text(PROBE)
    (tmp_path / "piw_quick.py").write_text(QUICK)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    zygote = Zygote([RESOLVER, "piw_probe", "piw_quick"], log_path=tmp_path / "zygote.log")
    try:
        yield zygote
    finally:
        zygote.close()


def _zygote_pid(identity: ProcessIdentity) -> int:
    return psutil.Process(identity.pid).ppid()


def _spawn_resolver(zygote: Zygote, exits: Future[int | None]) -> tuple[ProcessIdentity, Any]:
    server_end, child_end = socket.socketpair()
    try:
        identity = zygote.spawn(
            RESOLVER,
            env=os.environ,
            cwd=None,
            fds=[("stdin", child_end.fileno()), ("stdout", child_end.fileno())],
            on_exit=exits.set_result,
        )
    finally:
        child_end.close()
    return identity, server_end


def test_a_forked_child_runs_in_its_own_session_and_its_exit_is_reported(
    zygote: Zygote, tmp_path: Path
) -> None:
    exits: Future[int | None] = Future()
    identity, sock = _spawn_resolver(zygote, exits)
    with sock:
        assert os.getsid(identity.pid) == identity.pid, "a session of its own"
        assert os.getpgid(identity.pid) == identity.pid, "a process group of its own"
        assert identity_of(identity.pid) == identity, "the reported identity is the kernel's"
        zygote_process = psutil.Process(_zygote_pid(identity))
        assert zygote_process.name() == "piw-zygote"
        assert zygote_process.pid != os.getpid(), "the zygote, not this process, is the parent"
        request = {"workflow": "hello", "projectPath": None, "agentDir": str(tmp_path)}
        sock.sendall(dumps({**request, "input": {"name": "Ada"}}) + b"\n")
        answer = json.loads(sock.makefile("rb").readline())
    assert answer["ok"] is True, answer
    assert answer["workflowName"] == "hello"
    assert exits.result(30) == 0


def test_signal_group_reaches_a_live_child_and_its_signal_is_the_exit(zygote: Zygote) -> None:
    exits: Future[int | None] = Future()
    identity, sock = _spawn_resolver(zygote, exits)  # blocks reading its request
    with sock:
        zygote.signal_group(identity.pid, signal.SIGKILL)
        assert exits.result(30) == -signal.SIGKILL
    assert not is_alive(identity)


def test_a_module_that_is_not_preloaded_is_refused(zygote: Zygote) -> None:
    with pytest.raises(ZygoteUnavailable, match="not preloaded"):
        zygote.spawn("os", env=os.environ, cwd=None, fds=[], on_exit=lambda _: None)


def test_a_lost_zygote_reports_unknown_fates_and_a_new_one_takes_over(zygote: Zygote) -> None:
    exits: Future[int | None] = Future()
    identity, sock = _spawn_resolver(zygote, exits)
    with sock:
        first = _zygote_pid(identity)
        os.kill(first, signal.SIGKILL)
        assert exits.result(30) is None, "the child's fate is unknown to the server"
        os.killpg(identity.pid, signal.SIGKILL)  # its owner stops it by identity
        again: Future[int | None] = Future()
        second_identity, second_sock = _spawn_resolver(zygote, again)
        with second_sock:
            assert _zygote_pid(second_identity) != first, "a new zygote forked it"
            zygote.signal_group(second_identity.pid, signal.SIGKILL)
            assert again.result(30) == -signal.SIGKILL


@pytest.fixture
def supervisor(zygote: Zygote) -> Iterator[Any]:
    failures: list[str] = []
    ref = ProcessSupervisorActor.start(lambda name, exc: failures.append(name), zygote)
    try:
        yield ref  # no Ticker: the test sends each Tick by hand
    finally:
        ref.stop(block=True, timeout=10)
    assert not failures


def test_a_warm_child_ignoring_sigterm_is_killed_with_its_double_forked_grandchild(
    supervisor: Any, tmp_path: Path
) -> None:
    read_end, write_end = os.pipe()
    answers = SpawnAnswers()
    exits, done = answers.exits, answers.exited
    supervisor.tell(
        Spawn(
            ["unused-for-a-warm-child"],
            dict(os.environ),
            answers,
            log_path=tmp_path / "probe.log",
            pass_fds=(write_end,),
            preloaded="piw_probe",
            fd_env="PROBE_FD",
        )
    )
    identity = answers.identity(30)
    with os.fdopen(read_end) as report:
        pids = {int(report.readline()), int(report.readline())}
    grandchild = psutil.Process(next(pid for pid in pids if pid != identity.pid))
    assert grandchild.ppid() != identity.pid, "the grandchild was double-forked away"
    assert os.getpgid(grandchild.pid) == identity.pid, "but it stays in the child's group"
    supervisor.tell(StopChild(identity, grace_ticks=5))
    tick(supervisor, 1, 2, 3, 4)
    assert is_alive(identity) and grandchild.is_running(), "SIGTERM ignored, grace not over"
    assert not done.is_set()
    tick(supervisor, 5)  # SIGKILL to the group, through the zygote
    assert done.wait(30), "the child was never reported"  # a warm exit needs no tick
    (exited,) = exits
    assert exited.identity == identity
    assert exited.returncode == -signal.SIGKILL and exited.killed
    _gone, alive = psutil.wait_procs([grandchild], timeout=10)
    assert not alive, "the grandchild died with the group"


def _spares(zygote_pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(zygote_pid).children() if p.name() == "piw-spare"]


def test_spares_are_forked_ahead_settled_and_stopped_with_the_zygote(zygote: Zygote) -> None:
    seen: set[int] = set()
    zygote_pid = 0
    for _ in range(3):
        exits: Future[int | None] = Future()
        identity, sock = _spawn_resolver(zygote, exits)
        with sock:
            assert identity.pid not in seen
            seen.add(identity.pid)
            assert os.getsid(identity.pid) == identity.pid, "a session of its own"
            assert os.getpgid(identity.pid) == identity.pid, "a process group of its own"
            assert identity_of(identity.pid) == identity, "the reported identity is the kernel's"
            zygote_pid = _zygote_pid(identity)
        assert exits.result(30) == 2  # end of file instead of a request line
    # The zygote forks one spare per module before it reads its first request: the probe
    # module's is still there, already leading a session of its own, and the server
    # never heard of it.
    spares = _spares(zygote_pid)
    assert spares and not {spare.pid for spare in spares} & seen
    for spare in spares:
        assert os.getsid(spare.pid) == spare.pid and os.getpgid(spare.pid) == spare.pid
    zygote.close()
    _gone, alive = psutil.wait_procs(spares, timeout=10)
    assert not alive, "no spare outlives its zygote"


def test_a_warm_child_that_exits_before_its_spawn_returns_is_still_reported(
    supervisor: Any,
) -> None:
    """The zygote's exit report can reach the supervisor's callback before `spawn`
    returned the child's identity to the supervisor: the exit must not be lost."""
    count = 30
    exits: list[ChildExited] = []  # appended on the supervisor's thread
    answers = [SpawnAnswers(exits) for _ in range(count)]
    for spawn_answers in answers:
        supervisor.tell(Spawn(["unused"], dict(os.environ), spawn_answers, preloaded="piw_quick"))
    identities = [spawn_answers.identity(30) for spawn_answers in answers]
    for spawn_answers in answers:
        assert spawn_answers.exited.wait(30), f"{count - len(exits)} exits were never reported"
    assert sorted(exited.identity.pid for exited in exits) == sorted(i.pid for i in identities)
    assert {exited.returncode for exited in exits} == {0}
    assert supervisor.proxy().child_count.get(timeout=10) == 0
