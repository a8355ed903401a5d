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


def _median_s(command: Sequence[str], env: dict[str, str]) -> float:
    subprocess.run(command, env=env, check=True, capture_output=True)  # compiles bytecode
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        subprocess.run(command, env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="piw-client-start-") as scratch:
        state_dir = Path(scratch) / "state"
        env = dict(os.environ, PI_CODING_AGENT_DIR=scratch)
        cli = [CLI, "--state-dir", str(state_dir)]
        with workflow_server(state_dir):
            floor = _median_s(FLOOR, env)
            print(
                f"python -c 'import click, rich.console': {floor * 1000:7.1f} ms (median of {REPEATS})"
            )
            for args in (["server", "status"], ["run", "list"]):
                took = _median_s([*cli, *args], env)
                label = "pi-workflows " + " ".join(args)
                print(
                    f"{label + ':':38} {took * 1000:7.1f} ms = {took / floor:.2f}× the floor"
                    f" (target ≤ {TARGET:.0f}×)"
                )


if __name__ == "__main__":
    main()
