"""Signals for a headless `pi --mode rpc` child's group and its tool processes.

Implements the signal half of pi-rpc.md § 7 (the supervisor recipe) for the runner:
pi runs in its own process group, but its bash tool gives every call a session of its
own (`setsid`), so a signal to pi's group misses the tools. pi's SIGTERM handler kills
the tool groups it tracks; its stdin-EOF exit and a SIGKILL do not. So the stop
sequence snapshots pi's descendants with their groups first, and whatever of them is
still alive once pi has gone is terminated, then killed, by exact identity.

The RPC half (abort, closing stdin) is in `pi_workflows.engine._pi_child`, which is
not allowed to signal anything itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psutil

from pi_workflows.supervision._process import (
    ProcessIdentity,
    identity_of,
    is_alive,
    signal_group,
    signal_popen_group,
    wait_for_exits,
)

__all__ = [
    "Descendant",
    "end_descendants",
    "snapshot_descendants",
    "terminate_then_kill",
]


@dataclass(frozen=True, slots=True)
class Descendant:
    """A process below pi at snapshot time, known by exact identity, and its group."""

    identity: ProcessIdentity
    process_group: int


def snapshot_descendants(pid: int) -> tuple[Descendant, ...]:
    """Every live descendant of `pid` (children, grandchildren, ...) with its group.

    Follows parent links, so it sees tool processes in sessions of their own, but not
    processes whose parent already exited (they were re-parented away from pi).
    """
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return ()
    found: list[Descendant] = []
    for child in children:
        identity = identity_of(child.pid)
        if identity is None:
            continue
        try:
            group = os.getpgid(child.pid)
        except ProcessLookupError:
            continue
        found.append(Descendant(identity, group))
    return tuple(found)


def _signal_exact(identity: ProcessIdentity, sig: signal.Signals) -> None:
    """Signal one exact process: through a pidfd where there is one, so a reused PID is safe."""
    opener = getattr(os, "pidfd_open", None)
    pidfd: int | None = None
    if opener is not None:
        with contextlib.suppress(OSError):
            pidfd = int(opener(identity.pid))
    try:
        if not is_alive(identity):  # checked after the pidfd pinned the process
            return
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(identity.pid, sig)
    except ProcessLookupError:
        return
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _signal_descendants(descendants: Iterable[Descendant], sig: signal.Signals) -> None:
    own_group = os.getpgrp()
    for descendant in descendants:
        leads_group = descendant.process_group == descendant.identity.pid
        if leads_group and descendant.process_group != own_group:
            # The whole tool group, members the snapshot never saw included.
            signal_group(descendant.identity, sig)
        else:
            _signal_exact(descendant.identity, sig)


def end_descendants(descendants: Sequence[Descendant], grace_s: float) -> tuple[Descendant, ...]:
    """SIGTERM the snapshotted descendants still alive, wait `grace_s`, then SIGKILL them.

    Returns the ones still alive after the SIGKILL and a second short wait (normally
    none; a process stuck in the kernel can outlive both).
    """
    alive = [d for d in descendants if is_alive(d.identity)]
    if not alive:
        return ()
    _signal_descendants(alive, signal.SIGTERM)
    if wait_for_exits([d.identity for d in alive], grace_s):
        return ()
    alive = [d for d in alive if is_alive(d.identity)]
    _signal_descendants(alive, signal.SIGKILL)
    wait_for_exits([d.identity for d in alive], grace_s)
    return tuple(d for d in alive if is_alive(d.identity))


def terminate_then_kill(
    popen: subprocess.Popen[bytes], grace_s: float
) -> tuple[str, tuple[Descendant, ...]]:
    """Stop pi's group: SIGTERM, wait up to `grace_s`, then SIGKILL the group.

    pi's SIGTERM handler kills the tool groups it tracks. Before a SIGKILL, which gives
    pi no such chance, its descendants are snapshotted again and returned, so the caller
    ends them too (`end_descendants`). pi is reaped before this returns.

    Returns:
        (`"sigterm"` or `"sigkill"`, the descendants seen just before a SIGKILL).
    """
    signal_popen_group(popen, signal.SIGTERM)
    try:
        popen.wait(grace_s)
        return "sigterm", ()
    except subprocess.TimeoutExpired:
        pass
    late = snapshot_descendants(popen.pid)
    signal_popen_group(popen, signal.SIGKILL)
    _signal_descendants(late, signal.SIGKILL)
    popen.wait()
    return "sigkill", late
