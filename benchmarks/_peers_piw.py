"""pi-workflows in bench_peers.py: a real `server run` and `WorkflowClient`s.

The 3-node workflow is a chain of compute nodes in a temp project. Latency waits for
each run through its subscription (`WorkflowClient.wait`, pushed on the settling
commit), as bench_runs.py does; the throughput clients wait on one `view.subscribe` runList client,
which the server pushes on each commit, so eight pollers do not load a small machine.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _peers_common import (
    RUN_TIMEOUT_S,
    WARMUP,
    figures,
    latency,
    live_used_bytes,
    percentile,
    throughput,
    used_bytes,
)
from _server import workflow_server

from pi_workflows import WorkflowClient
from pi_workflows.wire.framing import SocketFrameReader, encode_frame

SETTLED = ("completed", "failed", "timed_out", "cancelled", "waiting", "paused", "ambiguous")


def chain_source(name: str, nodes: int) -> str:
    """A workflow of `nodes` compute nodes in a chain, each adding one to its input."""
    lines = ["from pi_workflows import compute, define_workflow", ""]
    for k in range(nodes):
        value = "1" if k == 0 else f'ctx.outputs["n{k - 1}"]["i"] + 1'
        lines += [f"def n{k}(ctx):", f'    return {{"i": {value}}}', ""]
    nodes_map = ", ".join(f'"n{k}": compute(n{k})' for k in range(nodes))
    edges = ", ".join(f'{{"from": "n{k}", "to": "n{k + 1}"}}' for k in range(nodes - 1))
    lines += [
        "workflow = define_workflow(",
        f'    name="{name}", start_at="n0", nodes={{{nodes_map}}}, edges=[{edges}]',
        ")",
    ]
    return "\n".join(lines) + "\n"


def _project(folder: Path, chains: dict[str, int]) -> tuple[Path, Path]:
    state_dir = folder / "agent" / "workflows"
    project = folder / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    for name, nodes in chains.items():
        path = project / ".pi" / "workflows" / f"{name}.workflow.py"
        path.write_text(chain_source(name, nodes))
    return state_dir, project


class Client:
    """One client connection that starts runs of one workflow."""

    def __init__(self, state_dir: Path, project: Path, name: str) -> None:
        self.client = WorkflowClient(state_dir, autostart=False, client_id=f"bench-{name}")
        self.client.connect()
        self.project = str(project)

    def start(self, workflow: str) -> str:
        payload = {"workflow": workflow, "input": {}, "projectPath": self.project}
        return str(self.client.call("run.start", payload)["receipt"]["runId"])

    def status(self, run_id: str) -> str:
        return str(self.client.call("run.get", run_id=run_id)["receipt"]["display"]["status"])

    def run_waiting(self, workflow: str) -> str:
        """Start one run and wait until it settles (through its subscription, not by
        polling); raise unless completed."""
        run_id = self.start(workflow)
        view = self.client.wait(run_id, timeout=RUN_TIMEOUT_S)
        status = view["display"]["status"]
        if status != "completed":
            raise RuntimeError(f"a run ended {status}, not completed")
        return run_id

    def close(self) -> None:
        self.client.close()


class Watcher:
    """A client subscribed to `runList` that settles waiters as runs finish."""

    def __init__(self, state_dir: Path) -> None:
        self.client = WorkflowClient(state_dir, autostart=False, client_id="bench-watcher")
        self.client.connect()
        self.client.call("view.subscribe", {"kind": "runList"})
        self.client.set_read_timeout(0.5)
        self.settled: dict[str, str] = {}
        self.waiters: dict[str, threading.Event] = {}
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.closing.is_set():
            try:
                message = self.client.read_message()
            except TimeoutError:
                continue
            except OSError:
                return
            if message is None:
                return
            if message.get("type") != "event":
                continue
            with self.lock:
                for item in message["payload"].get("items", []):
                    status = item["display"]["status"]
                    if status in SETTLED and item["runId"] not in self.settled:
                        self.settled[item["runId"]] = status
                        waiter = self.waiters.pop(item["runId"], None)
                        if waiter is not None:
                            waiter.set()

    def wait(self, run_id: str) -> str:
        with self.lock:
            waiter = (
                None
                if run_id in self.settled
                else self.waiters.setdefault(run_id, threading.Event())
            )
        if waiter is not None and not waiter.wait(RUN_TIMEOUT_S):
            raise TimeoutError(f"a run did not settle in {RUN_TIMEOUT_S:.0f} s")
        return self.settled[run_id]

    def close(self) -> None:
        self.closing.set()
        self.thread.join(5)
        self.client.close()


def _throughput(state_dir: Path, project: Path, clients: int, seconds: float) -> Any:
    watcher = Watcher(state_dir)
    opened = [Client(state_dir, project, f"tp{index}") for index in range(clients)]

    def loop(client: Client) -> Callable[[], None]:
        def one() -> None:
            status = watcher.wait(client.start("three"))
            if status != "completed":
                raise RuntimeError(f"a run ended {status}, not completed")

        return one

    try:
        return throughput([loop(client) for client in opened], seconds)
    finally:
        for client in opened:
            client.close()
        watcher.close()


# --- idle run.get against a Unix-socket echo ----------------------------------------

ECHO_SERVER = r"""
import asyncio, sys
reply = open(sys.argv[2], "rb").read()
async def serve(reader, writer):
    try:
        while await reader.readline():
            writer.write(reply)
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


