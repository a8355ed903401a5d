"""Named crash points: fault injection as a product feature.

Implements python-port.md decision 9 and workflow-server.md § Conformance ("projections
remain consistent after injected crashes"): `PI_WORKFLOWS_CRASH=<point>[@<n>]` makes the
process that reaches the named point for the n-th time SIGKILL itself, at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal, TextIO, TypeAlias

from pi_workflows.errors import PiWorkflowsError

__all__ = [
    "CRASH_ENV",
    "CRASH_ONCE_ENV",
    "CRASH_POINTS",
    "LIFECYCLE_TRANSITIONS",
    "PROCESS_KINDS",
    "CrashPoint",
    "CrashSpec",
    "InvalidCrashSpecError",
    "ProcessKind",
    "UnknownCrashPointError",
    "armed_crash",
    "configure_crash",
    "crash_point",
    "parse_crash_spec",
]

CRASH_ENV: Final = "PI_WORKFLOWS_CRASH"
"""The environment variable that arms one crash point: `<point>[@<n>]`."""
CRASH_ONCE_ENV: Final = "PI_WORKFLOWS_CRASH_ONCE"
"""Optional path of a marker file: only the one process that creates it dies, so an armed
point kills once across every process that inherits the variable (a server and all its
runners), instead of once in each of them."""

ProcessKind: TypeAlias = Literal["server", "runner", "resolver", "client"]
PROCESS_KINDS: Final[tuple[ProcessKind, ...]] = ("server", "runner", "resolver", "client")
"""The processes a crash point can live in; a point's name starts with its process."""


class UnknownCrashPointError(PiWorkflowsError, LookupError):
    """`crash_point` was called with a name that was never declared: a programming error."""


class InvalidCrashSpecError(PiWorkflowsError, ValueError):
    """A `PI_WORKFLOWS_CRASH` value that names no declared point or has a bad `@n`."""


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """One declared place where an armed process kills itself."""

    name: str
    """Dotted and unique, starting with its process, e.g. `server.receipt.after_commit`."""
    process: ProcessKind
    """The process that reaches the point; only that process can be killed by it."""
    interrupts: str
    """One sentence: the work the crash interrupts, i.e. what is and is not durable yet."""


@dataclass(frozen=True, slots=True)
class CrashSpec:
    """A parsed `PI_WORKFLOWS_CRASH` value."""

    point: str
    """A declared crash point name."""
    hit: int
    """Crash on this hit of the point in one process (1 = the first)."""


_NAME = re.compile(r"^(server|runner|resolver|client)(\.[a-z][a-z0-9_]*)+$")
_POINTS: dict[str, CrashPoint] = {}

CRASH_POINTS: Final[Mapping[str, CrashPoint]] = MappingProxyType(_POINTS)
"""Every declared crash point by name, in declaration order (read-only)."""


def _declare(name: str, process: ProcessKind, interrupts: str) -> None:
    if not _NAME.match(name) or name.split(".", 1)[0] != process:
        raise ValueError(f"crash point {name!r} must be dotted and start with {process!r}")
    if name in _POINTS:
        raise ValueError(f"crash point {name!r} is declared twice")
    _POINTS[name] = CrashPoint(name, process, interrupts)


# --- The declared points. Each is declared once; code reaches it with crash_point(name).
# Server: lifecycle transitions, receipts, launches, the ready handshake, cancellation.
LIFECYCLE_TRANSITIONS: Final = (
    "enqueue",
    "launch",
    "ready",
    "node_start",
    "node_finish",
    "node_fail",
    "park",
    "wait",
    "pause",
    "resume",
    "requeue",
    "complete",
    "fail",
    "time_out",
    "cancel",
    "recover",
)
"""Every run lifecycle transition by the name its crash points carry."""
for _transition in LIFECYCLE_TRANSITIONS:
    _declare(
        f"server.lifecycle.{_transition}.before_commit",
        "server",
        f"The {_transition} transition after its changes and before the COMMIT that "
        "would make it durable, so the whole transition is lost.",
    )
    _declare(
        f"server.lifecycle.{_transition}.after_commit",
        "server",
        f"The {_transition} transition right after its COMMIT, before the server acts on "
        "it (answers a client or a runner, signals a runner or launches one).",
    )
