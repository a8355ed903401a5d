"""What the per-node guard (limits and the escapee stop) costs a runner, in one run.

Every node a runner executes goes through `NodeGuard.node` (engine/_limits.py): set the
node's data rlimit, arm the process cap, and at its end disarm it, restore the rlimit
and list (and stop) the runner's descendants through its subreaper. This measures, in
this process made a subreaper like a runner:

- a trivial node (a function returning a dict) inside the guard with the server
  default limits (memory and processes), and with a node limit that differs from the
  ceiling (two setrlimit calls more), against what a pipelined compute node costs the
  runner anyway: encoding (schema check, canonical JSON) and sending its
  `node.started` and `node.finished` over a socketpair;
- the stop at the end of a node that left 4 `setsid sleep` escapees (kill and reap),
  against starting those 4 processes.

Figures are per node, p50 of ROUNDS, printed as microseconds and as ratios against the
two messages measured in the same run. A 3-compute-node run end to end takes milliseconds
(benchmarks/bench_runs.py), which is the scale the guard is to be read against.
Run: .venv/bin/python benchmarks/bench_node_guard.py
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

from pi_workflows.engine._limits import Limits, NodeGuard, default_limits
from pi_workflows.supervision._subreaper import become_subreaper, stop_descendants
from pi_workflows.wire.protocol import LAUNCH_SCHEMA, encode_runner_message

ROUNDS = 2000
ESCAPE_ROUNDS = 40
ESCAPEES = 4


def _node(ctx: Any = None) -> dict[str, int]:
    return {"n": 1}


def _p50_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def _time(rounds: int, body: Callable[[], object]) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        body()
        samples.append(time.perf_counter() - start)
    return _p50_us(samples)


def main() -> None:
    assert become_subreaper(), "Linux only: prctl(PR_SET_CHILD_SUBREAPER)"
    defaults = default_limits({})
    guard = NodeGuard([None, Limits(memory_mb=256)], defaults)

    ours, theirs = socket.socketpair()
    theirs.setblocking(False)

    def message(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        return {
            "schema": LAUNCH_SCHEMA,
            "kind": kind,
            "runId": "run-0123456789abcdef",
            "generation": 2,
            "runnerEpoch": "runner-0123456789abcdef",
            "expectedRevision": 7,
            "messageId": "runner-0123456789abcdef-m1",
            "attemptId": "attempt-0123456789abcdef",
            "payload": payload,
        }

    started = message("node.started", {"nodePath": "a", "nodeKind": "compute", "visit": 1})
    finished = message("node.finished", {"nodePath": "a", "output": {"n": 1}, "route": "b"})

    def bare() -> object:
        for frame in (started, finished):
            ours.sendall(encode_runner_message(frame, sender="runner") + b"\n")
        theirs.recv(65536)
        return _node()

    def guarded(own: Limits | None) -> Callable[[], object]:
        def run() -> object:
            with guard.node(own):
                return _node()

        return run

    base = _time(ROUNDS, bare)
    default = _time(ROUNDS, guarded(None))
    own = _time(ROUNDS, guarded(Limits(memory_mb=256)))

    spawns, stops = [], []
    for _ in range(ESCAPE_ROUNDS):
        start = time.perf_counter()
        for _ in range(ESCAPEES):
            subprocess.Popen(["setsid", "sleep", "600"])
        spawns.append(time.perf_counter() - start)
        start = time.perf_counter()
        report = stop_descendants()
        stops.append(time.perf_counter() - start)
        assert report.killed == ESCAPEES and report.left == 0, report
    spawn, stop = _p50_us(spawns), _p50_us(stops)

    print(f"--- per node, p50 of {ROUNDS} (defaults {defaults}) ---")
    print(f"node.started + node.finished, sent      {base:8.1f} us")
    print(f"in the guard, default limits            {default:8.1f} us   ({default / base:.2f}x)")
    print(f"in the guard, its own memory limit      {own:8.1f} us   ({own / base:.2f}x)")
    print(f"--- a node that left {ESCAPEES} setsid escapees, p50 of {ESCAPE_ROUNDS} ---")
    print(f"starting them                           {spawn:8.1f} us")
    print(f"stopping and reaping them               {stop:8.1f} us   ({stop / spawn:.2f}x start)")


if __name__ == "__main__":
    main()
