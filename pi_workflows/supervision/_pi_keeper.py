"""The keeper of one `pi --mode rpc` child: a child subreaper that outlives pi briefly.

Run as `python -I -S _pi_keeper.py PI_ARGV...` (by path, standard library only, so it
starts in milliseconds). It declares itself a child subreaper, forks pi into its own
process group and waits for it; stdin and stdout are pi's alone. pi's bash tool gives
every call a session of its own, and a call that daemonised (`cmd &` whose bash exited,
`setsid cmd &`) is re-parented: without the keeper to its nearest subreaper above pi
(the runner, or nothing the server knows once the runner is gone). With the keeper
every such process stays below the keeper, so:

- pi's stop (`PiChild.stop`) and the server's stop of the registered group see the
  whole tree while the keeper lives (`kill_descendants` before the group's SIGKILL);
- when pi ends for any reason (stdin EOF because the runner was SIGKILLed, SIGTERM, a
  crash), the keeper SIGKILLs and reaps everything left below it, then exits with
  pi's status. A SIGKILL of the group kills the keeper too: the runner's subreaper and
  the server's `kill_descendants` are the backstops then.

Signals that ask pi to stop (SIGTERM, SIGHUP, SIGINT) are passed on to pi, which then
ends its tool groups itself (pi-rpc.md § 7); the keeper stays to clean up after it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def keeper_argv(pi_argv: list[str]) -> list[str]:
    """The argv that runs `pi_argv` under a keeper (`-I -S`: no site, no user paths)."""
    return [sys.executable, "-I", "-S", str(Path(__file__).resolve()), *pi_argv]


__all__ = ["keeper_argv"]


def _children() -> list[int]:
    me = os.getpid()
    task = Path(f"/proc/{me}/task/{me}/children")
    if task.exists():  # CONFIG_PROC_CHILDREN; the keeper has one thread
        with contextlib.suppress(OSError):
            return [int(word) for word in task.read_text().split()]
        return []
    found: list[int] = []  # else: every process whose parent is this one
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                if int(stat[stat.rindex(")") + 2 :].split()[1]) == me:
                    found.append(int(entry.name))
    return found


def _end_everything_below() -> None:
    """SIGKILL each child and reap it until none is left (its own children are then
    re-parented here and met in the next round). The keeper has no other children, so
    waiting for any child steals no one's status."""
    while True:
        children = _children()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # our own unreaped child: the PID is ours
        try:
            # Block only for a child just killed; one re-parented after the listing is
            # met in the next round.
            done, _ = os.waitpid(-1, 0 if children else os.WNOHANG)
        except ChildProcessError:
            return
        if not children and done == 0:
            time.sleep(0.001)


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    pid = os.fork()
    if pid == 0:
        try:
            os.execv(argv[0], argv)  # noqa: S606 - pi's argv, no shell on purpose
        except OSError as exc:
            os.write(2, f"pi keeper: cannot start pi: {exc.strerror}\n".encode())
        os._exit(127)
    for signum in _FORWARDED:
        signal.signal(signum, lambda sig, _frame: _forward(pid, sig))
    # pi's pipes are pi's: the runner sees end of file as soon as pi exits.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    _, status = os.waitpid(pid, 0)
    for signum in _FORWARDED:
        signal.signal(signum, signal.SIG_IGN)  # cleaning up now; a second stop waits
    _end_everything_below()
    if os.WIFSIGNALED(status):
        death = os.WTERMSIG(status)
        signal.signal(death, signal.SIG_DFL)
        os.kill(os.getpid(), death)  # the same death as pi's, for the runner's report
    return os.waitstatus_to_exitcode(status)


def _forward(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
