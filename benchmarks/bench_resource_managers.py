"""Resource-manager passes against one-node workflow runs, on the same real server (issue 28).

Each section starts its own `server run --max-workers WORKERS` process (benchmarks/_server.py)
with a project holding a one-compute-node workflow `one` and a no-op manager `noop` (its
`reconcile` returns `ctx.settled(...)` with `Ready=True`); the clients are `WorkflowClient`s
in this process. Both sides are waited for the same way, so each ratio compares the server:

1. `latency`: one no-op pass (`resourceManager.reconcile` -> claim -> resource runner ->
   settled commit, seen with `resourceManager.get` polled every POLL_S) against one run
   (`run.start` -> completed, `run.get` polled every POLL_S); the samples alternate.
   Target <= 1.0x.
2. `throughput`: IN_FLIGHT client threads, each asking for a pass of its own resource (or
   starting a run) again as soon as its last one settled, for SECONDS each; one poller
   thread per side reads what is still pending (one `resourceManager.list` or one
   `run.list` a round). Passes/s against runs/s with WORKERS workers. Target >= 1.0x.
3. `settle`: RESOURCES resources, applied and settled first; then one
   `resourceManager.reconcile` event each, sent by SUBMITTERS threads, until none is
   pending; against starting RESOURCES one-node runs the same way until none is queued or
   running. Target <= 1.2x. The applies (a resolver child each, then the first pass) are
   timed too, for information.

Not a test (tests/test_benchmarks_smoke.py runs it with tiny sizes). For a quiet machine:
.venv/bin/python benchmarks/bench_resource_managers.py [latency|throughput|settle ...]
    [--samples 100] [--seconds 10] [--resources 1000] [--workers 4]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _server import workflow_server

from pi_workflows import WorkflowClient

IN_FLIGHT = 8  # throughput: WORKERS executing + as many being asked for or settling
SUBMITTERS = 4  # settle: client threads sending the events or starting the runs
WARMUP = 3
POLL_S = 0.002  # latency: the get poll interval (well under one pass)
ROUND_S = 0.005  # throughput: the pause between two poller rounds
SETTLE_ROUND_S = 0.25  # settle: the pause between two rounds (one reads every resource)
TIMEOUT_S = 120.0
SECTIONS = ("latency", "throughput", "settle")
UNSETTLED_RUNS = ["queued", "running"]
NOT_COMPLETED = ["failed", "timed_out", "cancelled", "waiting", "paused", "ambiguous"]

ONE_WORKFLOW = """
from pi_workflows import compute, define_workflow


def a(ctx):
    return {"x": 1}


workflow = define_workflow(name="one", start_at="a", nodes={"a": compute(a)})
"""

NOOP_MANAGER = """
from pi_workflows.resource_managers import condition_true, define_resource_manager


def reconcile(ctx):
    return ctx.settled(status={"phase": "ok"}, conditions=[condition_true("Ready", "Ok")])


resource_manager = define_resource_manager(
    name="noop", initial_status=lambda spec: {"phase": "new"}, reconcile=reconcile
)
"""


@dataclass(frozen=True)
class Setup:
    """One section's server: its state folder and the project holding `one` and `noop`."""

    state_dir: Path
    project: Path

    def client(self, name: str) -> WorkflowClient:
        client = WorkflowClient(self.state_dir, autostart=False, client_id=f"bench-{name}")
        client.connect()
        return client

    def resource(self, key: str) -> dict[str, Any]:
        return {"manager": "noop", "key": key, "projectPath": str(self.project)}

    def start_run(self, client: WorkflowClient) -> str:
        payload = {"workflow": "one", "input": {}, "projectPath": str(self.project)}
        return str(client.call("run.start", payload)["receipt"]["runId"])

    def apply(self, client: WorkflowClient, key: str) -> None:
        client.call("resourceManager.apply", {**self.resource(key), "spec": {"key": key}})

    def reconcile(self, client: WorkflowClient, key: str) -> None:
        client.call("resourceManager.reconcile", self.resource(key))


@contextlib.contextmanager
def section_server(folder: Path, name: str, workers: int) -> Iterator[Setup]:
    """A fresh state folder and project, and a server on them for one section."""
    root = folder / name
    state_dir, project = root / "agent" / "workflows", root / "project"
    for sub, file, text in (
        ("workflows", "one.workflow.py", ONE_WORKFLOW),
        ("resource-managers", "noop.resource_manager.py", NOOP_MANAGER),
    ):
        (project / ".pi" / sub).mkdir(parents=True, exist_ok=True)
        (project / ".pi" / sub / file).write_text(text)
    with workflow_server(state_dir, ["--max-workers", str(workers)]):
        yield Setup(state_dir, project)


