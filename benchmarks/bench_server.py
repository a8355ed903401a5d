"""Command round trips over the server socket against a raw Unix-socket echo, in one run.

Measures p50/p99 of `server.status` (a read) and `run.pause` (a committed command with
its receipt) through `WorkflowClient`, and of a raw echo of a same-sized frame through
a plain asyncio echo server in another process; idle, then with 4 busy clients.
Target (issue 4): p50 <= 10x and p99 <= 50x the echo.
Run: .venv/bin/python benchmarks/bench_server.py
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from _server import workflow_server as start_server

from pi_workflows import WorkflowClient
from pi_workflows.wire.framing import SocketFrameReader, encode_frame

SAMPLES = 400
BUSY_CLIENTS = 4

ECHO_SERVER = r"""
import asyncio, os, sys
async def serve(reader, writer):
    try:
        while line := await reader.readline():
            writer.write(line)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
async def main():
    server = await asyncio.start_unix_server(serve, path=sys.argv[1])
    print("ready", flush=True)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""


BUSY_CLIENT = r"""
import socket, sys
from pathlib import Path
from pi_workflows import WorkflowClient
from pi_workflows.wire.framing import SocketFrameReader, encode_frame
kind, path = sys.argv[1], Path(sys.argv[2])
if kind == "server":
    client = WorkflowClient(path, autostart=False)
    while True:
        client.call("server.status")
else:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    reader = SocketFrameReader(sock)
    frame = encode_frame({"x": "y" * 200})
    while True:
        sock.sendall(frame)
        reader.read_message()
"""


BENCH_WORKFLOW = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="bench", start_at="one", nodes={"one": compute(lambda ctx: {})}
)
"""


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure(call: Callable[[], object], count: int = SAMPLES) -> list[float]:
    for _ in range(20):
        call()
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


@contextlib.contextmanager
def echo_server(folder: Path) -> Iterator[Path]:
    path = folder / "echo.sock"
    child = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield path
    finally:
        child.kill()
        child.wait(10)


def workflow_server(state_dir: Path) -> contextlib.AbstractContextManager[object]:
    # --no-execute: the benchmark measures the protocol, not runners
    return start_server(state_dir, ["--no-execute"])


def echo_caller(path: Path, frame: bytes) -> Callable[[], object]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    reader = SocketFrameReader(sock)

    def call() -> object:
        sock.sendall(frame)
        return reader.read_message()

    return call


def report(label: str, samples: list[float], echo: list[float]) -> None:
    p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
    e50, e99 = percentile(echo, 0.5), percentile(echo, 0.99)
    print(
        f"{label:<34} p50 {p50 * 1e6:8.0f} us ({p50 / e50:5.1f}x echo)   "
        f"p99 {p99 * 1e6:8.0f} us ({p99 / e99:5.1f}x echo)"
    )


def run_phase(
    name: str, state_dir: Path, echo_path: Path, project: Path, busy_clients: int
) -> None:
    client = WorkflowClient(state_dir, autostart=False, client_id=f"bench-{name}")
    client.connect()
    frame = encode_frame(
        {
            "schema": "pi-workflows.client.v1",
            "type": "request",
            "requestId": "r" * 40,
            "clientId": "bench",
            "operation": "server.status",
            "idempotencyKey": "k" * 40,
            "payload": {},
        }
    )
    run_ids = [
        client.call("run.start", {"workflow": "bench", "projectPath": str(project)})["receipt"][
            "runId"
        ]
        for _ in range(SAMPLES + 20)
    ]
    # Busy clients are separate processes, so they load the servers, not this process.
    helpers = [
        subprocess.Popen([sys.executable, "-c", BUSY_CLIENT, kind, str(path)])
        for kind, path in [("server", state_dir), ("echo", echo_path)] * busy_clients
    ]
    try:
        echo = measure(echo_caller(echo_path, frame))
        status = measure(lambda: client.call("server.status"))
        pending = iter(run_ids)
        pause = measure(lambda: client.call("run.pause", run_id=next(pending)))
    finally:
        for helper in helpers:
            helper.kill()
            helper.wait(10)
    print(f"--- {name} ({busy_clients} busy clients on each socket) ---")
    report("raw echo", echo, echo)
    report("server.status", status, echo)
    report("run.pause (commit + receipt)", pause, echo)
    print(f"echo p50 {statistics.median(echo) * 1e6:.0f} us")
    client.close()


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="piw-bench-", dir="/tmp"))
    try:
        state_dir = folder / "agent" / "workflows"
        project = folder / "project"
        (project / ".pi" / "workflows").mkdir(parents=True)
        (project / ".pi" / "workflows" / "bench.workflow.py").write_text(BENCH_WORKFLOW)
        with echo_server(folder) as echo_path, workflow_server(state_dir):
            run_phase("idle", state_dir, echo_path, project, 0)
            run_phase("busy", state_dir, echo_path, project, BUSY_CLIENTS)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
