"""Child subreapers: adopt, list, stop and reap every descendant, identity-checked.

Implements workflow-server.md § Process supervision ("process-group cleanup", "no
process outlives its supervision") against processes that leave their group: a command
that calls `setsid` (`setsid sleep 600 &`, a daemon's double fork) is in no group the
supervisor knows. Linux keeps such a process in the tree of the nearest ancestor that
declared itself a *child subreaper* (`prctl(PR_SET_CHILD_SUBREAPER)`): when its parent
dies it is re-parented there instead of to init. The runner and the zygote declare
themselves so; everything a node starts then stays below the runner while the runner
lives, and below the zygote after that. Here they find it again, stop it and reap it.

Every signal is sent to one exact process (`ProcessIdentity`: PID and kernel start
time) through a pidfd opened before the identity is checked, so a PID that was reused
in between is never hit (without pidfds, a process that is not our own child is checked
by start time just before the signal). Nothing here signals a process group.

The API, for the runner (every node end), the zygote (every child exit), the process
supervisor (a runner it stops) and the headless Pi children of a later issue:

- `become_subreaper()`: declare this process a child subreaper.
- `descendants(root, spare=...)`: every process below `root`, breadth first.
- `stop_descendants(spare=...)`: SIGKILL every descendant of this process (but the
  subtrees of the direct children in `spare`) and reap those that are, or become, its
  children; blocking, bounded.
- `kill_descendants(identity)`: SIGKILL every descendant of another exact process (a
  child the supervisor is stopping), without waiting.
- `DescendantCap`: a thread that stops every descendant when more than a number of them
  are alive at once (the `processes` limit).
"""

from __future__ import annotations

import ctypes
import functools
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import psutil

from pi_workflows.supervision._process import ProcessIdentity, boot_id, open_pidfd

__all__ = [
    "Descendant",
    "DescendantCap",
    "StopReport",
    "become_subreaper",
    "count_descendants",
    "descendants",
    "is_subreaper",
    "kill_descendants",
    "stop_descendants",
]

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
STOP_TIMEOUT_S = 5.0
"""How long `stop_descendants` waits for SIGKILLed processes to exit, by default. Only a
process in uninterruptible sleep (a hung disk or network mount) takes more than a tick."""
_ROUND_WAIT_S = 0.05
"""The longest wait for exits between two listings of the tree."""
_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class Descendant:
    """One process below a root, as read from `/proc/<pid>/stat` in one read."""

    identity: ProcessIdentity
    parent: int
    group: int
    """Its process group ID."""
    zombie: bool
    """It has exited and waits for its parent (or a subreaper) to reap it."""


@dataclass(frozen=True, slots=True)
class StopReport:
    """What one `stop_descendants` call did."""

    killed: int
    """Live processes it sent SIGKILL to (each counted once)."""
    reaped: int
    """Children of this process it reaped (killed ones and zombies it found)."""
    left: int
    """Descendants still there when it gave up (0 unless one would not die in time)."""


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux); False where the platform has none.

    Orphaned descendants are then re-parented to this process instead of to init, even
    those that called `setsid`. The setting is not inherited by forked children.
    """
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def is_subreaper() -> bool:
    """True if this process is a child subreaper."""
    libc = _libc()
    if libc is None:
        return False
    value = ctypes.c_int(0)
    if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) != 0:
        return False
    return value.value != 0


# --- listing -----------------------------------------------------------------------------


class _Stat(NamedTuple):
    state: str
    parent: int
    group: int
    start_ticks: int


def _read_stat(pid: int) -> _Stat | None:
    """State, parent, process group and start ticks of `pid`, or None when it is gone."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return _Stat(fields[0], int(fields[1]), int(fields[2]), int(fields[19]))


@functools.cache
def _has_children_files() -> bool:
    # CONFIG_PROC_CHILDREN: each task lists the children it forked. Without it, the
    # whole process table is scanned (psutil), which is slower but the same answer.
    return (_PROC / "self" / "task" / str(os.getpid()) / "children").exists()


def _child_pids(pid: int) -> list[int]:
    if not _has_children_files():
        try:
            return [child.pid for child in psutil.Process(pid).children()]
        except psutil.Error:
            return []
    try:
        tasks = list((_PROC / str(pid) / "task").iterdir())
    except OSError:
        return []
    found: list[int] = []
    for task in tasks:
        try:
            text = (task / "children").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        found.extend(int(word) for word in text.split())
    return found


