"""The subreaper module: `setsid` escapees stay in the tree, and are stopped and reaped.

Each scenario runs in a child interpreter (the driver), which becomes a subreaper, builds
a tree of real processes and prints their PIDs as JSON; the test checks each PID against
the kernel, and kills every PID it was told about at teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from pi_workflows.supervision import identity_of
from pi_workflows.supervision._subreaper import kill_descendants

pytestmark = pytest.mark.timeout(60)

PRELUDE = """
import json, os, subprocess, sys, time
from pi_workflows.supervision._subreaper import *
from pi_workflows.supervision._process import identity_of

def say(**facts):
    print(json.dumps(facts), flush=True)

def double_fork():
    # A grandchild that calls setsid and whose parent exits: it is nobody's child now.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, f"{os.getpid()}\\n".encode())
            time.sleep(600)
        os._exit(0)
    os.waitpid(pid, 0)
    return int(os.read(r, 64).split()[0])
"""


class Driver:
    """One driver interpreter; its reported PIDs are killed at teardown."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self.popen: subprocess.Popen[str] | None = None

    def run(self, body: str) -> Iterator[dict[str, Any]]:
        script = PRELUDE + textwrap.dedent(body)
        self.popen = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            facts = json.loads(line)
            for value in facts.values():
                if isinstance(value, int) and value > 1:
                    self.pids.add(value)
                elif isinstance(value, list):
                    self.pids.update(v for v in value if isinstance(v, int) and v > 1)
            yield facts

    def release(self) -> None:
        """Let a driver waiting on stdin go on."""
        assert self.popen is not None and self.popen.stdin is not None
        self.popen.stdin.write("go\n")
        self.popen.stdin.flush()

    def cleanup(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)


@pytest.fixture
def driver() -> Iterator[Driver]:
    instance = Driver()
    try:
        yield instance
    finally:
        instance.cleanup()


def gone(pid: int, timeout: float = 10.0) -> bool:
    """True once `pid` has exited (a zombie counts): its pidfd turns readable."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([pidfd], [], [], timeout)[0])
    finally:
        os.close(pidfd)


def test_setsid_escapees_are_adopted_stopped_and_reaped(driver: Driver) -> None:
    facts = list(
        driver.run(
            """
            assert become_subreaper() and is_subreaper()
            direct = subprocess.Popen(["setsid", "sleep", "600"]).pid
            orphan = double_fork()
            shell = subprocess.Popen(["sh", "-c", "setsid sleep 600 & sleep 600 & wait"])
            while count_descendants() < 5:   # sh and its two sleeps appear as they fork
                time.sleep(0.01)
            found = [d.identity.pid for d in descendants()]
            say(direct=direct, orphan=orphan, shell=shell.pid, found=found,
                orphan_parent=int(open(f"/proc/{orphan}/stat").read().rsplit(")", 1)[1].split()[1]))
            report = stop_descendants()
            say(killed=report.killed, reaped=report.reaped, left=report.left,
                after=len(descendants()))
            """
        )
    )
    tree, report = facts
    assert driver.popen is not None
    assert tree["orphan_parent"] == driver.popen.pid  # re-parented to the subreaper
    assert {tree["direct"], tree["orphan"], tree["shell"]} <= set(tree["found"])
    assert report == {"killed": 5, "reaped": 5, "left": 0, "after": 0}
    for pid in tree["found"]:
        assert gone(pid), pid


def test_spared_children_keep_their_subtrees(driver: Driver) -> None:
    facts = driver.run(
        """
        become_subreaper()
        kept = subprocess.Popen(["sh", "-c", "setsid sleep 600 & wait"])
        while count_descendants() < 2:
            time.sleep(0.01)
        kept_tree = [d.identity.pid for d in descendants()]
        stray = subprocess.Popen(["setsid", "sleep", "600"]).pid
        report = stop_descendants(spare={kept.pid})
        say(kept=kept_tree, stray=stray, killed=report.killed,
            left=[d.identity.pid for d in descendants()])
        sys.stdin.readline()
        """
    )
    result = next(facts)
    assert result["killed"] == 1
    assert gone(result["stray"])
    assert sorted(result["left"]) == sorted(result["kept"])
    for pid in result["kept"]:
        assert psutil.pid_exists(pid)


def test_kill_descendants_of_an_exact_process_spares_the_process(driver: Driver) -> None:
    facts = driver.run(
        """
        become_subreaper()
        subprocess.Popen(["setsid", "sleep", "600"])
        double_fork()
        while count_descendants() < 2:
            time.sleep(0.01)
        say(me=os.getpid(), found=[d.identity.pid for d in descendants()])
        sys.stdin.readline()
        """
    )
    tree = next(facts)
    me = identity_of(tree["me"])
    assert me is not None
    assert kill_descendants(me) == 2
    for pid in tree["found"]:
        assert gone(pid), pid  # zombies of the driver now (it is their parent)
    assert psutil.Process(me.pid).status() != psutil.STATUS_ZOMBIE


def test_a_stale_identity_is_never_signalled(driver: Driver) -> None:
    facts = driver.run(
        """
        child = subprocess.Popen(["sleep", "600"])
        say(child=child.pid)
        sys.stdin.readline()
        """
    )
    child = next(facts)["child"]
    assert driver.popen is not None
    real = identity_of(driver.popen.pid)
    assert real is not None
    stale = type(real)(real.pid, real.start_ticks + 1, real.boot_id)
    assert kill_descendants(stale) == 0  # another start time: not this process
    assert psutil.Process(child).status() != psutil.STATUS_ZOMBIE


def test_descendant_cap_stops_the_tree_past_its_limit(driver: Driver) -> None:
    facts = driver.run(
        """
        become_subreaper()
        cap = DescendantCap(interval_s=0.02)
        cap.start()
        cap.arm(3)
        few = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
        time.sleep(0.3)
        say(under=cap.disarm(), few=[p.pid for p in few])
        cap.arm(3)
        many = [subprocess.Popen(["setsid", "sleep", "600"]) for _ in range(6)]
        codes = [p.wait(10) for p in many]   # killed by the cap; their Popen reaps them
        say(breach=cap.disarm(), codes=codes, many=[p.pid for p in many])
        """
    )
    first = next(facts)
    assert first["under"] is None
    second = next(facts)
    assert isinstance(second["breach"], int) and second["breach"] > 3
    assert second["codes"] == [-signal.SIGKILL] * 6  # the exit statuses stayed with Popen
    for pid in [*first["few"], *second["many"]]:
        assert gone(pid)


def test_become_subreaper_is_per_process() -> None:
    # Checked in a child: the test process itself must not adopt other tests' orphans.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; from pi_workflows.supervision._subreaper import *\n"
            "assert not is_subreaper(); become_subreaper(); assert is_subreaper()\n"
            "pid = os.fork()\n"
            "if pid == 0: os._exit(0 if not is_subreaper() else 1)\n"
            "print(os.waitpid(pid, 0)[1])",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert probe.stdout.strip() == "0"  # not inherited by a forked child
