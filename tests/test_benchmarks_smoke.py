"""Benchmarks that must not rot: each runs here once with tiny sizes, end to end.

A benchmark is not a timed test (the figures on a loaded machine prove nothing), so this
checks only that it runs to the end and prints every measure with its ratio and target.
Add a benchmark with its tiny arguments to BENCHMARKS.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import Processes

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = {
    "bench_checks.py": (
        ["--checks", "20", "--repeats", "1"],
        [
            "new/old checks per second, valid values",
            "input first check new-old time:",
            "input schema's own check new/old time:",
        ],
    ),
    "bench_observation.py": (
        ["--calls", "20", "--rounds", "2", "--runs", "2"],
        [
            "cached / uncached run.get server CPU:",
            "idle run.get / unix-socket echo:",
            "subscription / polling p50:",
            "subscription / polling server CPU per run:",
        ],
    ),
    # Runs its peers (DBOS, Restate) only where the bench extra and `npm ci` put them;
    # CI has neither, and their ratios print "skipped".
    "bench_peers.py": (
        [
            *("--runs", "3", "--seconds", "0.5", "--clients", "2"),
            *("--chain-runs", "1", "--long-nodes", "5", "--get-samples", "10"),
        ],
        [
            "pi-workflows/DBOS p50:",
            "pi-workflows/DBOS throughput:",
            "pi-workflows/DBOS CPU per run:",
            "pi-workflows/Restate throughput:",
            "pi-workflows/DBOS cost per extra node:",
            "pi-workflows/DBOS database bytes per run:",
            "pi-workflows/DBOS database bytes per run beyond the empty database:",
            "run.get idle / Unix-socket echo:",
        ],
    ),
    "bench_resource_managers.py": (
        ["--samples", "2", "--seconds", "0.5", "--resources", "5"],
        ["p50 pass / p50 run:", "passes/s / runs/s:", "events settled / runs completed:"],
    ),
    "bench_storage_per_run.py": (["--runs", "2"], ["bytes per run / DBOS reference"]),
    # The real pi (three children, one working at a time; it takes a real-pi slot itself).
    "bench_session_record.py": (
        ["--runs", "1", "--warmup", "0"],
        ["on / off p50 step turn:", "on / off p90 step turn:", "on / off median of rounds:"],
    ),
}


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_benchmark_runs_with_tiny_sizes(name: str, processes: Processes) -> None:
    args, ratios = BENCHMARKS[name]
    child = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / name), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    processes.started.append(child)  # its group (and the server in it) dies at teardown
    try:
        out, err = child.communicate(timeout=200)
    finally:
        # A server that left the benchmark's group is killed by its PID at teardown too.
        with contextlib.suppress(psutil.Error):
            for descendant in psutil.Process(child.pid).children(recursive=True):
                processes.adopt(descendant.pid)
    assert child.returncode == 0, err[-2000:]
    for ratio in ratios:
        lines = [line for line in out.splitlines() if line.startswith(ratio)]
        assert lines, f"{name} printed no {ratio!r} line:\n{out}"
        assert "target" in lines[0]
