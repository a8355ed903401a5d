"""The origin-session rig for the real-pi tests (tests/pi/test_origin_*.py): a real
`pi --mode rpc` with the extension loaded (`-e`), on a session file in a temporary Pi
agent dir, a fake model provider, and a real workflow server.

Pi is observed through its RPC stdout (every event is kept: workflow messages arrive as
`message_end` of a `custom` message, turns as `agent_start`/`agent_end`, the widget and
notifications as `extension_ui_request`), and the server through its database (read
only) and `WorkflowClient`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.engine._pi_child import PiChild, PiTimeout
from pi_workflows.testing import FakeProvider
from tests.conftest import write_workflow
from tests.pi.agents import running_server
from tests.pi.rigs import PiRoot
from tests.server.origin import session_snapshot
from tests.server.watchers import Watcher

WAIT_S = 60.0
MESSAGE_TYPE = "pi-workflows.message"

AGENT_WORKFLOW = """
from pi_workflows import agent, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={
        "ask": agent(
            prompt=lambda ctx: "Summarise " + ctx.input.get("topic", "the diff"),
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            timeout=600,
        ),
    },
    edges=[],
)
"""


def wait_until(condition: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """Poll `condition()` until it is truthy and return it (a bound, never a delay)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@dataclass
class OriginPi:
    """One real pi with the extension, and every RPC event it sent so far."""

    child: PiChild
    events: list[dict[str, Any]] = field(default_factory=list)

    def drain(self, timeout: float = 0.0) -> None:
        """Keep the events pi sent (waiting up to `timeout` for the first)."""
        try:
            self.events.append(self.child.next_event(timeout))
            while True:
                self.events.append(self.child.next_event(0))
        except PiTimeout:
            return

    def wait_event(
        self,
        matches: Callable[[dict[str, Any]], bool],
        what: str,
        timeout: float = WAIT_S,
        *,
        since: int = 0,
    ) -> dict[str, Any]:
        """The first kept event from index `since` that matches, reading on until one
        does."""
        deadline = time.monotonic() + timeout
        index = since
        while True:
            while index < len(self.events):
                if matches(self.events[index]):
                    return self.events[index]
                index += 1
            left = deadline - time.monotonic()
            assert left > 0, f"pi sent no {what}; last events: {self.kinds()[-12:]}"
            self.drain(min(left, 0.5))

    def last_index(self, kind: str) -> int:
        """The index of the newest kept event of `kind` (0 if none)."""
        self.drain()
        found = [i for i, event in enumerate(self.events) if event.get("type") == kind]
        return found[-1] if found else 0

    def count(self, matches: Callable[[dict[str, Any]], bool]) -> int:
        self.drain()
        return sum(1 for event in self.events if matches(event))

    def kinds(self) -> list[str]:
        return [str(event.get("type")) for event in self.events]

    def command(self, text: str) -> None:
        """Send `text` as a prompt (an extension command) and wait for pi to take it."""
        command_id = self.child.send({"type": "prompt", "message": text})
        response = self.child.wait_response(command_id, 30)
        assert response.get("success"), response

    def rpc(self, command: dict[str, Any]) -> dict[str, Any]:
        response = self.child.wait_response(self.child.send(command), 30)
        assert response.get("success"), response
        return response

    def notice(self, text: str) -> str:
        """Run a command and return the notification it shows."""
        mark = len(self.events)
        self.command(text)

        def notified() -> bool:
            return any(
                e.get("type") == "extension_ui_request" and e.get("method") == "notify"
                for e in self.events[mark:]
            )

        def drained_and_notified() -> bool:
            self.drain(0.2)
            return notified()

        wait_until(drained_and_notified, f"a notification for {text!r}")
        [event] = [
            e
            for e in self.events[mark:]
            if e.get("type") == "extension_ui_request" and e.get("method") == "notify"
        ][:1]
        return str(event["message"])


def is_workflow_message(event: dict[str, Any]) -> bool:
    message = event.get("message") or {}
    return (
        event.get("type") == "message_end"
        and message.get("role") == "custom"
        and message.get("customType") == MESSAGE_TYPE
    )


def message_id_of(event: dict[str, Any]) -> str:
    return str(event["message"]["details"]["messageId"])


@dataclass
class OriginRig(PiRoot):
    @property
    def session(self) -> Path:
        return self.root / "sessions" / "origin.jsonl"

    def spawn(self, session: Path | None = None) -> OriginPi:
        """A pi with the extension on `session` (default: the rig's one session file;
        starting pi again on it is a Pi restart)."""
        return OriginPi(self.spawn_extension(session or self.session))

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(f"file:{self.state_dir / 'state.sqlite'}?mode=ro", uri=True)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def messages(self, run_id: str) -> list[tuple[Any, ...]]:
        """(message ID, kind, reason, state, Pi entry ID) in session order."""
        return self.rows(
            "SELECT message_id, kind, reason, state, pi_entry_id FROM workflow_messages "
            "WHERE run_id = ? ORDER BY session_order",
            run_id,
        )

    def turns(self, run_id: str) -> list[tuple[Any, ...]]:
        """(turn ID, message ID, status) in start order."""
        return self.rows(
            "SELECT turn_id, message_id, status FROM workflow_turns WHERE run_id = ? "
            "ORDER BY started_at, rowid",
            run_id,
        )

    def view(self, run_id: str) -> dict[str, Any]:
        with WorkflowClient(self.state_dir, autostart=False, timeout=30) as client:
            receipt: dict[str, Any] = client.call("run.get", run_id=run_id)["receipt"]
        return receipt

    def status(self, run_id: str) -> str:
        return str(self.view(run_id)["display"]["status"])

    def session_view(self, session_id: str) -> dict[str, Any]:
        """The session view as a bystander sees it (no coordinator claim)."""
        watcher = Watcher(self.state_dir / "host" / "host.sock")
        try:
            watcher.subscribe({"kind": "sessionView", "sessionId": session_id})
            return session_snapshot(watcher, lambda _: True, "a session view")
        finally:
            watcher.close()

    def origin_session(self, run_id: str) -> str:
        [(session,)] = self.rows(
            "SELECT origin_session_id FROM run_bindings WHERE run_id = ?", run_id
        )
        return str(session)


@pytest.fixture
def origin_rig(
    pi_binary: Path, provider: FakeProvider, pi_slot: None, short_tmp: Path
) -> Iterator[OriginRig]:
    for folder in ("project", "tmp", "sessions"):
        (short_tmp / folder).mkdir()
    provider.write_agent_dir(short_tmp / "agent")
    provider.script()
    write_workflow(short_tmp / "project", "ask", AGENT_WORKFLOW)
    rig = OriginRig(short_tmp, provider, pi_binary, [])
    try:
        yield rig
    finally:
        for child in rig.children:
            child.stop()  # by PID: pi's keeper and its group


@pytest.fixture
def origin_server(origin_rig: OriginRig) -> Iterator[WorkflowServer]:
    with running_server(origin_rig.state_dir) as instance:
        yield instance


@contextlib.contextmanager
def server_process(rig: OriginRig) -> Iterator[subprocess.Popen[str]]:
    """`pi-workflows server run` as a child in its own session; at exit its whole group
    (zygote and runners included) is killed by PID."""
    command = [sys.executable, "-m", "pi_workflows.cli", "--state-dir", str(rig.state_dir)]
    child = subprocess.Popen(
        [*command, "server", "run", "--idle-exit", "0"],
        env={**os.environ, "PI_CODING_AGENT_DIR": str(rig.agent_dir)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None and "running" in child.stdout.readline()
        yield child
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
        if child.stdout is not None:
            child.stdout.close()
