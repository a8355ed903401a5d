"""A well-behaved client's latency while hostile clients hit the server, against quiet.

Phases, each against a baseline measured in the same run (issue 11):
  1. Server under a 256-descriptor limit (`setrlimit` in the child): `server.status` p50/p99
     on a kept connection and on a fresh connection each call, quiet; then during a
     20,000-frame fuzz (each malformed frame on its own connection, from another
     process); then while another process holds 1,000 idle connections. Also the log
     bytes and `connection.rejected` lines each phase added.
  2. Fan-out: command latency (`run.start` from a burst client in another process, and
     `server.status` from this one) during a burst of runs that execute, with no
     subscriber, then with 200 subscribers that never read.
Target (issue 11): under the hold, p99 <= 10x quiet, and <= 1 MiB of logs.
Run: .venv/bin/python benchmarks/bench_hostile_clients.py
"""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _server import workflow_server as start_server

from pi_workflows import WorkflowClient

SAMPLES = 1000
FUZZ_FRAMES = 20_000
FUZZ_PROCESSES = 2
HELD_CONNECTIONS = 1_000
SERVER_NOFILE = 256
STALLED_SUBSCRIBERS = 200
BURST_RUNS = 150

BENCH_WORKFLOW = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="bench", start_at="one", nodes={"one": compute(lambda ctx: {"ok": True})}
)
"""

# Each malformed frame on its own connection, as the adversarial pass sent them.
FUZZER = r"""
import random, socket, sys, time
from pi_workflows.wire.framing import SocketFrameReader
path, count, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
bad = [b"{not json}\n", b"[1,2,3]\n", b'{"type":"request"}\n', b'{"b":1,"a":2}\n',
       b"\xff\xfe\n", b'{"schema":"pi-workflows.client.v1","type":"hello"}\n']
for index in range(count):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    while True:
        try:
            sock.connect(path)
            break
        except BlockingIOError:
            time.sleep(0.001)
    try:
        reader = SocketFrameReader(sock)
        reader.read_message()
        sock.sendall(rng.choice(bad) + bytes([rng.randrange(32, 127)]) * rng.randrange(0, 40) + b"\n")
        while reader.read_message() is not None:
            pass
    except Exception:
        pass
    finally:
        sock.close()
print("done", flush=True)
"""

# Opens connections that never send, reports, and holds them until stdin closes.
HOLDER = r"""
import resource, socket, sys, time
from pi_workflows.wire.framing import encode_frame
path, count, subscribe = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "subscribe"
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 256), hard))
held = []
for index in range(count):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if subscribe:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    while True:
        try:
            sock.connect(path)
            break
        except BlockingIOError:
            time.sleep(0.001)
    if subscribe:
        sock.sendall(encode_frame({"schema": "pi-workflows.client.v1", "type": "request",
            "requestId": f"r{index}", "clientId": "stalled", "operation": "view.subscribe",
            "idempotencyKey": f"k{index}", "payload": {"kind": "runList"}}))
    held.append(sock)
print("held", flush=True)
sys.stdin.read()
"""

# Submits a burst of runs and prints each run.start latency (seconds) as JSON.
BURSTER = r"""
import json, sys, time
from pathlib import Path
from pi_workflows import WorkflowClient
state_dir, project, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
client = WorkflowClient(state_dir, autostart=False, client_id="burst")
client.connect()
samples = []
for index in range(count):
    started = time.perf_counter()
    client.call("run.start", {"workflow": "bench", "input": {"i": index}, "projectPath": project})
    samples.append(time.perf_counter() - started)
