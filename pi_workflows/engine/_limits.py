"""Memory and process limits of workflow code: declared, defaulted, enforced in the runner.

Implements workflow-server.md § Process supervision ("portable memory or process limits")
and issue 11's `limits=`; a node over a limit fails with its own code, `resourceLimit`.
See `NodeGuard` for how each limit is enforced and why.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import psutil

from pi_workflows.engine._errors import WorkflowDefinitionError
from pi_workflows.supervision import DescendantCap, stop_descendants

__all__ = [
    "DEFAULT_MEMORY_CAP_MB",
    "DEFAULT_PROCESSES",
    "MEMORY_ENV",
    "PROCESSES_ENV",
    "RESOURCE_LIMIT_CODE",
    "Limits",
    "NodeGuard",
    "NodeWatch",
    "ResourceLimitExceeded",
    "builtin_memory_mb",
    "default_limits",
    "limits_env",
    "parse_limits",
]

RESOURCE_LIMIT_CODE = "resourceLimit"
"""The node failure code, and the run failure class, of a node over one of its limits."""
MEMORY_ENV = "PI_WORKFLOWS_DEFAULT_MEMORY_MB"
"""The server default `memory_mb` (`0`: none); unset, `builtin_memory_mb()`."""
PROCESSES_ENV = "PI_WORKFLOWS_DEFAULT_PROCESSES"
"""The server default `processes` (`0`: none); unset, DEFAULT_PROCESSES."""
DEFAULT_MEMORY_CAP_MB = 4096
"""The built-in default `memory_mb` is half the machine's memory, at most this."""
DEFAULT_PROCESSES = 512
MIN_MEMORY_MB = 16
MAX_MEMORY_MB = 1 << 30
MAX_PROCESSES = 1_000_000
_KEYS = {"memory_mb": "memoryMb", "processes": "processes"}


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits; `None` means not set here (the enclosing level's applies)."""

    memory_mb: int | None = None
    processes: int | None = None

    def over(self, base: Limits | None) -> Limits:
        """These limits, each unset one taken from `base`."""
        if base is None:
            return self
        return Limits(
            self.memory_mb if self.memory_mb is not None else base.memory_mb,
            self.processes if self.processes is not None else base.processes,
        )

    def to_wire(self) -> dict[str, int]:
        """The set limits in snapshot form: `{"memoryMb": n, "processes": n}`."""
        found = {"memoryMb": self.memory_mb, "processes": self.processes}
        return {key: value for key, value in found.items() if value is not None}

    @property
    def empty(self) -> bool:
        return self.memory_mb is None and self.processes is None


def parse_limits(value: object, what: str) -> Limits | None:
    """Check a `limits={"memory_mb": n, "processes": n}` argument (either key optional).

    Raises:
        WorkflowDefinitionError: naming the key and the rule.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise WorkflowDefinitionError(
            f"{what}: limits must be a dict like {{'memory_mb': 512, 'processes': 32}}, "
            f"got {type(value).__name__}"
        )
    unknown = sorted(str(key) for key in value if key not in _KEYS)
    if unknown:
        raise WorkflowDefinitionError(
            f"{what}: limits has unknown keys {unknown}; use 'memory_mb' and 'processes'"
        )
    memory = value.get("memory_mb")
    processes = value.get("processes")
    if memory is not None and not _int_within(memory, MIN_MEMORY_MB, MAX_MEMORY_MB):
        raise WorkflowDefinitionError(
            f"{what}: limits memory_mb must be an integer number of MiB from "
            f"{MIN_MEMORY_MB} to {MAX_MEMORY_MB}"
        )
    if processes is not None and not _int_within(processes, 1, MAX_PROCESSES):
        raise WorkflowDefinitionError(
            f"{what}: limits processes must be an integer from 1 to {MAX_PROCESSES}"
        )
    limits = Limits(memory, processes)
    return None if limits.empty else limits


def _int_within(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def builtin_memory_mb() -> int:
    """Half of this machine's memory in MiB, at most DEFAULT_MEMORY_CAP_MB."""
    half = psutil.virtual_memory().total // (2 * 1024 * 1024)
    return max(MIN_MEMORY_MB, min(DEFAULT_MEMORY_CAP_MB, half))


def default_limits(environ: Mapping[str, str] | None = None) -> Limits:
    """The server default limits from the environment (see MEMORY_ENV, PROCESSES_ENV).

    Raises:
        ValueError: a variable is not a whole number in range; names the variable.
    """
    env = os.environ if environ is None else environ
    return Limits(
        _env_limit(env, MEMORY_ENV, builtin_memory_mb, MIN_MEMORY_MB, MAX_MEMORY_MB),
        _env_limit(env, PROCESSES_ENV, lambda: DEFAULT_PROCESSES, 1, MAX_PROCESSES),
    )


def _env_limit(
    env: Mapping[str, str], name: str, default: Callable[[], int], low: int, high: int
) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default()  # only then: the machine's memory is read for the built-in one
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value == 0:
        return None
    if not low <= value <= high:
        raise ValueError(f"{name} must be 0 (no default limit) or an integer from {low} to {high}")
    return value


def limits_env(limits: Limits) -> dict[str, str]:
    """The variables that give a runner the server's default limits (`0`: none)."""
    return {MEMORY_ENV: str(limits.memory_mb or 0), PROCESSES_ENV: str(limits.processes or 0)}


# --- in the runner -----------------------------------------------------------------------


class ResourceLimitExceeded(Exception):  # noqa: N818 - the failure code, resourceLimit
    """A node went over one of its limits; the node fails with `resourceLimit`."""

    code = RESOURCE_LIMIT_CODE


@dataclass(slots=True)
class NodeWatch:
    """What happened to one node's limits while it ran."""

    limits: Limits
    breach: int | None = None
    """The live descendants counted past `processes`, or None."""

    def exceeded(self) -> ResourceLimitExceeded | None:
        """The failure to report for a process breach, or None."""
        if self.breach is None:
            return None
        return ResourceLimitExceeded(
            f"the node had {self.breach} processes alive at once; its limit is "
            f"processes={self.limits.processes}, so all of them were stopped"
        )

    def explain(self, exc: BaseException) -> BaseException:
        """The exception to report for a node that raised `exc`: a breach wins."""
        exceeded = self.exceeded()
        if exceeded is not None:
            return exceeded
        if isinstance(exc, MemoryError):
            limit = self.limits.memory_mb
            where = (
                f"its limit is memory_mb={limit} (each of its processes may map {limit} MiB)"
                if limit is not None
                else "it has no memory limit"
            )
            return ResourceLimitExceeded(f"the node ran out of memory; {where}")
        return exc


class NodeGuard:
    """Applies each node's limits around it, and stops what it left running afterwards.

    - **memory_mb** is `RLIMIT_DATA`, in MiB: the data each process of the node may map
      (heap and private writable mappings; the runner's own, about 30 MiB, included).
      Its soft value is set in the runner while the node runs, and every command the node
      starts inherits it; an allocation past it fails (`MemoryError` in Python, `ENOMEM`
      in a command). The hard value is the largest limit any node of the workflow needs,
      so workflow code cannot raise it further. `RLIMIT_AS` is not used: it counts
      reserved address space, which runtimes such as V8 and Go reserve in gigabytes.
    - **processes** bounds the node's live descendants (not the runner, not threads),
      counted through the runner's subreaper (`DescendantCap`), because `RLIMIT_NPROC`
      counts every process of the user (the server and other runners too) and does not
      apply to root. Past it, every descendant is stopped.

    Built once per runner, after the workflow loaded.
    """

    def __init__(self, nodes: Iterable[Limits | None], defaults: Limits) -> None:
        """`nodes`: each node's compiled limits (its own over its workflows')."""
        self._defaults = defaults
        effective = [self.limits_of(own) for own in nodes] or [defaults]
        memory = [limits.memory_mb for limits in effective]
        self._ceiling: int | None = None
        if all(value is not None for value in memory):
            self._ceiling = max(value for value in memory if value is not None)
        self._cap: DescendantCap | None = None
        if any(limits.processes is not None for limits in effective):
            # Before the memory limit: the thread's stack is mapped now. A zygote spare
            # has started it already, while idle (`engine._warm.rehearse`).
            self._cap = DescendantCap.shared()
        _set_data_limit(self._ceiling, hard=True)

    @staticmethod
    def before_load(defaults: Limits) -> None:
        """Bound the workflow module's import by the server default (soft only)."""
        _set_data_limit(defaults.memory_mb, hard=False)

    def limits_of(self, own: Limits | None) -> Limits:
        """A node's effective limits: its own over its workflow's (compiled) over defaults."""
        return (own or Limits()).over(self._defaults)

    @contextlib.contextmanager
    def node(self, own: Limits | None) -> Iterator[NodeWatch]:
        """Run one node under its limits; afterwards stop and reap its leftover processes."""
        watch = NodeWatch(self.limits_of(own))
        memory = watch.limits.memory_mb
        if memory != self._ceiling:
            _set_data_limit(memory, hard=False)
        if self._cap is not None and watch.limits.processes is not None:
            self._cap.arm(watch.limits.processes)
        try:
            yield watch
        finally:
            if self._cap is not None:
                watch.breach = self._cap.disarm()
            if memory != self._ceiling:
                _set_data_limit(self._ceiling, hard=False)  # room to report the failure
            stop_descendants()  # every process the node started, `setsid` or not


def _set_data_limit(memory_mb: int | None, *, hard: bool) -> None:
    """Set RLIMIT_DATA's soft value (and the hard one with `hard`) to `memory_mb` MiB."""
    _, current_hard = resource.getrlimit(resource.RLIMIT_DATA)
    value = resource.RLIM_INFINITY if memory_mb is None else memory_mb * 1024 * 1024
    if current_hard != resource.RLIM_INFINITY and (
        value == resource.RLIM_INFINITY or value > current_hard
    ):
        value = current_hard  # never above the hard value (a stricter parent's, or ours)
    with contextlib.suppress(OSError, ValueError):  # a platform without RLIMIT_DATA
        resource.setrlimit(resource.RLIMIT_DATA, (value, value if hard else current_hard))
