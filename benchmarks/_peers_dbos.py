"""DBOS in bench_peers.py: a workflow of chained `@DBOS.step`s on SQLite, in-process.

The system database is SQLite in the benchmark's temp folder with `journal_mode=WAL`
and `synchronous=FULL` set on every connection (the durability pi-workflows' state
database uses); the figures carry the pragmas read back, so a change is visible.
Latency is `DBOS.start_workflow` to `handle.get_result()`; the throughput clients are
threads doing the same. Only the `bench` extra installs DBOS, so it is imported here,
in the child that runs it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from _peers_common import (
    chain_outputs,
    figures,
    latency,
    live_used_bytes,
    throughput,
    used_bytes,
)


def _launch(database: Path) -> tuple[Any, Any, dict[str, Any]]:
    """Configure and launch DBOS; return (DBOS, the chain workflow, pragmas read back)."""
    import sqlalchemy as sa  # noqa: PLC0415 - optional: the bench extra
    from dbos import DBOS  # noqa: PLC0415

    checked: dict[str, Any] = {}

    @sa.event.listens_for(sa.engine.Engine, "connect")
    def durable(dbapi_conn: Any, record: Any) -> None:
        if isinstance(dbapi_conn, sqlite3.Connection):
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            dbapi_conn.execute("PRAGMA synchronous=FULL")
            checked["journal_mode"] = dbapi_conn.execute("PRAGMA journal_mode").fetchone()[0]
            checked["synchronous"] = dbapi_conn.execute("PRAGMA synchronous").fetchone()[0]

    @DBOS.step()
    def step(previous: dict[str, int] | None) -> dict[str, int]:
        return {"i": 1 if previous is None else previous["i"] + 1}

    @DBOS.workflow()
    def chain(nodes: int) -> dict[str, int] | None:
        output = None
        for _ in range(nodes):
            output = step(output)
        return output

    DBOS(
        config={
            "name": "bench-peers",
            "system_database_url": f"sqlite:///{database}",
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    return DBOS, chain, checked


def _runner(dbos: Any, chain: Any, nodes: int) -> Any:
    def one() -> None:
        result = dbos.start_workflow(chain, nodes).get_result()
        if result != chain_outputs(nodes):
            raise RuntimeError(f"the chain returned {result!r}")

    return one


def main_phase(folder: Path, runs: int, clients: int, seconds: float) -> dict[str, Any]:
    database = folder / "dbos.sqlite"
    dbos, chain, pragmas = _launch(database)
    empty = live_used_bytes(database)
    try:
        samples = latency(_runner(dbos, chain, 3), runs)
        flow = throughput([_runner(dbos, chain, 3) for _ in range(clients)], seconds)
    finally:
        dbos.destroy()
    size = used_bytes(
        database, "SELECT COUNT(*) FROM workflow_status WHERE status = 'SUCCESS'", empty
    )
    return figures(samples, flow, database=size, pragmas=pragmas)


def chain_phase(folder: Path, runs: int, long_nodes: int) -> dict[str, Any]:
    dbos, chain, _ = _launch(folder / "dbos.sqlite")
    short: list[float] = []
    long: list[float] = []
    try:
        for index in range(runs):
            warmup = 3 if index == 0 else 0
            short += latency(_runner(dbos, chain, 3), 1, warmup)
            long += latency(_runner(dbos, chain, long_nodes), 1, warmup)
    finally:
        dbos.destroy()
    return {"short": short, "long": long, "long_nodes": long_nodes}