def _children(pid: int) -> list[Descendant]:
    found: list[Descendant] = []
    for child in _child_pids(pid):
        stat = _read_stat(child)
        # The listing is a snapshot: keep only what is still this parent's child.
        if stat is None or stat.parent != pid:
            continue
        identity = ProcessIdentity(child, stat.start_ticks, boot_id())
        found.append(Descendant(identity, stat.parent, stat.group, stat.state == "Z"))
    return found


def descendants(root: int | None = None, *, spare: Collection[int] = ()) -> list[Descendant]:
    """Every process below `root` (default: this process), parents before children.

    `spare`: PIDs of direct children of `root` whose whole subtrees are left out (the
    zygote's own runners, for example). A snapshot: processes fork and exit meanwhile.
    """
    top = os.getpid() if root is None else root
    spared = set(spare)
    found: list[Descendant] = []
    level = [child for child in _children(top) if child.identity.pid not in spared]
    while level:
        found.extend(level)
        level = [
            grandchild
            for child in level
            if not child.zombie
            for grandchild in _children(child.identity.pid)
        ]
    return found


def count_descendants(root: int | None = None, *, spare: Collection[int] = ()) -> int:
    """How many processes below `root` are alive (zombies do not count)."""
    return sum(1 for found in descendants(root, spare=spare) if not found.zombie)


# --- signalling one exact process --------------------------------------------------------