def percentile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def until(check: Callable[[], bool], what: str, pause_s: float) -> None:
    deadline = time.perf_counter() + TIMEOUT_S
    while not check():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{what}: not done after {TIMEOUT_S:.0f} s")
        time.sleep(pause_s)


# --- pending work, read by one poller a round ------------------------------------------


def pending_resources(setup: Setup) -> Callable[[WorkflowClient], set[str]]:
    """Keys with a queue row or a live claim, or a spec not observed yet (one list call)."""

    def read(client: WorkflowClient) -> set[str]:
        payload = {"manager": "noop", "projectPath": str(setup.project)}
        items = client.call("resourceManager.list", payload)["receipt"]["resources"]
        return {
            item["key"]
            for item in items
            if item["queue"] is not None
            or item["reconciling"]
            or item["observedGeneration"] != item["generation"]
        }

    return read


def pending_runs(limit: int) -> Callable[[WorkflowClient], set[str]]:
    """Run IDs still queued or running (one `run.list` page of at most `limit`)."""

    def read(client: WorkflowClient) -> set[str]:
        page = client.call("run.list", {"status": UNSETTLED_RUNS, "limit": limit})["receipt"]
        return {item["runId"] for item in page["items"]}

    return read


class Poller:
    """One client thread reading what is pending every round, settling waiters.

    A waiter registered at `since` (after its request was answered, so the server holds
    the work) is settled by the first round that began after `since` and no longer lists
    its ID; it is marked with the time that round's answer came back.
    """

    def __init__(
        self, setup: Setup, read: Callable[[WorkflowClient], set[str]], pause_s: float
    ) -> None:
        self.client = setup.client("poller")
        self.read, self.pause_s = read, pause_s
        self.waiters: dict[str, tuple[float, threading.Event]] = {}
        self.settled: dict[str, float] = {}
        self.rounds: list[float] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.closing.is_set():
            began = time.perf_counter()
            pending = self.read(self.client)
            seen = time.perf_counter()
            self.rounds.append(seen - began)
            with self.lock:
                for ident, (since, event) in list(self.waiters.items()):
                    if since <= began and ident not in pending:
                        del self.waiters[ident]
                        self.settled[ident] = seen
                        event.set()
            time.sleep(self.pause_s)

    def wait(self, ident: str, since: float) -> float:
        event = threading.Event()
        with self.lock:
            self.waiters[ident] = (since, event)
        if not event.wait(TIMEOUT_S):
            raise TimeoutError(f"{ident} did not settle in {TIMEOUT_S:.0f} s")
        return self.settled[ident]

    def close(self) -> None:
        self.closing.set()
        self.thread.join(10)
        self.client.close()


# --- 1. one pass against one run ---------------------------------------------------------


