"""Claim -> runner.ready and run.start latency, fast paths against their baseline, in one run.

Two configurations of a real `server run` process, measured alternately (ROUNDS rounds
each, a fresh state folder per round) with the `three` workflow of bench_runs.py:

- baseline: `PI_WORKFLOWS_DEFINITION_CACHE=0` (every run.start runs a resolver child)
  and `PI_WORKFLOWS_ZYGOTE_SPARES=0` (every child is forked on request);
- fast: the defaults: the definition cache answers run.start, and runners come from the
  zygote's pre-forked, rehearsed spares.

Both have the zygote's warm-up (validators built before the fork), which is not
switchable. run.start is timed by the client; claim -> runner.ready is the gap between a
run's `run_claimed` and `runner_live` events (millisecond timestamps the server
commits), read from the state database after the server stopped. The zygote's bare fork
round trip (bench_runs.py) is printed as the floor.

Target (issue 6): claim -> runner.ready <= 5 ms p50; run.start with a cache hit well
under the resolver's.
Run: .venv/bin/python benchmarks/bench_runner_start.py [--runs 60] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from _server import workflow_server
from bench_runs import THREE_WORKFLOW, Runner, percentile, zygote_fork_s

WARMUP = 3
POLL_S = 0.002
CONFIGS = {
    "baseline": {"PI_WORKFLOWS_DEFINITION_CACHE": "0", "PI_WORKFLOWS_ZYGOTE_SPARES": "0"},
    "fast": {},
}


def server(state_dir: Path, extra_env: dict[str, str]) -> contextlib.AbstractContextManager[object]:
    unset = [key for key in CONFIGS["baseline"] if key not in extra_env]
    return workflow_server(state_dir, ["--max-workers", "4"], env=extra_env, unset=unset)


def one_round(folder: Path, extra_env: dict[str, str], runs: int) -> tuple[list[float], list[int]]:
    """Sequential runs on a fresh server: (run.start seconds, claim -> live milliseconds)."""
    state_dir = folder / "agent" / "workflows"
    project = folder / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "three.workflow.py").write_text(THREE_WORKFLOW)
    starts: list[float] = []
    run_ids: list[str] = []
    with server(state_dir, extra_env):
        runner = Runner(state_dir, project, "start")
        try:
            for index in range(WARMUP + runs):
                began = time.perf_counter()
                run_id = runner.start()
                elapsed = time.perf_counter() - began
                if runner.wait(run_id, POLL_S) != "completed":
                    raise RuntimeError(f"run {run_id} did not complete")
                if index >= WARMUP:
                    starts.append(elapsed)
                    run_ids.append(run_id)
        finally:
            runner.close()
    database = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        rows = database.execute(
            "SELECT run_id, event_type, recorded_at FROM events "
            "WHERE event_type IN ('run_claimed', 'runner_live')"
        ).fetchall()
    finally:
        database.close()
    times: dict[str, dict[str, int]] = {}
    for run_id, event_type, recorded_at in rows:
        times.setdefault(run_id, {}).setdefault(event_type, recorded_at)
    gaps = [times[r]["runner_live"] - times[r]["run_claimed"] for r in run_ids if r in times]
    return starts, gaps


def ms(value: float) -> str:
    return f"{value * 1e3:7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60, help="sequential runs per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each configuration")
    args = parser.parse_args()
    starts: dict[str, list[float]] = {name: [] for name in CONFIGS}
    gaps: dict[str, list[int]] = {name: [] for name in CONFIGS}
    began = time.perf_counter()
    for _ in range(args.rounds):
        for name, extra_env in CONFIGS.items():
            folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="piw-"))
            try:
                round_starts, round_gaps = one_round(folder, extra_env, args.runs)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            starts[name] += round_starts
            gaps[name] += round_gaps
    fork = zygote_fork_s(samples=30)["zygote spawn (fork round trip)"]
    total = time.perf_counter() - began

    count = args.runs * args.rounds
    print(f"--- runner start: {count} sequential `three` runs per configuration ---")
    print("claim -> runner.ready p50 (run_claimed -> runner_live events, ms resolution):")
    base_gap = percentile([float(g) for g in gaps["baseline"]], 0.5)
    fast_gap = percentile([float(g) for g in gaps["fast"]], 0.5)
    print(f"  baseline (fork on request)    {base_gap:7.1f} ms")
    print(f"  fast (pre-forked spare)       {fast_gap:7.1f} ms")
    print(f"  zygote fork round trip alone  {ms(fork)}")
    print("run.start p50 (client round trip):")
    base_start = percentile(starts["baseline"], 0.5)
    fast_start = percentile(starts["fast"], 0.5)
    print(f"  resolver child (cache off)    {ms(base_start)}")
    print(f"  definition cache hit          {ms(fast_start)}")
    print("--- ratios (fast / baseline, lower is better) ---")
    gap_ratio = fast_gap / base_gap if base_gap else float("nan")
    print(
        f"claim -> runner.ready: {gap_ratio:6.2f}x   (fast p50 {fast_gap:.0f} ms; target <= 5 ms "
        f"{'MET' if fast_gap <= 5 else 'NOT MET'})"
    )
    print(f"run.start:             {fast_start / base_start:6.2f}x")
    print(f"claim -> runner.ready against the bare fork: {fast_gap / 1e3 / fork:6.1f}x")
    print(f"(benchmark wall time {total:.0f} s)")


if __name__ == "__main__":
    main()