print(json.dumps(samples), flush=True)
"""


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure(call: Callable[[], object], count: int = SAMPLES) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


def measure_while(calls: list[Callable[[], object]], busy: Callable[[], bool]) -> list[list[float]]:
    """Take turns with `calls` while `busy()` holds (at least 20 rounds); one list each."""
    samples: list[list[float]] = [[] for _ in calls]
    while busy() or len(samples[0]) < 20:
        for call, taken in zip(calls, samples, strict=True):
            started = time.perf_counter()
            call()
            taken.append(time.perf_counter() - started)
    return samples


def counting(rounds: int) -> Callable[[], bool]:
    """True for the first `rounds` calls: `measure_while` for a fixed count."""
    left = [rounds]

    def busy() -> bool:
        left[0] -= 1
        return left[0] > 0

    return busy


def _limit(soft: int, hard: int) -> Callable[[], None]:
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def workflow_server(
    state_dir: Path, *, execute: bool, nofile: int | None = None
) -> contextlib.AbstractContextManager[subprocess.Popen[str]]:
    args = ["--execute" if execute else "--no-execute"]
    return start_server(state_dir, args, preexec_fn=_limit(nofile, nofile) if nofile else None)


def helper(script: str, *args: str, stdin: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE if stdin else None,
        text=True,
    )


def log_state(state_dir: Path) -> tuple[int, int]:
    """(bytes of server.log*, server.out*), `connection.rejected` lines) so far."""
    logs = state_dir / "logs"
    size = sum(p.stat().st_size for p in logs.glob("server.*") if p.is_file())
    lines = 0
    for path in logs.glob("server.log*"):
        lines += path.read_text().count('"connection.rejected"')
    return size, lines


def fresh_call(state_dir: Path) -> Callable[[], object]:
    def call() -> object:
        with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
            return client.call("server.status")

    return call


def line(label: str, samples: list[float], base: list[float]) -> str:
    p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
    b50, b99 = percentile(base, 0.5), percentile(base, 0.99)
    return (
        f"{label:<40} p50 {p50 * 1e3:8.2f} ms ({p50 / b50:5.1f}x)   "
        f"p99 {p99 * 1e3:8.2f} ms ({p99 / b99:5.1f}x)   n={len(samples)}"
    )


def connection_phases(folder: Path) -> None:
    state_dir = folder / "conn" / "agent" / "workflows"
    with workflow_server(state_dir, execute=False, nofile=SERVER_NOFILE):
        socket_path = str(state_dir / "host" / "host.sock")
        client = WorkflowClient(state_dir, autostart=False, timeout=30)
        client.connect()
        kept = lambda: client.call("server.status")  # noqa: E731
        fresh = fresh_call(state_dir)
        measure(kept, 20)
        quiet_kept, quiet_fresh = measure(kept), measure(fresh)

        before = log_state(state_dir)
        per = FUZZ_FRAMES // FUZZ_PROCESSES
        fuzzers = [
            helper(FUZZER, socket_path, str(per), str(seed)) for seed in range(FUZZ_PROCESSES)
        ]
        started = time.perf_counter()
        running = lambda: any(f.poll() is None for f in fuzzers)  # noqa: E731
        fuzz_kept, fuzz_fresh = measure_while([kept, fresh], running)
        for fuzzer in fuzzers:
            fuzzer.wait(600)
        fuzz_s = time.perf_counter() - started

        holder = helper(HOLDER, socket_path, str(HELD_CONNECTIONS), "idle", stdin=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        hold_kept, hold_fresh = measure_while([kept, fresh], counting(SAMPLES))
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(60)
        client.close()
    after = log_state(state_dir)  # stopped: the last rejection summary is flushed

    print(f"--- connections: server under a {SERVER_NOFILE}-descriptor limit ---")
    print(line("quiet, kept connection", quiet_kept, quiet_kept))
    print(line("quiet, fresh connection", quiet_fresh, quiet_fresh))
    print(line(f"{FUZZ_FRAMES} malformed frames, kept", fuzz_kept, quiet_kept))
    print(line(f"{FUZZ_FRAMES} malformed frames, fresh", fuzz_fresh, quiet_fresh))
    print(line(f"{HELD_CONNECTIONS} idle connections held, kept", hold_kept, quiet_kept))
    print(line(f"{HELD_CONNECTIONS} idle connections held, fresh", hold_fresh, quiet_fresh))
    print(f"fuzz: {fuzz_s:.1f} s, {FUZZ_FRAMES / fuzz_s:.0f} frames/s")
    print(
        f"logs during fuzz and hold, to the stop: +{(after[0] - before[0]) / 1024:.1f} KiB, "
        f"{after[1] - before[1]} connection.rejected lines"
    )


def fanout_phase(folder: Path, name: str, subscribers: int) -> tuple[list[float], list[float]]:
    state_dir = folder / name / "agent" / "workflows"
    project = folder / "project"
    with workflow_server(state_dir, execute=True):
        socket_path = str(state_dir / "host" / "host.sock")
        holder = None
        if subscribers:
            holder = helper(HOLDER, socket_path, str(subscribers), "subscribe", stdin=True)
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        client = WorkflowClient(state_dir, autostart=False, timeout=60)
        client.connect()
        measure(lambda: client.call("server.status"), 20)
        burster = helper(BURSTER, str(state_dir), str(project), str(BURST_RUNS))
        (status,) = measure_while(
            [lambda: client.call("server.status")], lambda: burster.poll() is None
        )
        assert burster.stdout is not None
        starts = [float(x) for x in json.loads(burster.stdout.read())]
        burster.wait(60)
        client.close()
        if holder is not None:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(60)
    return starts, status


def fanout_phases(folder: Path) -> None:
    project = folder / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "bench.workflow.py").write_text(BENCH_WORKFLOW)
    none_starts, none_status = fanout_phase(folder, "fan0", 0)
    many_starts, many_status = fanout_phase(folder, "fan200", STALLED_SUBSCRIBERS)
    print(f"--- fan-out: a burst of {BURST_RUNS} executing runs ---")
    print(line("run.start, no subscriber", none_starts, none_starts))
    print(line(f"run.start, {STALLED_SUBSCRIBERS} stalled subscribers", many_starts, none_starts))
    print(line("server.status, no subscriber", none_status, none_status))
    print(
        line(f"server.status, {STALLED_SUBSCRIBERS} stalled subscribers", many_status, none_status)
    )


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="piw-bench-", dir="/tmp"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < HELD_CONNECTIONS + 256 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (HELD_CONNECTIONS + 256, hard))
    try:
        connection_phases(folder)
        fanout_phases(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
