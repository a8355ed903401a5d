"""Fixtures for server tests: an embedded server with fast ticks, a client, and a bare
database on a manual clock (for views and handlers built straight from storage)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.storage import Database, ManualClock, open_database
from pi_workflows.testing import perform_with_calls
from tests.conftest import write_workflow


@pytest.fixture
def project(short_tmp: Path) -> Path:
    """A project folder with `.pi/workflows/hello.workflow.py`."""
    folder = short_tmp / "project"
    write_workflow(folder, "hello")
    return folder


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    """A real database file at `<tmp>/workflows/state.sqlite`, on a manual clock."""
    database = open_database(tmp_path / "workflows" / "state.sqlite", clock=ManualClock())
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def server(state_dir: Path) -> Iterator[WorkflowServer]:
    instance = WorkflowServer(
        state_dir,
        idle_exit_s=None,
        tick_s=0.05,
        execute_runs=False,
        units=perform_with_calls,  # tests may run a `CallUnit` through `call_database`
    )
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown")


@pytest.fixture
def running_server(state_dir: Path) -> Iterator[WorkflowServer]:
    """An embedded server that executes runs in real runner processes."""
    instance = WorkflowServer(
        state_dir,
        idle_exit_s=None,
        tick_s=0.05,
        execute_runs=True,
        units=perform_with_calls,
    )
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown")


@pytest.fixture
def client(server: WorkflowServer) -> Iterator[WorkflowClient]:
    with WorkflowClient(server.state_dir, autostart=False, timeout=10) as connected:
        yield connected
