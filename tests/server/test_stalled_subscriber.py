"""A run subscriber that never reads: one pending event at most, and nobody waits for it.

Real parts: an embedded server that executes runs in runner processes, a workflow of
many short compute steps (each step's commit is a new run-view revision), raw
subscriber sockets, and the server side of the stalled connection with a small send
buffer (a real socket option) so that it fills after a few events.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.wire._listener import ClientListener, Connection
from pi_workflows.wire.canonical import dumps
from tests.conftest import write_workflow
from tests.server.watchers import HeldView, Watcher, wait_for

pytestmark = pytest.mark.timeout(120)

STEPS = 40

STEPS_WORKFLOW = f"""
import time

from pi_workflows import compute, define_workflow

def step(ctx):
    time.sleep(0.02)
    return {{"at": time.time(), "pad": "x" * 200}}

workflow = define_workflow(
    name="steps",
    start_at="s0",
    nodes={{f"s{{i}}": compute(step) for i in range({STEPS})}},
    edges=[{{"from": f"s{{i}}", "to": f"s{{i + 1}}"}} for i in range({STEPS} - 1)],
)
"""

TERMINAL = frozenset({"completed", "failed", "timed_out", "cancelled"})


def _server_side(server: WorkflowServer, connection_id: str) -> Connection:
    listener = server._listener  # private: the per-connection state the test inspects
    assert listener is not None

    def find() -> Connection | None:
        return next(
            (c for c in list(listener._connections) if c.connection_id == connection_id), None
        )

    wait_for(lambda: find() is not None, "the server side of the stalled connection")
    found = find()
    assert found is not None
    return found


def _pending(listener: ClientListener, connection: Connection) -> tuple[int, int]:
    """(events queued unwritten, bytes buffered in the transport), read on the loop."""

    async def sample() -> tuple[int, int]:
        return len(connection._events), connection._writer.transport.get_write_buffer_size()

    return asyncio.run_coroutine_threadsafe(sample(), listener._loop).result(10)


def _settled(view: dict[str, Any]) -> dict[str, Any]:
    """The view without its runner activity: the runner's exit after the run completed
    does not move the run's revision on main yet (`run_view_revision` is to cover every
    view input), so a view at the completing revision may still show the runner."""
    display = {key: value for key, value in view["display"].items() if key != "activity"}
    return {**view, "display": display}


def _status(client: WorkflowClient, run_id: str) -> str:
    return str(client.call("run.get", run_id=run_id)["receipt"]["display"]["status"])


def test_a_stalled_run_subscriber_holds_one_pending_event_and_slows_no_one(
    running_server: WorkflowServer, project: Path
) -> None:
    server = running_server
    write_workflow(project, "steps", STEPS_WORKFLOW)
    listener = server._listener
    subscriptions = server._subscriptions
    assert listener is not None and subscriptions is not None
    with WorkflowClient(server.state_dir, autostart=False, timeout=30) as client:
        started = client.call("run.start", {"workflow": "steps", "projectPath": str(project)})
        run_id = started["receipt"]["runId"]
        stalled = Watcher(server.socket_path, receive_buffer=4096)
        reading = Watcher(server.socket_path)
        try:
            side = _server_side(server, stalled.connection_id)
            side._writer.transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDBUF, 4096
            )
            stalled.subscribe({"kind": "run"}, runId=run_id)  # from here on: never read
            reading.subscribe({"kind": "run"}, runId=run_id)
            skipped_before = subscriptions.proxy().snapshots_skipped_undrained.get(timeout=10)
            held = HeldView()
            most_events, most_buffered, blocked = 0, 0, False
            other: str | None = None
            while held.view is None or held.view["display"]["status"] not in TERMINAL:
                held.apply(reading.event())
                events, buffered = _pending(listener, side)
                most_events = max(most_events, events + (1 if buffered else 0))
                most_buffered = max(most_buffered, buffered)
                blocked = blocked or buffered > 0
                if blocked and other is None:
                    # With the stalled socket full, another run starts and finishes.
                    other = client.call(
                        "run.start", {"workflow": "hello", "projectPath": str(project)}
                    )["receipt"]["runId"]
            assert blocked, "the stalled connection's socket never filled"
            final = client.call("run.get", run_id=run_id)["receipt"]
            assert held.view is not None and held.revision == final["revision"]
            assert _settled(held.view) == _settled(final), "every change, patched"
            assert final["display"]["status"] == "completed"
            assert other is not None
            wait_for(lambda: _status(client, other) == "completed", "the other run to finish")
            # Still stalled: at most one event is held for it, in the transport's buffer.
            events, buffered = _pending(listener, side)
            assert events + (1 if buffered else 0) <= 1
            assert most_events <= 1, "at most one pending event for the stalled subscriber"
            assert most_buffered <= len(dumps(final)) + 512, "never more than one snapshot"
            skipped = subscriptions.proxy().snapshots_skipped_undrained.get(timeout=10)
            assert skipped > skipped_before, "revisions coalesced while it was blocked"
            # Reading at last, it catches up: every patch applies to what it holds.
            caught_up = HeldView()
            while caught_up.view is None or caught_up.revision < final["revision"]:
                event: dict[str, Any] = stalled.event()
                caught_up.apply(event)
            assert _settled(caught_up.view) == _settled(final)
            assert len(caught_up.kinds) < STEPS, "coalesced: fewer events than changes"
        finally:
            stalled.close()
            reading.close()
