"""Cheap observation (issue 30 item 4): cached run views, and waiting by subscription.

Two real servers (`server run`, 4 workers each) side by side in one run, on the same
`three` workflow (compute nodes a -> b -> c): one as shipped, one with the run view
cache off (`PI_WORKFLOWS_RUN_VIEW_CACHE=0`, the baseline; every `run.get` builds its
view). Rounds alternate between them so drift hits both alike.

1. Idle `run.get` of a completed run: latency per call (median of round medians) and
   the server process's CPU per call (user + system from /proc, a mean), cache on and off;
   and a Unix-socket echo of a request-sized line in a child process (the floor).
2. `run.start` -> completed with one client: waiting by subscription
   (`WorkflowClient.wait`, cache on) against polling `run.get` every POLL_S (cache on,
   and cache off: how `bench_runs.py` waited before). p50 and the server process's CPU
   per run, a mean (the runners are the zygote's children and not counted: they do
   the same work in every mode). A fourth mode starts the run and looks only after
   UNOBSERVED_S: its CPU is the run's own, so each mode's excess is what observing
   cost the server.

Run: .venv/bin/python benchmarks/bench_observation.py [--calls 500] [--rounds 5] [--runs 60]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from _server import workflow_server
from bench_runs import THREE_WORKFLOW

from pi_workflows import WorkflowClient

POLL_S = 0.002  # as bench_runs.py polled: not quantised to any tick
RUN_TIMEOUT_S = 30.0
WARMUP = 3
UNOBSERVED_S = 0.15
"""How long the unobserved mode lets a run go before it looks (a run takes ~50 ms)."""
ECHO = """
import os, socket, sys
path = sys.argv[1]
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(1)
print("ready", flush=True)
conn, _ = server.accept()
buffer = b""
while True:
    data = conn.recv(65536)
    if not data:
        break
    buffer += data
    while b"\\n" in buffer:
        line, buffer = buffer.split(b"\\n", 1)
        conn.sendall(line + b"\\n")
"""
REQUEST_LINE = b'{"schema":"pi-workflows.client.v1","type":"request","operation":"run.get"' + (
    b',"pad":"' + b"x" * 160 + b'"}\n'
)


@dataclass
class Server:
    """One running server and a client of its own."""

    label: str
    process: psutil.Process
    client: WorkflowClient
    project: str
    get_ms: list[float] = field(default_factory=list)
    get_cpu_us: list[float] = field(default_factory=list)

    def cpu_s(self) -> float:
        times = self.process.cpu_times()
        return float(times.user + times.system)

    def start(self) -> str:
        payload = {"workflow": "three", "input": {}, "projectPath": self.project}
        return str(self.client.call("run.start", payload)["receipt"]["runId"])

    def poll(self, run_id: str) -> str:
        deadline = time.perf_counter() + RUN_TIMEOUT_S
        while True:
            view = self.client.call("run.get", run_id=run_id)["receipt"]
            status = str(view["display"]["status"])
            if status in ("completed", "failed", "timed_out", "cancelled"):
                return status
            if time.perf_counter() > deadline:
                raise TimeoutError(f"run still {status} after {RUN_TIMEOUT_S:.0f} s")
            time.sleep(POLL_S)

    def subscribe(self, run_id: str) -> str:
        return str(self.client.wait(run_id, timeout=RUN_TIMEOUT_S)["display"]["status"])

    def unobserved(self, run_id: str) -> str:
        """Nobody watches: a pause well past the run's end (the status is read after)."""
        time.sleep(UNOBSERVED_S)
        return "unobserved"


@contextlib.contextmanager
def servers(folder: Path) -> Iterator[tuple[Server, Server]]:
    project = folder / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "three.workflow.py").write_text(THREE_WORKFLOW)
    with contextlib.ExitStack() as stack:
        started = []
        for label, env in (("cache on", {}), ("cache off", {"PI_WORKFLOWS_RUN_VIEW_CACHE": "0"})):
            state = folder / label.replace(" ", "-") / "workflows"
            child = stack.enter_context(workflow_server(state, ["--max-workers", "4"], env=env))
            client = WorkflowClient(state, autostart=False, client_id=f"bench-{label[-3:]}")
            client.connect()
            stack.callback(client.close)
            started.append(Server(label, psutil.Process(child.pid), client, str(project)))
        yield started[0], started[1]


def idle_gets(server: Server, run_id: str, calls: int) -> None:
    """One round of `calls` run.get of a settled run: median latency, CPU per call."""
    samples = []
    cpu = server.cpu_s()
    for _ in range(calls):
        began = time.perf_counter()
        server.client.call("run.get", run_id=run_id)
        samples.append(time.perf_counter() - began)
    server.get_cpu_us.append((server.cpu_s() - cpu) / calls * 1e6)
    server.get_ms.append(statistics.median(samples) * 1e3)


