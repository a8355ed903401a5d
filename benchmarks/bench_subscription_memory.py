"""Server memory with one stalled run subscriber, against the same run without it.

Issue 13 target: over 60 s of updates, one subscriber that never reads costs the
server at most one snapshot of memory above the baseline. Two real `server run`
processes, one after the other, each execute the same workflow: one node loops on
itself every 10 ms with a 2 KiB output, so the run view grows to its trace budget (a
large snapshot) and changes on every commit. Both have one subscriber that reads
everything; the second also has one that subscribes and never reads again. The
server's RSS is sampled every 0.25 s; compared are the peaks of the last half.

Run: .venv/bin/python benchmarks/bench_subscription_memory.py [--seconds 60]
(the default is shorter; the figures say what ran)
"""

from __future__ import annotations

import argparse
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


def measure(root: Path, seconds: float, stalled: bool) -> tuple[float, int, int]:
    """Peak RSS (bytes) over the last half, the final snapshot's size, and revisions."""
    label = "stalled" if stalled else "baseline"
    state = root / label / "agent" / "workflows"
    project = root / label / "project"
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
        never_read = subscribe(socket_path, run_id) if stalled else None
        process = psutil.Process(server.pid)
        began = time.monotonic()
        first_revision = client.call("run.get", run_id=run_id)["revision"]
        peak = 0
        while (elapsed := time.monotonic() - began) < seconds:
            rss = process.memory_info().rss
            if elapsed >= seconds / 2:
                peak = max(peak, rss)
            time.sleep(0.25)
        view = client.call("run.get", run_id=run_id)["receipt"]
        assert view["display"]["status"] == "running", view["display"]
        client.call("run.cancel", run_id=run_id)
        stop.set()
        drainer.join(5)
        reading.close()
        if never_read is not None:
            never_read.close()
    return float(peak), len(dumps(view)), int(view["revision"]) - int(first_revision)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="piw-mem-") as folder:
        root = Path(folder)
        base, _, base_revisions = measure(root, args.seconds, stalled=False)
        stalled, snapshot, revisions = measure(root, args.seconds, stalled=True)
    above = stalled - base
    print(f"{args.seconds:.0f} s of updates per server ({base_revisions} and {revisions} commits)")
    print(f"baseline peak RSS (one reading subscriber)  {base / MB:7.1f} MB")
    print(f"with one stalled subscriber too             {stalled / MB:7.1f} MB")
    print(f"one snapshot (the final run view)           {snapshot / MB:7.2f} MB")
    print(
        f"above the baseline: {above / MB:+.2f} MB = {above / snapshot:+.2f} snapshots "
        f"(target <= 1 snapshot: {'MET' if above <= snapshot else 'NOT MET'}; RSS of two "
        "processes differs by about 1-2 MB run to run)"
    )
    print(
        f"uncoalesced, one event per commit would hold up to {revisions * snapshot / MB:.0f} MB"
        f" ({revisions} snapshots)"
    )


if __name__ == "__main__":
    main()
