"""Helpers the channel tests share: a decision workflow, a profiles file, a waiting run,
and reads of the channel rows straight from the state file (a WAL reader)."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pi_workflows import WorkflowClient
from tests.conftest import write_workflow
from tests.server.runs import TERMINAL, start_run, wait_for

TOKEN = "123456789:AAH-test-token-abcdefghijklmnopqrstuv"
"""A token in Bot API shape; the tests grep everything for it."""
CHAT_ID = -1001234567890
ALLOWED_USER = 4242
STRANGER = 999

DEPLOY = """
from pi_workflows import compute, define_workflow, human_decision

workflow = define_workflow(
    name="deploy",
    start_at="ask",
    nodes={
        "ask": human_decision(
            "Deploy build 42 to production?",
            choices={"approve": "Approve", "reject": "Reject"},
        ),
        "done": compute(lambda ctx: {"answer": ctx.outputs["ask"]}),
    },
    edges=[{"from": "ask", "to": "done"}],
)
"""

TIMED = """
from pi_workflows import compute, define_workflow, human_decision

workflow = define_workflow(
    name="deploy",
    start_at="ask",
    nodes={
        "ask": human_decision(
            "Deploy build 42 to production?",
            choices={"approve": "Approve", "reject": "Reject"},
            on_timeout=(SECONDS, {"choice": "reject"}),
        ),
        "done": compute(lambda ctx: {"answer": ctx.outputs["ask"]}),
    },
    edges=[{"from": "ask", "to": "done"}],
)
"""


def write_profiles(
    state_dir: Path,
    api_base: str,
    *,
    mode: int = 0o600,
    workflows: tuple[str, ...] = ("deploy",),
    token: str = TOKEN,
) -> Path:
    """`<agent dir>/workflows/channels.json` with one profile `ops` (mode 0600)."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir.parent / "workflows" / "channels.json"
    document = {
        "schema": "pi-workflows.channels.v1",
        "profiles": {
            "ops": {
                "botToken": token,
                "chatId": CHAT_ID,
                "allowedUserIds": [ALLOWED_USER],
                "workflows": list(workflows),
                "apiBase": api_base,
            }
        },
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(document, handle)
    os.chmod(path, mode)
    return path


def waiting_run(client: WorkflowClient, project: Path, source: str = DEPLOY) -> str:
    """Start `deploy` and wait until it waits at its decision."""
    write_workflow(project, "deploy", source)
    run_id = start_run(client, project, "deploy")
    view = wait_for(client, run_id, {"waiting"} | TERMINAL)
    assert view["display"]["status"] == "waiting", view["display"]
    return run_id


def rows(state_dir: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def attempts(state_dir: Path, kind: str = "channel.deliver") -> list[tuple[int, str, str | None]]:
    """(attempt number, state, recovery) of the channel effect of `kind`, in order."""
    return [
        (number, state, recovery)
        for number, state, recovery in rows(
            state_dir,
            "SELECT a.attempt_number, a.state, a.recovery FROM effect_attempts AS a "
            "JOIN effects AS e ON e.effect_id = a.effect_id WHERE e.effect_type = ? "
            "ORDER BY a.attempt_number",
            (kind,),
        )
    ]


def channel_row(state_dir: Path) -> tuple[Any, ...] | None:
    found = rows(
        state_dir,
        "SELECT channel, channel_revision, delivery_state, settlement_state FROM channel_messages",
    )
    return found[0] if found else None


def eventually(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Wait for a durable condition (read from the state file); never a fixed sleep."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        pause.wait(0.05)
