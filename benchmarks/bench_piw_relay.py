"""Command-to-update delay through `piw serve` against the local socket (issue 27).

Target: a `LiveViews` over the relay URL sees a run's change at most 1.5× as late as
one over the Unix socket (p50). A real `server run` process (executing nothing) holds
one queued run; a relay process (`piw serve`) stands in front of it. Two `LiveViews`,
one per transport, each in a thread of its own, follow the run. The main thread pauses
and resumes it through its own socket client, one command at a time: a command's delay,
for one view, runs from just before the command is sent to the arrival of the first
update showing the new status.

Run: .venv/bin/python benchmarks/bench_piw_relay.py [--commands 400]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from _server import workflow_server

from pi_workflows import WorkflowClient
from pi_workflows.wire.live import LiveViews, ViewKey

WORKFLOW = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="still",
    start_at="echo",
    nodes={"echo": compute(lambda ctx: {"echo": ctx.input})},
)
"""
WAIT_S = 30.0


@contextlib.contextmanager
def relay(state: Path) -> Iterator[str]:
    """`piw serve` on a free loopback port; yields its URL."""
    piw = Path(sys.executable).parent / "piw"
    child = subprocess.Popen(
        [str(piw), "serve", "--bind", "127.0.0.1:0", "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if "relaying ws://" not in line:
            raise RuntimeError(f"the relay did not start: {line!r}")
        yield line.split()[3]
    finally:
        child.terminate()
        child.wait(30)


class Follower(threading.Thread):
    """Follows one run through one `LiveViews`; notes when each status first shows."""

    def __init__(self, live: LiveViews, run_id: str) -> None:
        super().__init__(daemon=True)
        self.live = live
        self.key = ViewKey.run(run_id)
        self.seen: list[tuple[float, str]] = []
        self.changed = threading.Condition()
        self.stop = threading.Event()
        self.failure: Exception | None = None

    def run(self) -> None:
        try:
            self.live.subscribe(self.key, timeout=WAIT_S)
            while not self.stop.is_set():
                update = self.live.next_update(timeout=0.2)
                if update is None or update.key != self.key:
                    continue
                arrived = time.perf_counter()
                with self.changed:
                    self.seen.append((arrived, update.view["display"]["status"]))
                    self.changed.notify_all()
        except Exception as exc:  # noqa: BLE001 - handed to the main thread, which raises it
            self.failure = exc
            with self.changed:
                self.changed.notify_all()
        finally:
            self.live.close()

    def arrival(self, status: str, since: float) -> float:
        """When `status` first showed after `since` (waits for it)."""
        deadline = time.monotonic() + WAIT_S
        with self.changed:
            while True:
                if self.failure is not None:
                    raise RuntimeError("a follower failed") from self.failure
                for arrived, shown in reversed(self.seen):
                    if arrived < since:
                        break
                    if shown == status:
                        return arrived
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no {status!r} update within {WAIT_S:.0f} s")
                self.changed.wait(remaining)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=400)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="piw-relay-", dir="/tmp") as folder:
        state = Path(folder) / "agent" / "workflows"
        project = Path(folder) / "project"
        (project / ".pi" / "workflows").mkdir(parents=True)
        (project / ".pi" / "workflows" / "still.workflow.py").write_text(WORKFLOW)
        with (
            workflow_server(state, ["--no-execute"]),
            relay(state) as url,
            WorkflowClient(state, autostart=False, timeout=WAIT_S) as commands,
        ):
            run_id = commands.call(
                "run.start", {"workflow": "still", "input": {}, "projectPath": str(project)}
            )["receipt"]["runId"]
            followers = {
                "socket": Follower(LiveViews(state, autostart=False, timeout=WAIT_S), run_id),
                "relay": Follower(LiveViews(state, url=url, timeout=WAIT_S), run_id),
            }
            for follower in followers.values():
                follower.start()
            for follower in followers.values():
                follower.arrival("queued", 0.0)  # subscribed, with the first snapshot
            delays: dict[str, list[float]] = {name: [] for name in followers}
            for number in range(arguments.commands):
                operation, status = (
                    ("run.pause", "paused") if number % 2 == 0 else ("run.resume", "queued")
                )
                sent = time.perf_counter()
                commands.call(operation, run_id=run_id)
                for name, follower in followers.items():
                    delays[name].append(follower.arrival(status, sent) - sent)
            for follower in followers.values():
                follower.stop.set()
                follower.join(WAIT_S)

    print(f"{arguments.commands} commands (pause/resume), one run, one view per transport")
    for name, values in delays.items():
        print(
            f"  {name:6s} p50 {statistics.median(values) * 1000:7.2f} ms"
            f"  p90 {percentile(values, 0.9) * 1000:7.2f} ms"
            f"  p99 {percentile(values, 0.99) * 1000:7.2f} ms"
        )
    extra = [r - s for r, s in zip(delays["relay"], delays["socket"], strict=True)]
    ratio = statistics.median(delays["relay"]) / statistics.median(delays["socket"])
    print(f"  relay - socket, per command: p50 {statistics.median(extra) * 1000:.2f} ms")
    print(f"  ratio relay/socket at p50: {ratio:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
