"""What the process supervisor is asked, and what it answers: plain data.

Implements workflow-server.md § Process supervision as messages: spawn a child in its
own group, stop or kill a child's group, kill a registered group, stop recorded groups
at startup. The process-supervisor actor (`actors/_process_supervisor.py`) carries
them out; it is the one place in the server that signals a process group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pi_workflows._address import Address
from pi_workflows.supervision._process import ProcessIdentity

__all__ = ["ChildExited", "KillChild", "Spawn", "StopChild", "StopGroup", "StopRecorded"]


@dataclass(frozen=True, slots=True)
class ChildExited:
    """To a spawn's `reply_to`: the child was reaped."""

    tag: Any
    """The spawn's tag, as it was."""
    identity: ProcessIdentity
    returncode: int
    """Exit code, or minus the signal number that ended it."""
    killed: bool
    """True when the supervisor had to escalate to SIGKILL."""


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start a child in its own process group."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(repr=False)
    """The child's whole environment (may hold credentials: never logged)."""
    reply_to: Address
    """Gets `Done(tag, Reply(identity))` (or the spawn's `OSError`), then `ChildExited`."""
    tag: Any = None
    """What the spawn is about (a runner epoch, a submission), returned in both answers."""
    report_exit: bool = True
    """Tell `ChildExited` once the child is reaped (False: only the spawn's answer)."""
    cwd: Path | None = None
    log_path: Path | None = None
    """Where the child's stdout and stderr go, bounded to `LOG_CAP_BYTES` (else nowhere)."""
    pass_fds: tuple[int, ...] = ()
    """File descriptors the child inherits; closed in the server once it is spawned."""
    preloaded: str | None = None
    """A module the zygote has imported whose `main()` is this same program: the child
    is forked warm. `fd_env` names the variable that gets the first of `pass_fds`."""
    fd_env: str | None = None
    stdio: bool = False
    """The first of `pass_fds` becomes the child's stdin and stdout (a resolver's socket)."""


@dataclass(frozen=True, slots=True)
class StopChild:
    """Stop a child's process group: SIGTERM, then SIGKILL after `grace_ticks` ticks."""

    identity: ProcessIdentity
    grace_ticks: int = 20


@dataclass(frozen=True, slots=True)
class KillChild:
    """SIGKILL a child's process group at once (a resolver that answered or overran)."""

    identity: ProcessIdentity


@dataclass(frozen=True, slots=True)
class StopGroup:
    """SIGKILL the group of a process the server did not start (a registered shell
    command group, a registered Pi child): through a pidfd, after an identity check."""

    identity: ProcessIdentity


@dataclass(frozen=True, slots=True)
class StopRecorded:
    """Startup recovery: SIGKILL every recorded group by exact identity, wait for them.

    **Blocking:** waits up to `timeout_s` for the exits, on the supervisor's thread. It
    is sent once, before any runner, client or tick exists, so nothing else waits.
    """

    identities: tuple[ProcessIdentity, ...]
    reply_to: Address
    """Gets `Done(None, Reply(n))`: how many processes were alive and signalled."""
    timeout_s: float = 5.0
