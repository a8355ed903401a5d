"""Child processes: spawning in their own group, start identities, group signals.

Implements workflow-server.md § Process supervision: each child starts in its own
process group and is known by PID plus process start time, so a reused PID can
never make the server signal an unrelated process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = [
    "ChildProcess",
    "ProcessIdentity",
    "exited_unreaped",
    "identity_of",
    "is_alive",
    "open_pidfd",
    "set_process_name",
    "signal_group",
    "signal_own_child",
    "spawn_child",
    "wait_for_exits",
]


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """A process as the kernel knows it: PID, kernel start time and boot.

    `start_ticks` is the start time in clock ticks since boot (`/proc/<pid>/stat` field
    22), not a wall-clock reading, so a clock change cannot alias two processes; with the
    boot ID a reused PID after a reboot cannot match either.
    """

    pid: int
    start_ticks: int
    boot_id: str


_PROC = Path("/proc")


@functools.cache
def boot_id() -> str:
    """This boot's ID (Linux), or an empty string where the platform has none."""
    try:
        return (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


@dataclass(frozen=True, slots=True)
class ChildProcess:
    """A child started by `spawn_child`; its group ID equals its PID."""

    identity: ProcessIdentity
    popen: subprocess.Popen[bytes]


def identity_of(pid: int) -> ProcessIdentity | None:
    """Return the identity of a process (zombies included), or None if there is none."""
    ticks = _start_ticks(pid)
    if ticks is not None:
        return ProcessIdentity(pid, ticks, boot_id())
    try:  # no /proc (macOS): psutil's creation time, in milliseconds
        return ProcessIdentity(pid, int(psutil.Process(pid).create_time() * 1000), "")
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def is_alive(identity: ProcessIdentity) -> bool:
    """True only if the exact process (same PID and start time) still runs."""
    current = identity_of(identity.pid)
    if current is None or current != identity:
        return False
    try:
        return psutil.Process(identity.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def spawn_child(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path | None = None,
    output_fd: int | None = None,
    pass_fds: Sequence[int] = (),
    stdio_fd: int | None = None,
) -> ChildProcess:
    """Start `argv` in a new session (its own process group) and record its identity.

    stdout and stderr go to `output_fd` (the caller's, left open: a bounded log's pipe)
    or to /dev/null: child output may hold private content and stays in the user-only
    state folder. `pass_fds` (the child's end of a private channel) are inherited and
    then closed here.
    """
    output = output_fd if output_fd is not None else subprocess.DEVNULL
    try:
        popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=stdio_fd if stdio_fd is not None else subprocess.DEVNULL,
            stdout=stdio_fd if stdio_fd is not None else output,
            stderr=output,
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(pass_fds),
        )
    finally:
        for inherited in pass_fds:
            os.close(inherited)
    identity = identity_of(popen.pid) or ProcessIdentity(popen.pid, 0, boot_id())
    return ChildProcess(identity, popen)


def signal_group(identity: ProcessIdentity, sig: signal.Signals) -> bool:
    """Send `sig` to the process group led by `identity`, if that exact process lives.

    For processes this server did not start (e.g. orphans found after a restart). Where
    the platform has pidfds, the identity is checked through a pidfd, which stays bound
    to that one process, and the leader is signalled through it, so a reused PID is never
    hit. Returns False when the exact process is gone (ESRCH counts as gone).
    """
    pidfd = open_pidfd(identity.pid)
    try:
        if not is_alive(identity):  # checked after the pidfd pinned the process
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        os.killpg(identity.pid, sig)  # the group ID stays reserved while its leader lives
    except ProcessLookupError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return True


def open_pidfd(pid: int) -> int | None:
    """A descriptor bound to process `pid` that becomes readable when it exits (Linux
    5.3+), or None (no pidfds here, or no such process). The caller closes it."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None


def signal_own_child(child: ChildProcess, sig: signal.Signals) -> None:
    """Signal the group of a child this process started and has not reaped yet.

    An unreaped child keeps its PID (and so its group ID) reserved, even as a zombie,
    so the signal cannot reach an unrelated process.
    """
    if child.popen.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.identity.pid, sig)


def signal_popen_group(popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the group of a `Popen` child this process leads and has not reaped yet.

    The runner's own shell commands: an unreaped child keeps its PID, and so its group
    ID, reserved, so the signal cannot reach an unrelated process.
    """
    if popen.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


def exited_unreaped(child: ChildProcess) -> bool:
    """True if the child has exited; it is left a zombie so its group can be signalled."""
    if child.popen.returncode is not None:
        return True
    try:
        info = os.waitid(os.P_PID, child.identity.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def wait_for_exits(identities: Sequence[ProcessIdentity], timeout_s: float) -> bool:
    """Wait until each exact process has exited (zombies count); True if all did in time.

    For processes another process reaps (children of the zygote): a pidfd becomes readable
    when its process ends, so nothing polls in a loop.
    """
    deadline = time.monotonic() + timeout_s
    poller = select.poll()
    pidfds: list[int] = []
    waiting: set[int] = set()
    try:
        for identity in identities:
            pidfd = open_pidfd(identity.pid)
            if pidfd is None:
                continue
            pidfds.append(pidfd)
            if is_alive(identity):  # checked after the pidfd pinned the process
                poller.register(pidfd, select.POLLIN)
                waiting.add(pidfd)
        while waiting:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return False
            for fd, _ in poller.poll(left_ms):
                poller.unregister(fd)
                waiting.discard(fd)
        return True
    finally:
        for pidfd in pidfds:
            os.close(pidfd)


def set_process_name(name: str) -> None:
    """Name this process for `ps -o comm` and `psutil.Process.name()` (Linux; else nothing).

    A child forked by the zygote keeps the zygote's command line, so the name is how an
    operator (or a test) tells a runner from a resolver from the zygote.
    """
    with contextlib.suppress(OSError):
        (_PROC / "self" / "comm").write_text(name[:15])
