"""The workflow server as the benchmarks start it: `server run` in a child process.

Every benchmark that measures a real server starts it the same way (the CLI, a state
folder of its own, no idle exit), so the figures of different benchmarks are comparable.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

STOP_TIMEOUT_S = 30.0


@contextlib.contextmanager
def workflow_server(
    state_dir: Path,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    unset: Sequence[str] = (),
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """`pi-workflows server run --idle-exit 0 ARGS`, yielded once it prints that it runs.

    `env` is added to this process's environment and the names in `unset` are removed;
    on exit the server gets SIGTERM (a graceful stop) and, if it lingers, SIGKILL.

    Raises:
        RuntimeError: the server did not start.
    """
    environment = dict(os.environ, PI_CODING_AGENT_DIR=str(state_dir.parent), **(env or {}))
    for name in unset:
        environment.pop(name, None)
    command = [sys.executable, "-m", "pi_workflows.cli", "--state-dir", str(state_dir)]
    child = subprocess.Popen(
        [*command, "server", "run", "--idle-exit", "0", *args],
        stdout=subprocess.PIPE,
        text=True,
        env=environment,
        preexec_fn=preexec_fn,  # noqa: PLW1509 - only a resource limit, set before exec
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if "running" not in line:
            raise RuntimeError(f"the server did not start: {line!r}")
        yield child
    finally:
        child.terminate()
        try:
            child.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(10)