# Server: state retention (manual `state prune` and automatic cleanup share them).
_declare(
    "server.lifecycle.prune_tree.before_commit",
    "server",
    "One expired root-run tree's deletion after its rows are deleted and before the "
    "COMMIT, so the whole tree is kept.",
)
_declare(
    "server.lifecycle.prune_tree.after_commit",
    "server",
    "One expired root-run tree's deletion right after its COMMIT, before its files go "
    "and the next tree is deleted.",
)
_declare(
    "server.retention.before_blob_collection",
    "server",
    "A sweep after its trees were deleted and before the unreferenced blobs are "
    "collected; the next sweep collects them.",
)
_declare(
    "server.retention.before_wal_truncate",
    "server",
    "An idle sweep after its deletions and blob collection committed and before the WAL "
    "is truncated.",
)
_declare(
    "server.retention.before_vacuum",
    "server",
    "An idle sweep after the WAL was truncated and before VACUUM starts.",
)
_declare(
    "server.retention.after_vacuum",
    "server",
    "An idle sweep right after VACUUM returned, before the WAL is truncated again.",
)
_declare(
    "server.receipt.after_commit",
    "server",
    "A client command after its receipt committed and before its response is written "
    "to the client.",
)
_declare(
    "server.launch.after_commit",
    "server",
    "A launch after the run's claim and runner epoch committed and before the runner "
    "process is spawned.",
)
_declare(
    "server.launch.after_spawn",
    "server",
    "A launch after the runner process was spawned and before its process identity is recorded.",
)
_declare(
    "server.ready.before_command",
    "server",
    "The ready handshake after the server received runner.ready and before it sends "
    "the runner its command.",
)
# Server: each runner message kind, after the write that applied it committed and
# before its reply is sent (a retried message adopts the stored reply).
RUNNER_MESSAGE_POINTS: Final = (
    "runner.ready",
    "runner.progress",
    "node.started",
    "node.finished",
    "node.failed",
    "effect.reserve",
    "effect.settle",
    "notification.requested",
    "interaction.requested",
    "run.parked",
    "run.finished",
)
for _kind in RUNNER_MESSAGE_POINTS:
    _declare(
        f"server.runner_message.{_kind.replace('.', '_')}.after_commit",
        "server",
        f"A runner's {_kind} after the write that applied it committed and before its "
        "reply is sent; the runner's retry adopts the stored reply.",
    )
# Server: fencing after a pause or cancel, and the drain of a graceful stop.
for _command in ("pause", "cancel"):
    _declare(
        f"server.lifecycle.{_command}.before_fence",
        "server",
        f"A {_command} after it committed (the claim is released) and before the runner "
        "is told to stop; the runner's next message is refused.",
    )
