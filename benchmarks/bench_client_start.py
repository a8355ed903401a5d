"""How long the command line takes to start: `pi-workflows server status` (issue 30).

Prints the median wall time of `pi-workflows server status` and `pi-workflows run list`
against a running server, next to `python -c 'import click, rich.console'` (the floor
any click-and-rich CLI pays), and the ratio (target ≤ 3×). Bytecode is cached first
(one warm-up run each), so the figures are of imports and work, not of compiling.
A real server (`server run`), the real console script; nothing is mocked.
Run it on a quiet machine: `python benchmarks/bench_client_start.py`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _server import workflow_server

REPEATS = int(os.environ.get("CLIENT_START_BENCH_REPEATS", "15"))
TARGET = 3.0
CLI = str(Path(sys.executable).parent / "pi-workflows")
FLOOR = [sys.executable, "-c", "import click, rich.console"]


def _medians_s(commands: Sequence[Sequence[str]], env: dict[str, str]) -> list[float]:
    """Each command's median wall time; the runs are interleaved, so a change in the
    machine's load weighs on every command alike."""
    times: list[list[float]] = [[] for _ in commands]
    for command in commands:  # compiles bytecode, opens the caches
        subprocess.run(command, env=env, check=True, capture_output=True)
    for _ in range(REPEATS):
        for command, taken in zip(commands, times, strict=True):
            started = time.perf_counter()
            subprocess.run(command, env=env, check=True, capture_output=True)
            taken.append(time.perf_counter() - started)
    return [statistics.median(taken) for taken in times]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="piw-client-start-") as scratch:
        state_dir = Path(scratch) / "state"
        env = dict(os.environ, PI_CODING_AGENT_DIR=scratch)
        cli = [CLI, "--state-dir", str(state_dir)]
        commands = [["server", "status"], ["run", "list"]]
        with workflow_server(state_dir):
            floor, *took = _medians_s([FLOOR, *([*cli, *args] for args in commands)], env)
        print(
            f"python -c 'import click, rich.console': {floor * 1000:7.1f} ms (median of {REPEATS})"
        )
        for args, median in zip(commands, took, strict=True):
            label = "pi-workflows " + " ".join(args) + ":"
            print(
                f"{label:38} {median * 1000:7.1f} ms = {median / floor:.2f}× the floor"
                f" (target ≤ {TARGET:.0f}×)"
            )


if __name__ == "__main__":
    main()
