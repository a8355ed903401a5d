"""`state backup` of a large database against `sqlite3 .backup` of the same file, and
`server.status` latency during the backup against idle, in one run.

What is measured (issue 26):

- **backup time**: `state.backup` through a real server (`server run` child, a client on
  its socket), from the request until the response: the stepped copy on the state-backup
  actor's connection, the fsync, the read-only verification (integrity check, schema
  digest, every invariant, every blob digest) and the stored receipt. **copy time** is
  the same request until its first `verify` progress event (the copy and its fsync only).
- **reference**: the `sqlite3` shell's `.backup` of the same live file to a new file (a
  second WAL reader beside the running, idle server; no verification); Python's
  `sqlite3.Connection.backup` in one step when the shell is not installed. Samples
  alternate with the backups', so the disk's writeback of earlier copies weighs on both
  alike (run first and alone, a reference looked up to 2x faster at 1 GiB).
- **status p99**: `server.status` round trips from a second client, back to back, while
  idle and while one more backup runs (only the requests that started and ended inside
  the backup count). The times above are of backups with no such load.

Each time is the median of `--samples` runs (the reference too), so a neighbour's load on
a shared machine moves it less.

The database: a real server creates the state folder; with the server stopped, blobs of
1 MiB of random bytes (with their true digests, so the verification hashes them) are
added until the file reaches `--mib` MiB.

Targets (issue 26): backup ≤ 1.3× the reference; status p99 during the backup ≤ 5× idle.

Run: `.venv/bin/python benchmarks/bench_backup.py [--mib 1024] [--status-idle 2000]`.
The server is stopped by PID (SIGTERM, then SIGKILL) before it exits.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _server import workflow_server

from pi_workflows import WorkflowClient

BLOB_BYTES = 1024 * 1024


def _build(state_dir: Path, mib: int) -> float:
    """Seconds to add blobs until the stopped database is `mib` MiB."""
    began = time.perf_counter()
    with workflow_server(state_dir, ("--no-execute",)):
        pass  # the schema, the server epoch, a clean stop
    conn = sqlite3.connect(state_dir / "state.sqlite", isolation_level=None)
    try:
        conn.execute("BEGIN")
        now = int(time.time() * 1000)
        for _ in range(mib):
            content = os.urandom(BLOB_BYTES)
            digest = "sha256:" + hashlib.sha256(content).hexdigest()
            conn.execute(
                "INSERT INTO blobs (digest, byte_length, content, created_at) VALUES (?,?,?,?)",
                (digest, len(content), content, now),
            )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return time.perf_counter() - began


def _reference(live: Path, folder: Path) -> tuple[float, str]:
    target = folder / "reference.sqlite"
    shell = shutil.which("sqlite3")
    began = time.perf_counter()
    if shell is not None:
        subprocess.run([shell, str(live), f".backup {target}"], check=True)
        how = "sqlite3 .backup"
    else:
        source = sqlite3.connect(live)
        copy = sqlite3.connect(target)
        try:
            source.backup(copy)
        finally:
            copy.close()
            source.close()
        how = "Python sqlite3 backup, one step"
    took = time.perf_counter() - began
    target.unlink()
    return took, how


def _status_latencies(
    state_dir: Path, stop: threading.Event, out: list[tuple[float, float]]
) -> None:
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        while not stop.is_set():
            began = time.perf_counter()
            client.call("server.status")
            out.append((began, time.perf_counter()))


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _backup(state_dir: Path, dest: Path) -> dict[str, Any]:
    first_verify: list[float] = []

    def on_event(event: dict[str, Any]) -> None:
        body = event.get("payload", {})
        if event.get("kind") == "maintenanceProgress" and body.get("stage") == "verify":
            first_verify.append(time.perf_counter())

    client = WorkflowClient(state_dir, autostart=False, timeout=600)
    client.event_sink = on_event
    with client:
        began = time.perf_counter()
        answer = client.call("state.backup", {"path": str(dest), "progress": True})
        ended = time.perf_counter()
    return {
        "began": began,
        "ended": ended,
        "copy_s": (first_verify[0] if first_verify else ended) - began,
        "receipt": answer["receipt"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="database size in MiB")
    parser.add_argument("--status-idle", type=int, default=2000, help="idle status samples")
    parser.add_argument("--samples", type=int, default=3, help="backups (and references) timed")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="piw-bench-backup-", dir="/tmp"))
    try:
        state_dir = root / "agent" / "workflows"
        built = _build(state_dir, args.mib)
        live = state_dir / "state.sqlite"
        size = live.stat().st_size
        print(f"database: {size / 2**20:.0f} MiB of 1 MiB blobs, built in {built:.1f} s")
        with workflow_server(state_dir, ("--no-execute",)):
            references: list[tuple[float, str]] = []
            timed: list[dict[str, Any]] = []
            for n in range(args.samples):
                references.append(_reference(live, root))
                timed.append(_backup(state_dir, root / f"timed-{n}.sqlite"))
                (root / f"timed-{n}.sqlite").unlink()
            reference, how = statistics.median(t for t, _ in references), references[0][1]
            print(f"reference ({how}, beside the server): median {reference:.2f} s")
            total = statistics.median(r["ended"] - r["began"] for r in timed)
            copy_s = statistics.median(r["copy_s"] for r in timed)
            idle: list[tuple[float, float]] = []
            with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
                for _ in range(args.status_idle):
                    began = time.perf_counter()
                    client.call("server.status")
                    idle.append((began, time.perf_counter()))
            during: list[tuple[float, float]] = []
            stop = threading.Event()
            poller = threading.Thread(target=_status_latencies, args=(state_dir, stop, during))
            poller.start()
            try:
                result = _backup(state_dir, root / "backup.sqlite")
            finally:
                stop.set()
                poller.join(60)
        inside = [
            end - start
            for start, end in during
            if start >= result["began"] and end <= result["ended"]
        ]
        idle_p99 = _p99([end - start for start, end in idle])
        busy_p99 = _p99(inside)
        loaded = result["ended"] - result["began"]
        print(
            f"state backup: median {total:.2f} s in all ({total / reference:.2f}x the "
            f"reference); copy and fsync {copy_s:.2f} s ({copy_s / reference:.2f}x), check "
            f"and receipt {total - copy_s:.2f} s; {result['receipt']['pageCount']} pages; "
            f"{loaded:.2f} s while server.status was polled"
        )
        print(
            f"server.status p99: idle {idle_p99 * 1000:.2f} ms ({len(idle)} requests), during "
            f"the backup {busy_p99 * 1000:.2f} ms ({len(inside)} requests): "
            f"{busy_p99 / idle_p99:.2f}x idle (median {statistics.median(inside) * 1000:.2f} ms)"
        )
        print("targets: backup <= 1.3x the reference; status p99 during it <= 5x idle")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