_declare(
    "server.drain.started",
    "server",
    "A graceful stop after it stopped admitting work and before runners are drained; "
    "every held run is still running under its claim.",
)
_declare(
    "server.drain.after_hand_back",
    "server",
    "A drain after a run was handed back at a durable boundary (requeued, committed) and "
    "before its runner hears claim loss.",
)
# Server: the database actor's group commit (one COMMIT for a batch of units).
_declare(
    "server.group_commit.before_commit",
    "server",
    "A group commit after every unit of the batch ran and before its one COMMIT, so "
    "the writes of every unit in the batch are lost and none was answered.",
)
_declare(
    "server.group_commit.after_commit",
    "server",
    "A group commit right after its one COMMIT and before any unit of the batch is "
    "answered (no client response, runner reply or launch has happened yet).",
)
# Server: a verified backup (`state backup`, `state prune --apply`) and its receipt.
_declare(
    "server.backup.copy",
    "server",
    "A backup after a copy step and before the copy is complete, synced and verified, "
    "so only a private .partial file exists beside the destination and no receipt is "
    "stored.",
)
_declare(
    "server.backup.verify",
    "server",
    "A backup after its copy completed and before its verification, so the copy is "
    "still the private .partial file and the destination does not exist.",
)
_declare(
    "server.backup.linked",
    "server",
    "A backup after the verified copy was linked to its destination and before its "
    "receipt is stored (a retry of the invocation finds the file and is refused).",
)
# Server: a Telegram delivery (or edit) between its reservation, its send and its result.
_declare(
    "server.channel.after_reserve",
    "server",
    "A Telegram send or edit after its attempt was reserved (committed) and before the "
    "command is written to the adapter, so nothing was sent.",
)
_declare(
    "server.channel.after_send",
    "server",
    "A Telegram send or edit after its command was written to the adapter and before "
    "its result is recorded; the adapter may have sent it.",
)
_declare(
    "server.channel.after_result",
    "server",
    "A Telegram send or edit after its result was recorded (committed), such as a 429's "
    "retry time, before the server acts on it.",
)
# Server: its own startup recovery.
_declare(
    "server.recovery.after_epoch",
    "server",
    "Startup after the new server epoch was taken and before startup recovery begins.",
)
_declare(
    "server.recovery.after_first_run",
    "server",
    "Startup recovery after a batch of stale runs was recovered and committed (the first "
    "batch holds the first 100), before the remaining runs are recovered.",
)
# Server: a resource reconcile pass's claim (made by the scheduler's admission) and the
# commit of its result, each a transaction whose COMMIT passes its pair.
_declare(
    "server.lifecycle.reconcile_claim.before_commit",
    "server",
    "A reconcile pass's claim of a due resource key before its COMMIT, so the key stays "
    "queued and unclaimed.",
)
_declare(
    "server.lifecycle.reconcile_claim.after_commit",
    "server",
    "A reconcile pass's claim of a due resource key right after its COMMIT, before its "
    "resource runner child is started.",
)
_declare(
    "server.lifecycle.reconcile_commit.before_commit",
    "server",
    "A reconcile pass's result commit before its COMMIT, so the pass ran but its result "
    "is lost and its claim is still held.",
)
_declare(
    "server.lifecycle.reconcile_commit.after_commit",
    "server",
    "A reconcile pass's result commit right after its COMMIT (status, queue and claim "
    "release durable), before the server acts on it.",
)
# Server: a resource manager's pass.
_declare(
    "server.resource.ensure.child_reserved",
    "server",
    "A resource pass's ctx.workflows.ensure after the child run's reservation and its "
    "queued run committed, before the answer is sent to the resource runner.",
)
# Runner: the ready handshake, managed effects, and every message it sends.
_declare(
    "runner.ready.before_send",
    "runner",
    "The ready handshake after the runner read its launch envelope and before it sends "
    "runner.ready.",
)
_declare(
    "runner.effect.after_reserve",
    "runner",
    "A managed effect after the server confirmed its reservation and before its apply is called.",
)
_declare(
    "runner.effect.after_apply",
    "runner",
    "A managed effect after its apply returned and before its settlement is sent to the server.",
)
_declare(
    "runner.message.after_send",
    "runner",
    "A runner message after it was written to the server and before the runner reads its answer.",
)
_declare(
    "runner.content.after_write",
    "runner",
    "A value sent by reference after one of its content.write parts was stored and "
    "before the message that names it is sent, so the node runs again (`@n`: the n-th part).",
)
RUNNER_SENT_KINDS: Final = RUNNER_MESSAGE_POINTS
"""The kinds a runner sends that have points: the same kinds the server applies."""
for _kind in RUNNER_SENT_KINDS:
    _declare(
        f"runner.message.{_kind.replace('.', '_')}.after_send",
        "runner",
        f"A runner's {_kind} after it was written to the server and before the runner "
        "reads any answer (a pipelined one is answered later, or never).",
    )
_declare(
    "runner.effect.after_settle",
    "runner",
    "A managed effect after the server accepted its settlement and before the node that "
    "applied it finishes.",
)
_declare(
    "runner.effect.after_read_back",
    "runner",
    "A managed effect after its read-back observed the external system and before that "
    "proof is sent to the server.",
)

# Runner: a resource runner child's one pass (the server commits what it proposes).
_declare(
    "runner.reconcile.after_load",
    "runner",
    "A resource runner after it loaded the manager's applied source and before its "
    "reconcile runs, so no manager code ran.",
)
_declare(
    "runner.reconcile.before_result",
    "runner",
    "A resource runner after its reconcile returned and before the proposed result is "
    "sent, so the pass has no outcome and its code ran.",
)


