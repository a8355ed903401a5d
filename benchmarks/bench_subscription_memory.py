"""Server memory with one stalled run subscriber, against the same server without it.

Issue 13 target: over 60 s of updates, one subscriber that never reads costs the
server at most one snapshot of memory above the baseline. One real `server run`
process executes a workflow whose one node loops on itself every 10 ms with a 2 KiB
output, so the run view grows to its trace budget (a large snapshot) and changes on
every commit. One subscriber reads everything throughout. Then phases alternate:
without a stalled subscriber (the baseline), with one that subscribes and never reads
again (then it is closed), ..., ending without. The server's RSS grows with its work
even without a stalled subscriber (each view read leaves a few bytes behind, see the
note printed), smoothly, so a stalled phase's cost is its growth less the mean growth
of the baseline phases either side; summed over the stalled phases. Target: at most
one snapshot.

Run: .venv/bin/python benchmarks/bench_subscription_memory.py [--seconds 60] [--cycles 3]
(`--seconds` is the stalled time in all; the default is shorter; the figures say what ran)
"""

from __future__ import annotations

import argparse
import itertools
import socket
import tempfile
import threading
import time
from pathlib import Path

import psutil
from bench_subscription_latency import server_process, subscribe

from pi_workflows import WorkflowClient
from pi_workflows.wire.canonical import dumps

MB = 1024 * 1024
STEP_S = 0.01
LOOP_WORKFLOW = """
import time

from pi_workflows import compute, define_workflow

def step(ctx):
    time.sleep({step_s})
    return {{"visit": ctx.visit, "more": True, "pad": "x" * 2048}}

workflow = define_workflow(
    name="loop",
    start_at="step",
    max_steps=1_000_000,
    nodes={{"step": compute(step), "end": compute(lambda ctx: {{}})}},
    edges=[{{"from": "step", "switch": {{"on": "$.more", "cases": {{"true": "step"}},
             "default": "end"}}}}],
)
"""


def _drain(sock: socket.socket, stop: threading.Event) -> None:
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            if not sock.recv(1 << 20):
                return
        except TimeoutError:
            continue
        except OSError:
            return


class Sampler:
    """The server's RSS and the run's revision at the end of each phase (median of 5)."""

    def __init__(self, pid: int, client: WorkflowClient, run_id: str) -> None:
        self.process = psutil.Process(pid)
        self.client = client
        self.run_id = run_id

    def sample(self) -> tuple[float, int]:
        readings = []
        for _ in range(5):
            readings.append(self.process.memory_info().rss)
            time.sleep(0.05)
        revision = int(self.client.call("run.get", run_id=self.run_id)["revision"])
        return float(sorted(readings)[2]), revision


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0, help="stalled time in all")
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args()
    phase = args.seconds / args.cycles
    with tempfile.TemporaryDirectory(prefix="piw-mem-") as folder:
        state = Path(folder) / "agent" / "workflows"
        project = Path(folder) / "project"
        (project / ".pi" / "workflows").mkdir(parents=True)
        (project / ".pi" / "workflows" / "loop.workflow.py").write_text(
            LOOP_WORKFLOW.format(step_s=STEP_S)
        )
        with server_process(state) as server, WorkflowClient(state, autostart=False) as client:
            run_id = client.call("run.start", {"workflow": "loop", "projectPath": str(project)})[
                "receipt"
            ]["runId"]
            socket_path = state / "host" / "host.sock"
            reading = subscribe(socket_path, run_id)
            stop = threading.Event()
            drainer = threading.Thread(target=_drain, args=(reading, stop), daemon=True)
            drainer.start()
            sampler = Sampler(server.pid, client, run_id)
            time.sleep(10)  # warm up: the trace reaches its budget, the caches fill
            points = [sampler.sample()]
            for _ in range(args.cycles):
                time.sleep(phase)  # off: the reading subscriber only
                points.append(sampler.sample())
                never_read = subscribe(socket_path, run_id)
                time.sleep(phase)  # on: plus one that never reads
                points.append(sampler.sample())
                never_read.close()
            time.sleep(phase)
            points.append(sampler.sample())
            view = client.call("run.get", run_id=run_id)["receipt"]
            assert view["display"]["status"] == "running", view["display"]
            client.call("run.cancel", run_id=run_id)
            stop.set()
            drainer.join(5)
            reading.close()
    snapshot = len(dumps(view))
    growth = [b[0] - a[0] for a, b in itertools.pairwise(points)]  # off, on, off, ..., off
    commits = points[-1][1] - points[0][1]
    above = 0.0
    for index in range(1, len(growth), 2):
        above += growth[index] - (growth[index - 1] + growth[index + 1]) / 2
    print(
        f"{args.cycles} cycles of {phase:.0f} s without and {phase:.0f} s with a stalled"
        f" subscriber ({args.seconds:.0f} s stalled in all, {commits} commits)"
    )
    print("RSS growth per phase (MB): " + ", ".join(f"{g / MB:+.2f}" for g in growth))
    print(f"server RSS from {points[0][0] / MB:.1f} to {points[-1][0] / MB:.1f} MB")
    print(f"one snapshot (the final run view): {snapshot / MB:.2f} MB")
    print(
        f"stalled phases above the baseline between them: {above / MB:+.2f} MB = "
        f"{above / snapshot:+.2f} snapshots"
        f" (target <= 1: {'MET' if above <= snapshot else 'NOT MET'})"
    )
    print(f"uncoalesced, one event per commit would hold {commits / 2 * snapshot / MB:.0f} MB")
    print(
        "note: the baseline's growth is mostly sqlite3 Blob weakrefs that CPython 3.11 never"
        " drops (python/cpython#144424): every blob read through blobopen leaves one behind"
    )


if __name__ == "__main__":
    main()
