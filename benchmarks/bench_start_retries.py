"""`run.start` retries answered from the receipt against first starts, in one run.

Issue 11, item 10: the receipt lookup comes before the resolver, so a retry of a
handled start (same client ID, idempotency key and payload; a new request ID) is
answered from the stored receipt by the reader actor, and runs no workflow code. This
measures, on one real `server run --no-execute` process per configuration:

- first start, cache hit: a new key each time; the definition cache answers;
- first start, resolver: a new key each time, `PI_WORKFLOWS_DEFINITION_CACHE=0`;
- adopted retry: the same key and payload as a handled start.

Each figure is the client round trip of one request on an open connection, sequential.
Ratios are printed against the first start with a cache hit measured in the same run.
Run: .venv/bin/python benchmarks/bench_start_retries.py [--samples 300]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from pathlib import Path

from _server import workflow_server
from bench_runs import THREE_WORKFLOW, percentile

from pi_workflows import WorkflowClient

WARMUP = 5


def server(state_dir: Path, cache: bool) -> contextlib.AbstractContextManager[object]:
    env = {"PI_WORKFLOWS_DEFINITION_CACHE": "1" if cache else "0"}
    return workflow_server(state_dir, ["--no-execute"], env=env)


def measure(folder: Path, cache: bool, samples: int) -> dict[str, list[float]]:
    """Round trips (seconds) of first starts and, with the cache, of adopted retries."""
    state_dir = folder / "agent" / "workflows"
    project = folder / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "three.workflow.py").write_text(THREE_WORKFLOW)
    payload = {"workflow": "three", "input": {}, "projectPath": str(project)}
    first: list[float] = []
    retry: list[float] = []
    with server(state_dir, cache), WorkflowClient(state_dir, autostart=False) as client:
        for index in range(WARMUP + samples):
            began = time.perf_counter()
            answer = client.request("run.start", payload, idempotency_key=f"first-{index}")
            elapsed = time.perf_counter() - began
            if answer["outcome"] != "accepted":
                raise RuntimeError(f"run.start answered {answer['outcome']}")
            if index >= WARMUP:
                first.append(elapsed)
        if cache:
            for index in range(WARMUP + samples):
                began = time.perf_counter()
                answer = client.request("run.start", payload, idempotency_key="first-0")
                elapsed = time.perf_counter() - began
                if answer["outcome"] != "adopted":
                    raise RuntimeError(f"a retry answered {answer['outcome']}")
                if index >= WARMUP:
                    retry.append(elapsed)
    return {"first": first, "retry": retry}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300, help="requests per figure")
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    for cache in (True, False):
        folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="piw-"))
        try:
            # The resolver path spawns a child per start: fewer samples keep it short.
            measured = measure(folder, cache, args.samples if cache else args.samples // 5)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if cache:
            results["first start, cache hit"] = measured["first"]
            results["adopted retry"] = measured["retry"]
        else:
            results["first start, resolver"] = measured["first"]
    base = percentile(results["first start, cache hit"], 0.5)
    base99 = percentile(results["first start, cache hit"], 0.99)
    print("--- run.start round trips (sequential, one connection) ---")
    print(f"{'':24} {'p50':>9} {'p99':>9}  {'p50 ratio':>9} {'p99 ratio':>9}")
    for name, samples in results.items():
        p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
        print(
            f"{name:24} {p50 * 1e3:7.2f}ms {p99 * 1e3:7.2f}ms"
            f"  {p50 / base:8.2f}x {p99 / base99:8.2f}x"
        )


if __name__ == "__main__":
    main()