def echo_ms(folder: Path, calls: int, rounds: int) -> float:
    """Median round trip of a request-sized line through a Unix-socket echo child."""
    path = str(folder / "echo.sock")
    child = subprocess.Popen([sys.executable, "-c", ECHO, path], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        reader = sock.makefile("rb")
        medians = []
        for _ in range(rounds):
            samples = []
            for _ in range(calls):
                began = time.perf_counter()
                sock.sendall(REQUEST_LINE)
                reader.readline()
                samples.append(time.perf_counter() - began)
            medians.append(statistics.median(samples) * 1e3)
        sock.close()
        return statistics.median(medians)
    finally:
        child.kill()
        child.wait(10)


@dataclass
class Mode:
    """One way of waiting for a run: its latencies and the server's CPU per run."""

    label: str
    server: Server
    how: str  # a `Server` method: "subscribe", "poll" or "unobserved"
    latency_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    client_cpu_ms: list[float] = field(default_factory=list)
    skipped: int = 0
    """Unobserved runs not settled by the end of the pause: not counted."""

    def one(self, record: bool = True) -> None:
        cpu, mine = self.server.cpu_s(), time.process_time()
        began = time.perf_counter()
        run_id = self.server.start()
        wait = getattr(self.server, self.how)
        status = wait(run_id)
        ended = time.perf_counter()
        spent = self.server.cpu_s() - cpu
        if status == "unobserved":  # looked at only now, after the CPU was read
            status = self.server.client.call("run.get", run_id=run_id)["receipt"]["display"][
                "status"
            ]
            if status not in ("completed", "failed", "timed_out", "cancelled"):
                # Slower than the pause (a loaded machine): its CPU is not all counted.
                status = self.server.subscribe(run_id)
                self.skipped += 1
                record = False
        if status != "completed":
            raise RuntimeError(f"a run ended {status}, not completed")
        if record:
            self.latency_ms.append((ended - began) * 1e3)
            self.cpu_ms.append(spent * 1e3)
            self.client_cpu_ms.append((time.process_time() - mine) * 1e3)


def p50(values: list[float]) -> float:
    return statistics.median(values)


def mean(values: list[float]) -> float:
    """CPU figures: /proc counts in clock ticks (10 ms), so only a sum over many
    runs (a mean) resolves a few milliseconds per run."""
    return statistics.fmean(values)


def ratio_line(name: str, value: float, target: str) -> str:
    return f"{name:<44} {value:6.2f}x   target {target}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="run.get calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument("--runs", type=int, default=60, help="runs per waiting mode")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="piw-obs-"))
    try:
        with servers(folder) as (cached, uncached):
            modes = [
                Mode("nobody watches (cache on)", cached, "unobserved"),
                Mode("subscription (cache on)", cached, "subscribe"),
                Mode("poll run.get (cache on)", cached, "poll"),
                Mode("poll run.get (cache off)", uncached, "poll"),
            ]
            for mode in modes:
                for _ in range(WARMUP):
                    mode.one(record=False)
            for _ in range(args.runs):  # interleaved: drift hits every mode alike
                for mode in modes:
                    mode.one()
            settled = {server.label: server.start() for server in (cached, uncached)}
            for server in (cached, uncached):
                server.poll(settled[server.label])
            for _ in range(args.rounds):
                for server in (cached, uncached):
                    idle_gets(server, settled[server.label], args.calls)
        echo = echo_ms(folder, args.calls, args.rounds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    print(f"--- idle run.get of a completed run ({args.rounds} x {args.calls} calls) ---")
    for server in (cached, uncached):
        print(
            f"{server.label:<10} median {p50(server.get_ms):.3f} ms/call, "
            f"server CPU {mean(server.get_cpu_us):.0f} us/call"
        )
    print(f"unix-socket echo (a request-sized line) median {echo:.3f} ms/call")
    print(f"--- run.start -> completed, 3 compute nodes ({args.runs} runs per mode) ---")
    unobserved, subscribed, polled, before = modes
    base = mean(unobserved.cpu_ms)
    for mode in modes:
        latency = "" if mode is unobserved else f"p50 {p50(mode.latency_ms):6.2f} ms   "
        print(
            f"{mode.label:<26} {latency:<18}server CPU {mean(mode.cpu_ms):6.2f} ms/run "
            f"(observing: {mean(mode.cpu_ms) - base:5.2f})   client CPU "
            f"{mean(mode.client_cpu_ms):6.2f} ms/run"
        )
    if unobserved.skipped:
        print(f"  ({unobserved.skipped} unobserved runs outlasted {UNOBSERVED_S} s: not counted)")
    print("--- ratios ---")
    print(
        ratio_line(
            "cached / uncached run.get server CPU:",
            mean(cached.get_cpu_us) / mean(uncached.get_cpu_us),
            "< 1 (lower is better)",
        )
    )
    print(
        ratio_line(
            "cached / uncached run.get latency:",
            p50(cached.get_ms) / p50(uncached.get_ms),
            "< 1 (lower is better)",
        )
    )
    print(
        ratio_line("idle run.get / unix-socket echo:", p50(cached.get_ms) / echo, "<= 5 (issue 30)")
    )
    print(
        ratio_line(
            "subscription / polling p50:",
            p50(subscribed.latency_ms) / p50(before.latency_ms),
            "<= 1 (against polling with the cache off)",
        )
    )
    print(
        ratio_line(
            "subscription / polling server CPU per run:",
            mean(subscribed.cpu_ms) / mean(before.cpu_ms),
            "< 1 (against polling with the cache off)",
        )
    )
    print(
        ratio_line(
            "subscription / polling observing CPU per run:",
            (mean(subscribed.cpu_ms) - base) / max(mean(before.cpu_ms) - base, 1e-9),
            "< 1 (server CPU above nobody watching)",
        )
    )
    print(
        ratio_line(
            "cached / uncached polling server CPU per run:",
            mean(polled.cpu_ms) / mean(before.cpu_ms),
            "< 1 (lower is better)",
        )
    )


if __name__ == "__main__":
    main()