@contextlib.contextmanager
def _echo_server(folder: Path, reply: bytes) -> Iterator[Path]:
    """A plain asyncio echo in another process that answers each line with `reply`."""
    path, reply_file = folder / "echo.sock", folder / "echo-reply.json"
    reply_file.write_bytes(reply)
    child = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER, str(path), str(reply_file)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield path
    finally:
        child.kill()
        child.wait(10)


def _timed(call: Callable[[], object], samples: int) -> list[float]:
    for _ in range(min(20, samples)):
        call()
    times = []
    for _ in range(samples):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return times


def _idle_get(folder: Path, client: Client, run_id: str, samples: int) -> dict[str, Any]:
    """`run.get` of a completed run on an idle server, and an echo of the same frames.

    The echo's request is the frame `run.get` sends, its reply the frame `run.get`
    received (same bytes both ways), and its client parses the reply as ours does.
    """
    response = client.client.call("run.get", run_id=run_id)
    request = encode_frame(
        {
            "schema": response.get("schema", "pi-workflows.client.v1"),
            "type": "request",
            "clientId": "bench-get",
            "operation": "run.get",
            "idempotencyKey": "bench-get-" + "0" * 32,
            "payload": {},
            "runId": run_id,
        }
    )
    reply = encode_frame(response)
    get = _timed(lambda: client.client.call("run.get", run_id=run_id), samples)
    with _echo_server(folder, reply) as path:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        reader = SocketFrameReader(sock)

        def echo() -> object:
            sock.sendall(request)
            return reader.read_message()

        try:
            echoed = _timed(echo, samples)
        finally:
            sock.close()
    return {
        "get_p50": percentile(get, 0.5),
        "echo_p50": percentile(echoed, 0.5),
        "request_bytes": len(request),
        "reply_bytes": len(reply),
    }


# --- phases (each a child process of bench_peers.py) ---------------------------------


def main_phase(
    folder: Path, runs: int, clients: int, seconds: float, workers: int, get_samples: int
) -> dict[str, Any]:
    """Latency, throughput and CPU, idle `run.get`, then the database's used bytes."""
    state_dir, project = _project(folder, {"three": 3})
    with workflow_server(state_dir, ["--max-workers", str(workers)]):
        empty = live_used_bytes(state_dir / "state.sqlite")
        client = Client(state_dir, project, "latency")
        try:
            samples = latency(lambda: client.run_waiting("three"), runs)
            flow = _throughput(state_dir, project, clients, seconds)
            idle = _idle_get(folder, client, client.run_waiting("three"), get_samples)
        finally:
            client.close()
    size = used_bytes(
        state_dir / "state.sqlite", "SELECT COUNT(*) FROM runs WHERE status = 'completed'", empty
    )
    return figures(samples, flow, database=size, idle_get=idle, workers=workers)


def chain_phase(folder: Path, runs: int, long_nodes: int) -> dict[str, Any]:
    """p50 of the 3-node and the long chain, alternated so drift hits both alike."""
    state_dir, project = _project(folder, {"three": 3, "long": long_nodes})
    short: list[float] = []
    long: list[float] = []
    with workflow_server(state_dir):
        client = Client(state_dir, project, "chain")
        try:
            for index in range(runs):
                warmup = WARMUP if index == 0 else 0
                short += latency(lambda: client.run_waiting("three"), 1, warmup)
                long += latency(lambda: client.run_waiting("long"), 1, warmup)
        finally:
            client.close()
    return {"short": short, "long": long, "long_nodes": long_nodes}
