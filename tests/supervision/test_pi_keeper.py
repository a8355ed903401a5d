"""pi's keeper: what pi's tools daemonise stays below it, and is ended when pi ends.

The "pi" here is `/bin/sh`, which starts `sleep A` (its parent, a subshell, exits at
once) and `setsid sleep B` the same way, prints the PIDs and waits on stdin, like pi in
RPC mode. Both sleeps are re-parented to the keeper, a child subreaper; when "pi" exits
(stdin end of file, or a signal) the keeper kills and reaps them and exits as pi did.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator

import psutil
import pytest

from pi_workflows.supervision._pi_keeper import keeper_argv

pytestmark = pytest.mark.timeout(60)

FAKE_PI = (
    "(sleep 3601 >/dev/null 2>&1 & echo $! >&3) 3>&1; "
    "(setsid sleep 3602 >/dev/null 2>&1 & echo $! >&3) 3>&1; "
    'read line; [ "$line" = die ] && kill -TERM $$; exit 7'
)


@pytest.fixture
def keeper() -> Iterator[tuple[subprocess.Popen[bytes], list[psutil.Process]]]:
    popen = subprocess.Popen(
        keeper_argv(["/bin/sh", "-c", FAKE_PI]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert popen.stdout is not None
    sleeps = [psutil.Process(int(popen.stdout.readline())) for _ in range(2)]
    try:
        yield popen, sleeps
    finally:
        for process in sleeps:  # by PID, if a failing test left them
            with contextlib.suppress(psutil.Error):
                if process.is_running():
                    process.kill()
        if popen.poll() is None:
            popen.kill()
        popen.wait(10)


def _wait_adopted(keeper: subprocess.Popen[bytes], sleeps: list[psutil.Process]) -> None:
    """Their subshells exited: each sleep is re-parented to the keeper, and each has
    become `sleep` (so `setsid` has already run: it calls setsid() before its exec). A
    condition in /proc has no event to wait on; bounded by the test's timeout."""

    def settled(process: psutil.Process) -> bool:
        return process.ppid() == keeper.pid and process.cmdline()[:1] == ["sleep"]

    while not all(settled(s) for s in sleeps):
        psutil.wait_procs([], timeout=0.01)


def test_a_daemonised_tool_is_re_parented_to_the_keeper_and_ended_at_pis_eof(
    keeper: tuple[subprocess.Popen[bytes], list[psutil.Process]],
) -> None:
    popen, sleeps = keeper
    _wait_adopted(popen, sleeps)
    assert os.getsid(sleeps[1].pid) != popen.pid, "the setsid'd sleep left pi's session"
    assert popen.stdin is not None
    popen.stdin.close()  # what a runner's death looks like to pi
    assert popen.wait(30) == 7, "the keeper exits with pi's status"
    _gone, alive = psutil.wait_procs(sleeps, timeout=10)
    assert alive == [], "the keeper killed what pi's tools left behind"


def test_a_pi_ended_by_a_signal_ends_its_keeper_by_the_same_signal_and_the_tools_too(
    keeper: tuple[subprocess.Popen[bytes], list[psutil.Process]],
) -> None:
    popen, sleeps = keeper
    _wait_adopted(popen, sleeps)
    assert popen.stdin is not None
    popen.stdin.write(b"die\n")
    popen.stdin.flush()
    assert popen.wait(30) == -signal.SIGTERM
    _gone, alive = psutil.wait_procs(sleeps, timeout=10)
    assert alive == []


def test_sigterm_to_the_group_reaches_pi_and_the_keeper_still_cleans_up(
    keeper: tuple[subprocess.Popen[bytes], list[psutil.Process]],
) -> None:
    popen, sleeps = keeper
    _wait_adopted(popen, sleeps)
    os.killpg(popen.pid, signal.SIGTERM)  # what PiChild.stop's escalation sends
    assert popen.wait(30) == -signal.SIGTERM
    _gone, alive = psutil.wait_procs(sleeps, timeout=10)
    assert alive == []
