"""Commit-to-event delay of run subscriptions: 100 subscribers against 1, in one run.

Issue 13 target: 100 subscribers on a run that commits a step every 10 ms see each
commit within 50 ms (p99). A real `server run` process executes a workflow whose one
node loops on itself, sleeping 10 ms per visit, so every visit commits its attempt.
The subscribers are raw sockets in this process, read by one selector thread that
only notes when each event arrived and the run's `updatedAt` it carries (a snapshot's
field, or a patch's `/updatedAt` replacement): the commit time of the run's newest
event. (The envelope's revision is the view's presentation revision, which also
counts changes that write no event, so it cannot be matched with `events.revision`.)
Each event's `recorded_at` is read from the database afterwards. A commit's delay,
for one subscriber, is the arrival of its first event showing that commit or a later
one (a coalesced commit counts until the newer one arrives). Baseline: the same run
with 1 subscriber.

Run: .venv/bin/python benchmarks/bench_subscription_latency.py [--subscribers 100]
     [--steps 300] [--step-ms 10]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import re
import selectors
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from _server import workflow_server

from pi_workflows import WorkflowClient
from pi_workflows.wire.framing import SocketFrameReader, encode_frame

LOOP_WORKFLOW = """
import time

from pi_workflows import compute, define_workflow

def step(ctx):
    time.sleep({step_s})
    return {{"visit": ctx.visit, "more": ctx.visit < {steps}}}

workflow = define_workflow(
    name="loop",
    start_at="step",
    max_steps={steps} + 10,
    nodes={{"step": compute(step), "end": compute(lambda ctx: {{"done": True}})}},
    edges=[{{"from": "step", "switch": {{"on": "$.more", "cases": {{"true": "step"}},
             "default": "end"}}}}],
)
"""
TERMINAL = frozenset({"completed", "failed", "timed_out", "cancelled"})


def server_process(state: Path) -> contextlib.AbstractContextManager[subprocess.Popen[str]]:
    return workflow_server(state)


def subscribe(socket_path: Path, run_id: str) -> socket.socket:
    """A raw connection subscribed to the run; returns once the subscription is accepted."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(socket_path))
    reader = SocketFrameReader(sock)
    assert reader.read_message() is not None  # hello
    request = {
        "schema": "pi-workflows.client.v1",
        "type": "request",
        "requestId": "r-1",
        "clientId": "bench",
        "operation": "view.subscribe",
        "idempotencyKey": f"bench-{id(sock)}",
        "runId": run_id,
        "payload": {"kind": "run"},
    }
    sock.sendall(encode_frame(request))
    answer = reader.read_message()
    assert answer is not None and answer["outcome"] == "accepted", answer
    leftover = reader.peek_buffered()
    assert leftover is None or leftover["type"] == "event"
    sock.setblocking(False)
    return sock


_UPDATED_AT = re.compile(
    rb'(?:"path":"/updatedAt","value":|^\{"kind":"runSnapshot","payload":\{.*?"updatedAt":)(\d+)'
)


def shown_commit(line: bytes) -> int | None:
    """The run's `updatedAt` (ms) an event line shows, if it changes it."""
    match = _UPDATED_AT.search(line)
    return int(match.group(1)) if match else None


class Arrivals(threading.Thread):
    """Reads every subscriber socket; notes (updatedAt, arrival time) of each event."""

    def __init__(self, sockets: list[socket.socket]) -> None:
        super().__init__(daemon=True)
        self.sockets = sockets
        self.seen: list[list[tuple[int, float]]] = [[] for _ in sockets]
        self.stop = threading.Event()

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        pending = [b""] * len(self.sockets)
        for index, sock in enumerate(self.sockets):
            selector.register(sock, selectors.EVENT_READ, index)
        while not self.stop.is_set():
            for key, _ in selector.select(0.1):
                index = key.data
                try:
                    data = key.fileobj.recv(1 << 20)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                now = time.time()
                lines = (pending[index] + data).split(b"\n")
                pending[index] = lines.pop()
                for line in lines:
                    shown = shown_commit(line) if b'"type":"event"' in line else None
                    if shown is not None:
                        self.seen[index].append((shown, now))


def commit_times(state: Path, run_id: str) -> dict[int, float]:
    """Each commit's `recorded_at` (ms) and the same time in seconds."""
    database = sqlite3.connect(f"file:{state / 'state.sqlite'}?mode=ro", uri=True)
    try:
        rows = database.execute(
            "SELECT DISTINCT recorded_at FROM events WHERE run_id = ?", (run_id,)
        ).fetchall()
    finally:
        database.close()
    return {int(recorded): recorded / 1000 for (recorded,) in rows}


def measure(state: Path, project: Path, subscribers: int) -> tuple[list[float], float]:
    """Delays (seconds) of every commit to every subscriber, and the median commit gap."""
    with WorkflowClient(state, autostart=False, timeout=60) as client:
        run_id = client.call("run.start", {"workflow": "loop", "projectPath": str(project)})[
            "receipt"
        ]["runId"]
        sockets = [subscribe(state / "host" / "host.sock", run_id) for _ in range(subscribers)]
        watching_since = time.time()
        arrivals = Arrivals(sockets)
        arrivals.start()
        try:
            while client.call("run.get", run_id=run_id)["receipt"]["display"]["status"] not in (
                TERMINAL
            ):
                time.sleep(0.2)
            final_view = client.call("run.get", run_id=run_id)["receipt"]
            assert final_view["display"]["status"] == "completed", final_view["display"]
            final = final_view["updatedAt"]
            deadline = time.monotonic() + 30
            while any(not s or s[-1][0] < final for s in arrivals.seen):
                assert time.monotonic() < deadline, "a subscriber never saw the final revision"
                time.sleep(0.05)
        finally:
            arrivals.stop.set()
            arrivals.join(5)
            for sock in sockets:
                sock.close()
    commits = {
        recorded: at
        for recorded, at in commit_times(state, run_id).items()
        if at > watching_since + 0.05  # every subscriber is installed by then
    }
    delays: list[float] = []
    for seen in arrivals.seen:
        for recorded, committed in commits.items():
            arrived = next(at for shown, at in seen if shown >= recorded)
            delays.append(max(0.0, arrived - committed))
    times = sorted(commits.values())
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    return delays, gaps[len(gaps) // 2] if gaps else 0.0


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-ms", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="piw-lat-") as root:
        state = Path(root) / "agent" / "workflows"
        project = Path(root) / "project"
        (project / ".pi" / "workflows").mkdir(parents=True)
        (project / ".pi" / "workflows" / "loop.workflow.py").write_text(
            LOOP_WORKFLOW.format(step_s=args.step_ms / 1000, steps=args.steps)
        )
        with server_process(state):
            results = {}
            for count in (1, args.subscribers):
                delays, gap = measure(state, project, count)
                results[count] = delays
                print(
                    f"{count:>4} subscriber(s): {len(delays)} commit deliveries, commit every "
                    f"{gap * 1e3:.1f} ms (median); delay p50 {percentile(delays, 0.5) * 1e3:.1f}"
                    f" ms, p99 {percentile(delays, 0.99) * 1e3:.1f} ms"
                )
    p99 = percentile(results[args.subscribers], 0.99)
    base = percentile(results[1], 0.99)
    print(
        f"p99 {args.subscribers} subscribers / 1 subscriber: {p99 / max(base, 1e-6):.2f}x; "
        f"p99 {p99 * 1e3:.1f} ms against the 50 ms target: {p99 / 0.05:.2f}x "
        f"({'MET' if p99 <= 0.05 else 'NOT MET'})"
    )


if __name__ == "__main__":
    main()