def one_run(setup: Setup, client: WorkflowClient) -> float:
    began = time.perf_counter()
    run_id = setup.start_run(client)
    deadline = began + TIMEOUT_S
    while True:
        status = client.call("run.get", run_id=run_id)["receipt"]["display"]["status"]
        if status not in UNSETTLED_RUNS:
            break
        if time.perf_counter() > deadline:
            raise TimeoutError(f"run {run_id} still {status} after {TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)
    if status != "completed":
        raise RuntimeError(f"run {run_id} ended {status}, not completed")
    return time.perf_counter() - began


def newest_pass(setup: Setup, client: WorkflowClient, key: str) -> tuple[Any, bool]:
    """(the newest pass's record or None, whether the resource is out of the queue)."""
    view = client.call("resourceManager.get", setup.resource(key))["receipt"]
    passes = view["recentPasses"]
    return (passes[0] if passes else None), view["queue"] is None


def one_pass(setup: Setup, client: WorkflowClient, key: str) -> tuple[float, float]:
    """(request -> settled pass seen, the pass's claim -> the runner's result) in seconds."""
    before, _ = newest_pass(setup, client, key)
    began = time.perf_counter()
    setup.reconcile(client, key)
    deadline = began + TIMEOUT_S
    while True:
        newest, dequeued = newest_pass(setup, client, key)
        if dequeued and newest is not None and newest != before:
            break
        if time.perf_counter() > deadline:
            raise TimeoutError(f"no pass of {key} after {TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)
    if newest["outcome"] != "settled":
        raise RuntimeError(f"the pass of {key} ended {newest['outcome']}, not settled")
    return time.perf_counter() - began, newest["durationMs"] / 1e3


def settle_applied(setup: Setup, client: WorkflowClient, key: str) -> None:
    setup.apply(client, key)

    def observed() -> bool:
        view = client.call("resourceManager.get", setup.resource(key))["receipt"]
        resource = view["resource"]
        return view["queue"] is None and resource["observedGeneration"] == resource["generation"]

    until(observed, f"the first pass of {key}", POLL_S)


def latency(setup: Setup, samples: int) -> dict[str, list[float]]:
    client = setup.client("latency")
    try:
        settle_applied(setup, client, "latency")
        for _ in range(WARMUP):
            one_run(setup, client)
            one_pass(setup, client, "latency")
        runs: list[float] = []
        passes: list[float] = []
        held: list[float] = []
        for index in range(samples):  # alternate which goes first: drift hits both
            if index % 2 == 0:
                runs.append(one_run(setup, client))
            whole, claimed = one_pass(setup, client, "latency")
            passes.append(whole)
            held.append(claimed)
            if index % 2:
                runs.append(one_run(setup, client))
    finally:
        client.close()
    return {"runs": runs, "passes": passes, "held": held}


# --- 2. passes/s against runs/s ----------------------------------------------------------


def closed_loop(
    setup: Setup,
    poller: Poller,
    submit: Callable[[WorkflowClient, int], str],
    seconds: float,
    in_flight: int,
) -> dict[str, Any]:
    """`in_flight` threads each submitting, waiting for it to settle, and again; the
    completions seen inside a window of `seconds`."""
    stop = threading.Event()
    done: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    ready = threading.Barrier(in_flight + 1)

    def work(index: int) -> None:
        client = setup.client(f"loop{index}")
        try:
            ready.wait()
            while not stop.is_set():
                ident = submit(client, index)
                seen = poller.wait(ident, time.perf_counter())
                with lock:
                    done.append(seen)
        except Exception as exc:  # noqa: BLE001 - reported; the window goes on without it
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            client.close()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(in_flight)]
    for thread in threads:
        thread.start()
    ready.wait()
    start = time.perf_counter()
    time.sleep(seconds)
    end = time.perf_counter()
    stop.set()
    for thread in threads:
        thread.join(TIMEOUT_S)
    inside = [t for t in done if start <= t <= end]
    return {"completed": len(inside), "per_s": len(inside) / seconds, "errors": errors}


def throughput(setup: Setup, seconds: float, in_flight: int) -> dict[str, dict[str, Any]]:
    client = setup.client("throughput")
    try:
        keys = [f"loop-{i}" for i in range(in_flight)]
        for key in keys:
            settle_applied(setup, client, key)
        for _ in range(WARMUP):
            one_run(setup, client)
    finally:
        client.close()

    def start_run(client: WorkflowClient, _index: int) -> str:
        return setup.start_run(client)

    def reconcile(client: WorkflowClient, index: int) -> str:
        setup.reconcile(client, keys[index])
        return keys[index]

    result: dict[str, dict[str, Any]] = {}
    for label, read, submit in (
        ("runs", pending_runs(256), start_run),
        ("passes", pending_resources(setup), reconcile),
    ):
        poller = Poller(setup, read, ROUND_S)
        try:
            result[label] = closed_loop(setup, poller, submit, seconds, in_flight)
        finally:
            poller.close()
        result[label]["round_s"] = percentile(poller.rounds, 0.5)
    check = setup.client("check")
    try:
        others = check.call("run.list", {"status": NOT_COMPLETED, "limit": 1})["receipt"]["items"]
    finally:
        check.close()
    if others:
        raise RuntimeError(f"a run ended {others[0]['display']['status']}, not completed")
    return result


# --- 3. 1,000 events against 1,000 runs ----------------------------------------------------


def fan_out(
    setup: Setup, items: Sequence[str], send: Callable[[WorkflowClient, str], None]
) -> None:
    """Send one request per item from SUBMITTERS threads, each with its own client."""
    errors: list[BaseException] = []

    def work(index: int) -> None:
        client = setup.client(f"submit{index}")
        try:
            for item in items[index::SUBMITTERS]:
                send(client, item)
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(SUBMITTERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def timed_settle(
    setup: Setup,
    items: Sequence[str],
    send: Callable[[WorkflowClient, str], None],
    read: Callable[[WorkflowClient], set[str]],
) -> dict[str, float]:
    """Seconds from the first request until a round that began after the last one
    finds nothing pending (its answer's time), and how long the requests took."""
    client = setup.client("settle")
    try:
        began = time.perf_counter()
        fan_out(setup, items, send)
        sent = time.perf_counter()
        rounds: list[float] = []
        while True:
            round_began = time.perf_counter()
            pending = read(client)
            answered = time.perf_counter()
            rounds.append(answered - round_began)
            if not pending:
                break
            if answered - sent > TIMEOUT_S * 5:
                raise TimeoutError(f"{len(pending)} still pending {answered - sent:.0f} s on")
            time.sleep(SETTLE_ROUND_S)
    finally:
        client.close()
    return {"total": answered - began, "sending": sent - began, "round": percentile(rounds, 0.5)}


def settle(setup: Setup, count: int) -> dict[str, dict[str, float]]:
    keys = [f"r{i:05d}" for i in range(count)]
    resources = pending_resources(setup)
    result = {"applies": timed_settle(setup, keys, setup.apply, resources)}

    def start_run(client: WorkflowClient, _item: str) -> None:
        setup.start_run(client)

    result["runs"] = timed_settle(setup, keys, start_run, pending_runs(1))
    result["events"] = timed_settle(setup, keys, setup.reconcile, resources)
    client = setup.client("check")
    try:
        others = client.call("run.list", {"status": NOT_COMPLETED, "limit": 1})["receipt"]
        found = len(client.list_runs(status=["completed"]).items)
    finally:
        client.close()
    if others["items"] or found != count:
        raise RuntimeError(f"{found} of {count} runs completed")
    return result


# --- report --------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.1f} ms"


def verdict(ratio: float, target: float, lower_is_better: bool) -> str:
    met = ratio <= target if lower_is_better else ratio >= target
    sign = "<=" if lower_is_better else ">="
    return f"{ratio:6.2f}x   target {sign} {target}   {'MET' if met else 'NOT MET'}"


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min) {five:.2f} (5 min) on {os.cpu_count()} cores"


def report_latency(figures: dict[str, list[float]]) -> None:
    runs, passes = figures["runs"], figures["passes"]
    print(f"--- 1. one no-op pass vs one 1-node run ({len(runs)} alternating samples) ---")
    for label, samples in (("1-node run", runs), ("no-op pass", passes)):
        print(
            f"{label:<11} p50 {ms(percentile(samples, 0.5))}   "
            f"p90 {ms(percentile(samples, 0.9))}   min {ms(min(samples))}"
        )
    print(
        f"  of it, claim -> runner's result (fork, load, reconcile; durationMs) "
        f"p50 {ms(percentile(figures['held'], 0.5))}"
    )
    ratio = percentile(passes, 0.5) / percentile(runs, 0.5)
    print(f"p50 pass / p50 run: {verdict(ratio, 1.0, lower_is_better=True)}")


def report_throughput(figures: dict[str, dict[str, Any]], seconds: float, workers: int) -> None:
    runs, passes = figures["runs"], figures["passes"]
    print(f"--- 2. passes/s vs runs/s ({workers} workers, {IN_FLIGHT} in flight) ---")
    for label, part in (("1-node runs", runs), ("no-op passes", passes)):
        print(
            f"{label:<12} {part['completed']:5d} in {seconds:.0f} s = {part['per_s']:7.1f}/s   "
            f"(poller round p50 {ms(part['round_s'])})"
        )
        if part["errors"]:
            print(f"  client errors: {part['errors'][:3]}")
    ratio = passes["per_s"] / runs["per_s"] if runs["per_s"] else float("inf")
    print(f"passes/s / runs/s:  {verdict(ratio, 1.0, lower_is_better=False)}")


def report_settle(figures: dict[str, dict[str, float]], count: int) -> None:
    print(f"--- 3. {count} resources, one event each, vs {count} 1-node runs ---")
    for label, part in (
        (f"apply {count} (resolver each) + first passes", figures["applies"]),
        (f"start {count} runs until none queued/running", figures["runs"]),
        (f"reconcile event to {count} until none pending", figures["events"]),
    ):
        print(
            f"{label:<48} {part['total']:7.2f} s   (requests sent in {part['sending']:.2f} s, "
            f"{count / part['total']:6.1f}/s; a pending read {ms(part['round'])})"
        )
    ratio = figures["events"]["total"] / figures["runs"]["total"]
    print(f"events settled / runs completed: {verdict(ratio, 1.2, lower_is_better=True)}")
    applies = figures["applies"]["total"] / figures["runs"]["total"]
    print(f"(for information, applies settled / runs completed: {applies:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*", help=f"any of {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--samples", type=int, default=100, help="latency: samples of each")
    parser.add_argument("--seconds", type=float, default=10.0, help="throughput: each window")
    parser.add_argument("--resources", type=int, default=1000, help="settle: resources and runs")
    parser.add_argument("--workers", type=int, default=4, help="the server's --max-workers")
    args = parser.parse_args()
    sections = args.sections or list(SECTIONS)
    if unknown := sorted(set(sections) - set(SECTIONS)):
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")

    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="piw-rm-"))
    try:
        for name in sections:
            print(f"({name}: {load()} before)", flush=True)
            began = time.perf_counter()
            with section_server(folder, name, args.workers) as setup:
                if name == "latency":
                    report_latency(latency(setup, args.samples))
                elif name == "throughput":
                    figures = throughput(setup, args.seconds, IN_FLIGHT)
                    report_throughput(figures, args.seconds, args.workers)
                else:
                    report_settle(settle(setup, args.resources), args.resources)
            print(f"({name}: {time.perf_counter() - began:.0f} s wall, {load()} after)", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