def _kill_exact(identity: ProcessIdentity) -> bool:
    """SIGKILL exactly this process if it still lives; True if it was signalled.

    The pidfd pins the process before its start time is compared, so the signal cannot
    reach a process that took over a reused PID.
    """
    pidfd = open_pidfd(identity.pid)
    try:
        stat = _read_stat(identity.pid)
        if stat is None or stat.start_ticks != identity.start_ticks or stat.state == "Z":
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:  # no pidfds: start time just checked; a reuse in between is the residual race
            os.kill(identity.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return True


def kill_descendants(root: ProcessIdentity, *, outside_group: bool = False) -> int:
    """SIGKILL every live descendant of the exact process `root`, which is left alone.

    For a child the caller is about to stop (a runner): while it lives, everything it
    started is below it, `setsid` or not, so it is found here; once it is gone its
    orphans would belong to its subreaper. `outside_group`: only those that left the
    root's process group (`root` leads it), for a caller that is about to give the group
    itself a grace period. Does not wait and reaps nothing (they are not the caller's
    children). Returns how many were signalled.
    """
    pidfd = open_pidfd(root.pid)  # pins the root while its tree is read
    try:
        stat = _read_stat(root.pid)
        if stat is None or stat.start_ticks != root.start_ticks:
            return 0
        live = [
            found
            for found in descendants(root.pid)
            if not found.zombie and not (outside_group and found.group == root.pid)
        ]
        return sum(1 for found in live if _kill_exact(found.identity))
    finally:
        if pidfd is not None:
            os.close(pidfd)


# --- stopping and reaping this process's own tree ----------------------------------------


def _reap(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # reaped by its own `Popen` meanwhile
        return False
    return done == pid


def _await_exits(processes: list[Descendant], until: float) -> None:
    """Wait until one of these processes exits (a pidfd turns readable), for one round."""
    wait_s = max(0.0, min(_ROUND_WAIT_S, until - time.monotonic()))
    if getattr(os, "pidfd_open", None) is None:
        time.sleep(wait_s)  # no pidfds on this platform: a short pause between rounds
        return
    poller = select.poll()
    pidfds: list[int] = []
    try:
        for process in processes:
            pidfd = open_pidfd(process.identity.pid)
            if pidfd is None:
                return  # gone already: list the tree again at once
            pidfds.append(pidfd)
            poller.register(pidfd, select.POLLIN)
        poller.poll(int(wait_s * 1000) + 1)
    finally:
        for pidfd in pidfds:
            os.close(pidfd)


REPARENT_POLL_S = 0.002
"""The pause between two listings while only zombies are left."""


def stop_descendants(
    *, spare: Collection[int] = (), reap: bool = True, timeout_s: float = STOP_TIMEOUT_S
) -> StopReport:
    """SIGKILL every descendant of this process, and reap each that is (or becomes) ours.

    `spare`: PIDs of direct children whose subtrees are left alone. In rounds: list the
    tree, SIGKILL every live member, reap the children of ours that exited; a killed
    process's own children are then re-parented here (this process is a subreaper) and
    met in the next round, and so is a process forked while the tree was being stopped.
    Ends when no descendant lives (and, with `reap`, none is left to reap), or after
    `timeout_s`. `reap=False` leaves every zombie to whoever waits for it: a thread
    that may be inside `Popen.wait` must not lose its child's exit status to us.

    **Blocking:** up to `timeout_s`; a SIGKILLed process normally exits in microseconds.
    """
    me = os.getpid()
    spared = set(spare)
    until = time.monotonic() + timeout_s
    killed: set[ProcessIdentity] = set()
    reaped = 0
    while True:
        tree = descendants(me, spare=spared)
        live = [found for found in tree if not found.zombie]
        # A process killed in an earlier round may still be exiting: signalled again,
        # counted once.
        killed.update(found.identity for found in live if _kill_exact(found.identity))
        if reap:
            # A zombie below a live process waits for that parent, which was just killed:
            # it is re-parented here and reaped in a later round.
            mine = [found for found in tree if found.zombie and found.parent == me]
            reaped += sum(1 for found in mine if _reap(found.identity.pid))
        # Until a round finds no zombie at all, list again: a dead parent's children are
        # re-parented here as it exits, and a listing that read this process's children
        # before that and the parent's state after it saw neither them nor their parent's.
        if not live and not (reap and any(found.zombie for found in tree)):
            return StopReport(len(killed), reaped, 0)
        if time.monotonic() >= until:
            return StopReport(len(killed), reaped, len(live))
        if live:
            _await_exits(live, until)
        else:
            time.sleep(REPARENT_POLL_S)


# --- the process limit -------------------------------------------------------------------


class DescendantCap:
    """A daemon thread that bounds how many descendants of this process live at once.

    While armed with a limit, it counts the live descendants every `interval_s`; past the
    limit it records the breach and stops them all (`stop_descendants`), and goes on
    stopping any new ones until it is disarmed. Counting is by polling: between two
    counts a fast fork can pass the limit briefly, never for longer than one interval.

    `spare` names direct children never counted nor stopped (a Pi child of a later issue).
    """

    def __init__(
        self,
        interval_s: float = 0.05,
        on_breach: Callable[[int], None] | None = None,
    ) -> None:
        self._interval_s = interval_s
        self._on_breach = on_breach
        self._lock = threading.Lock()
        self._armed = threading.Event()
        self._limit: int | None = None
        self._spare: frozenset[int] = frozenset()
        self._breached: int | None = None
        self._thread: threading.Thread | None = None

    _shared: DescendantCap | None = None

    @classmethod
    def shared(cls) -> DescendantCap:
        """This process's one cap, started on first use (never in a process that forks
        children it means to keep single-threaded, such as the zygote)."""
        if cls._shared is None:
            cap = cls()
            cap.start()
            cls._shared = cap
        return cls._shared

    def start(self) -> None:
        """Start the thread (once; before any low memory limit, as it needs a stack)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="descendant-cap", daemon=True)
            self._thread.start()

    def arm(self, limit: int, spare: Collection[int] = ()) -> None:
        """Count from now on against `limit` live descendants; forget any earlier breach."""
        with self._lock:
            self._limit, self._spare, self._breached = limit, frozenset(spare), None
        self._armed.set()

    def disarm(self) -> int | None:
        """Stop counting; return the count that breached the limit since `arm`, or None."""
        with self._lock:
            self._armed.clear()
            self._limit = None
            breached, self._breached = self._breached, None
        return breached

    def _run(self) -> None:
        while True:
            self._armed.wait()
            time.sleep(self._interval_s)
            with self._lock:
                limit, spare = self._limit, self._spare
                if limit is None:
                    continue
                alive = count_descendants(spare=spare)
                if alive <= limit and self._breached is None:
                    continue
                first = self._breached is None
                if first:
                    self._breached = alive
                # Not reaped here: the node's own thread may be waiting for its child.
                stop_descendants(spare=spare, reap=False, timeout_s=1.0)
            if first and self._on_breach is not None:
                self._on_breach(alive)
