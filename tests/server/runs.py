"""Helpers the server tests share to drive real runs: start, follow, synchronise."""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pi_workflows import WorkflowClient

TERMINAL = {"completed", "failed", "timed_out", "cancelled"}


def start_run(client: WorkflowClient, project: Path, name: str, workflow_input: Any = None) -> str:
    """Start workflow `name` of `project` and return the run ID."""
    answer = client.call(
        "run.start",
        {
            "workflow": name,
            "input": {} if workflow_input is None else workflow_input,
            "projectPath": str(project),
        },
    )
    return str(answer["receipt"]["runId"])


def wait_until(
    client: WorkflowClient, run_id: str, check: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Follow the run-list subscription until `check(item)` holds; return `run.get`."""
    with WorkflowClient(client.state_dir, autostart=False, timeout=60) as watcher:
        watcher.call("view.subscribe", {"kind": "runList"})
        while True:
            event = watcher.read_message()
            assert event is not None, "the server closed the subscription"
            if event["type"] != "event":
                continue
            for item in event["payload"]["items"]:
                if item["runId"] == run_id and check(item):
                    return dict(client.call("run.get", run_id=run_id)["receipt"])


def wait_for(client: WorkflowClient, run_id: str, wanted: set[str]) -> dict[str, Any]:
    """Follow the run-list subscription until the run's display status is in `wanted`.

    `ambiguous` counts once the run is parked for it (the item has a reason): the run
    shows `ambiguous` from the commit that made its effect ambiguous, and its runner
    parks it in a later one, before which recover and cancel meet the runner's claim.
    """

    def settled(item: dict[str, Any]) -> bool:
        status = item["display"]["status"]
        if status == "ambiguous" and item["display"].get("reason") is None:
            return False
        return status in wanted

    return wait_until(client, run_id, settled)


def wait_fifo(fifo: Path, timeout: float = 60) -> str:
    """Block until a workflow writes to the FIFO (a real event, not a poll); return it."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            readable, _, _ = select.select([fd], [], [], timeout)
            assert readable, "the workflow never announced itself"
            with contextlib.suppress(BlockingIOError):  # a writer opened, wrote nothing yet
                data = os.read(fd, 64)
                if data:
                    return data.decode()
    finally:
        os.close(fd)
