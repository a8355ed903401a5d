"""What bench_peers.py's three systems share: the workflow's shape, the clients, the meters.

Every system runs the same chain: node k returns `{"i": k + 1}` from its predecessor's
output (the first from nothing), each a durable step. Each system runs in a child
process of the benchmark (Restate's inside a network namespace of its own) and writes
its figures as one JSON object on stdout; this module holds the parts those children
share, so each measures the same way:

- latency: one client, runs one after another, start -> completed as that client sees it;
- throughput: CLIENTS client threads, each starting a run and waiting for it, in a loop,
  completions counted inside a window of SECONDS;
- CPU per run over that window, two ways: the child's process tree (`TreeCpu`: user +
  system time of every process in it, reaped children included, so it holds the client,
  the server and every worker however short-lived) and the whole machine (`/proc/stat`
  busy time, which also counts whatever else runs on a shared machine).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import psutil

RUN_TIMEOUT_S = 30.0
WARMUP = 3


def percentile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def chain_outputs(nodes: int) -> dict[str, int]:
    """What a chain of `nodes` nodes returns: every system checks its result against it."""
    return {"i": nodes}


# --- CPU meters ----------------------------------------------------------------------


def _tree_cpu_s(root: psutil.Process) -> float:
    """User + system seconds of `root` and its descendants, reaped children included."""
    total = 0.0
    processes = [root]
    with contextlib.suppress(psutil.Error):
        processes += root.children(recursive=True)
    for process in processes:
        with contextlib.suppress(psutil.Error):  # exited since the listing: its parent reaps it
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def _machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (`/proc/stat`, all CPUs)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@dataclass
class TreeCpu:
    """CPU spent between `start` and `stop`, by this process tree and by the machine.

    A process that is alive at `start` and reaped before `stop` is counted once: its
    share before `start` is subtracted, its whole life arrives in its parent's
    children times. A process that leaves the tree (a double fork) would be lost; none
    of the systems measured does that on its path.
    """

    tree_s: float = 0.0
    machine_s: float = 0.0
    _root: psutil.Process = field(default_factory=psutil.Process)
    _tree_at: float = 0.0
    _machine_at: float = 0.0

    def start(self) -> None:
        self._tree_at = _tree_cpu_s(self._root)
        self._machine_at = _machine_busy_s()

    def stop(self) -> None:
        self.tree_s = _tree_cpu_s(self._root) - self._tree_at
        self.machine_s = _machine_busy_s() - self._machine_at


# --- latency and throughput drivers --------------------------------------------------


def latency(one: Callable[[], object], runs: int, warmup: int = WARMUP) -> list[float]:
    """Wall seconds of `runs` calls of `one` (each a whole run), after `warmup` calls."""
    for _ in range(warmup):
        one()
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        one()
        samples.append(time.perf_counter() - began)
    return samples


class Throughput(TypedDict):
    completed: int
    per_s: float
    cpu_tree_s: float
    cpu_machine_s: float
    errors: list[str]


def throughput(clients: Sequence[Callable[[], object]], seconds: float) -> Throughput:
    """Each callable in `clients` runs whole runs in a loop on its own thread.

    Runs that finish inside the window are counted; the CPU meters cover the same
    window, so CPU per run is `cpu_*_s / completed` in a steady state.
    """
    stop = threading.Event()
    finished: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    ready = threading.Barrier(len(clients) + 1)

    def work(one: Callable[[], object]) -> None:
        ready.wait()
        try:
            while not stop.is_set():
                one()
                now = time.perf_counter()
                with lock:
                    finished.append(now)
        except Exception as exc:  # noqa: BLE001 - reported with the figures
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])

    threads = [threading.Thread(target=work, args=(one,), daemon=True) for one in clients]
    for thread in threads:
        thread.start()
    meter = TreeCpu()
    ready.wait()
    meter.start()
    began = time.perf_counter()
    time.sleep(seconds)
    ended = time.perf_counter()
    meter.stop()
    stop.set()
    for thread in threads:
        thread.join(RUN_TIMEOUT_S)
    inside = sum(1 for t in finished if began <= t <= ended)
    return {
        "completed": inside,
        "per_s": inside / (ended - began),
        "cpu_tree_s": meter.tree_s,
        "cpu_machine_s": meter.machine_s,
        "errors": errors,
    }


# --- database size -------------------------------------------------------------------


class DatabaseSize(TypedDict):
    used_bytes: int
    runs: int
    empty_bytes: int


def live_used_bytes(path: Path) -> int:
    """Used pages of a database in use, as a reader sees it (WAL frames included).

    Read before the first run, it is the empty schema's share, which a short benchmark
    would otherwise spread over few runs.
    """
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        pages = connection.execute("PRAGMA page_count").fetchone()[0]
        free = connection.execute("PRAGMA freelist_count").fetchone()[0]
        size = connection.execute("PRAGMA page_size").fetchone()[0]
    finally:
        connection.close()
    return int((pages - free) * size)


def used_bytes(path: Path, count_sql: str, empty_bytes: int) -> DatabaseSize:
    """Used pages of a closed SQLite database after a WAL checkpoint, and its run count.

    Used pages are `page_count - freelist_count`, so free pages a VACUUM would drop do
    not count against a system.
    """
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = connection.execute("PRAGMA page_count").fetchone()[0]
        free = connection.execute("PRAGMA freelist_count").fetchone()[0]
        size = connection.execute("PRAGMA page_size").fetchone()[0]
        runs = connection.execute(count_sql).fetchone()[0]
    finally:
        connection.close()
    return {"used_bytes": (pages - free) * size, "runs": int(runs), "empty_bytes": empty_bytes}


def commit_floor_s(folder: Path, commits: int = 50) -> float:
    """p50 of one tiny SQLite commit in WAL with synchronous=FULL on this disk.

    Both SQLite systems pay about this per commit, so it tells how far fsync sets the
    figures on the machine at hand.
    """
    connection = sqlite3.connect(folder / "floor.sqlite", isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute("CREATE TABLE t (v INTEGER)")
        times = []
        for value in range(commits):
            began = time.perf_counter()
            connection.execute("INSERT INTO t VALUES (?)", (value,))
            times.append(time.perf_counter() - began)
    finally:
        connection.close()
    return percentile(times, 0.5)


def figures(samples: list[float], flow: Throughput, **extra: Any) -> dict[str, Any]:
    """One system's figures as its child writes them (JSON on stdout)."""
    return {"samples": samples, **flow, **extra}