def parse_crash_spec(value: str) -> CrashSpec:
    """Parse `<point>[@<n>]`: a declared point name and an optional positive hit number.

    Raises:
        InvalidCrashSpecError: the point is not declared, or `n` is not a positive
            decimal integer.
    """
    text = value.strip()
    point, sep, count = text.partition("@")
    if point not in _POINTS:
        raise InvalidCrashSpecError(
            f"{CRASH_ENV}={value!r} names no crash point "
            "(`pi-workflows debug crash-points` lists them)"
        )
    if not sep:
        return CrashSpec(point, 1)
    if not count.isdecimal() or not count.isascii() or int(count) < 1:
        raise InvalidCrashSpecError(
            f"{CRASH_ENV}={value!r}: the hit after @ must be a positive integer, as in {point}@2"
        )
    return CrashSpec(point, int(count))


class _Unread:
    """The armed state of a forked child that has not read its own environment yet."""


_UNREAD: Final = _Unread()
_armed: CrashSpec | _Unread | None = None
_hits = 0
_lock = threading.Lock()


def configure_crash(value: str | None = None, *, report: TextIO | None = None) -> CrashSpec | None:
    """Arm (or disarm) this process from a `PI_WORKFLOWS_CRASH` value and reset its count.

    The module calls this once when it is imported, with the environment's value, and
    a forked child calls it again at its first crash point. An empty or unset value
    disarms. An invalid value also disarms, and writes one line to `report` (standard
    error by default) instead of raising, so a typo is visible but never kills the
    process at a random place.

    Args:
        value: The value to use; None reads `os.environ`.
        report: Where an invalid value is reported.

    Returns:
        The armed spec, or None when the process is disarmed.
    """
    global _armed, _hits  # noqa: PLW0603 - one process-wide switch, set under the lock
    raw = os.environ.get(CRASH_ENV, "") if value is None else value
    spec: CrashSpec | None = None
    if raw.strip():
        try:
            spec = parse_crash_spec(raw)
        except InvalidCrashSpecError as exc:
            stream = report if report is not None else sys.stderr
            try:
                stream.write(f"pi-workflows: ignoring {exc}; no crash point is armed\n")
                stream.flush()
            except (OSError, ValueError):
                pass  # no usable stderr: nothing else can show it
    with _lock:
        _armed = spec
        _hits = 0
    return spec


def armed_crash() -> CrashSpec | None:
    """The point this process is armed with and the hit it dies on, or None."""
    armed = _armed
    if isinstance(armed, _Unread):
        return configure_crash()
    return armed


def crash_point(name: str) -> None:
    """Mark the declared crash point `name`; SIGKILL this process on its armed hit.

    **Cost:** with no point armed, one dict lookup. Hits are counted per process, on
    every thread, only while a point is armed; a forked child starts counting at zero.

    Raises:
        UnknownCrashPointError: `name` was never declared (checked armed or not).
    """
    armed = _armed
    if armed is None:
        if name in _POINTS:
            return
        raise UnknownCrashPointError(f"crash point {name!r} is not declared")
    _reach(name)


def _reach(name: str) -> None:
    global _hits  # noqa: PLW0603 - the per-process hit count, changed under the lock
    if name not in _POINTS:
        raise UnknownCrashPointError(f"crash point {name!r} is not declared")
    armed = armed_crash()
    if armed is None or armed.point != name:
        return
    with _lock:
        _hits += 1
        if _hits != armed.hit:
            return
        if not _claim_the_one_kill():
            return
        # Holding the lock: no other thread gets past this point before the kill lands.
        with contextlib.suppress(OSError):
            os.write(2, f"pi-workflows: crash point {name} hit {armed.hit}: SIGKILL\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)
        os._exit(128 + signal.SIGKILL)  # not reached: SIGKILL cannot be caught


def _claim_the_one_kill() -> bool:
    marker = os.environ.get(CRASH_ONCE_ENV)
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return False  # another process already died here
    except OSError:
        return True  # an unusable marker path must not silently disarm the point
    return True


def _after_fork_in_child() -> None:
    global _armed, _hits, _lock  # noqa: PLW0603 - a forked child counts its own hits
    _lock = threading.Lock()  # another thread of the parent may have held it
    _armed = _UNREAD
    _hits = 0


configure_crash()
# A child forked without exec (the zygote) may get another environment before it
# runs: it reads the variable again at its first crash point, and counts anew.
os.register_at_fork(after_in_child=_after_fork_in_child)
