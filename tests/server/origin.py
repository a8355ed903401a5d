"""Shared helpers for the origin-session tests: an interactive agent workflow, a
running server, direct reads of its database, and session-view snapshots."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.wire import protocol
from tests.conftest import write_workflow
from tests.server.watchers import Watcher

SESSION = "pi-session-1"

AGENT_WORKFLOW = """
from pi_workflows import agent, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={
        "ask": agent(
            prompt=lambda ctx: "Summarise " + ctx.input["topic"],
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            timeout=600,
        ),
    },
    edges=[],
)
"""


@pytest.fixture
def running(state_dir: Path) -> Iterator[WorkflowServer]:
    instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown")


@pytest.fixture
def ask_project(short_tmp: Path) -> Path:
    project = short_tmp / "project"
    write_workflow(project, "ask", AGENT_WORKFLOW)
    write_workflow(project, "echo")
    return project


def start(
    client: WorkflowClient, project: Path, name: str, session: str | None, **extra: Any
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "workflow": name,
        "input": {"topic": "the diff"},
        "projectPath": str(project),
        **extra,
    }
    if session is not None:
        payload["originSessionId"] = session
    return dict(client.request("run.start", payload))


def rows(state_dir: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Read the server's database directly (a test's view of the durable facts)."""
    conn = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def session_snapshot(
    watcher: Watcher, check: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """The first session snapshot (from now on) for which `check` holds."""
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, f"no session snapshot with {what}"
        event = watcher.event()
        assert event["kind"] == "sessionSnapshot", event["kind"]
        assert event["revision"] == event["payload"]["revision"]
        protocol.validate("session-view.v1", event["payload"])
        if check(event["payload"]):
            return dict(event["payload"])


def has_step(view: dict[str, Any]) -> bool:
    return view["activeRun"] is not None and view["messages"]["count"] == 1
