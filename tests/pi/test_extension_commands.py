"""The Pi extension (pi_workflows/pi/extension) in the real `pi --mode rpc`, loaded with
`-e`, against a real workflow server started by the test (issue 14, items 1 and 2).

In RPC mode a prompt that starts with `/` runs an extension command, and the
extension's `ctx.ui.notify`, `setWidget` and `setStatus` arrive on pi's stdout as
`extension_ui_request` events (docs/rpc.md § Extension UI protocol): the tests drive
`/workflow ...` through `prompt` and read what the user would see there, and check the
server's own view of the same run with `WorkflowClient`.

The extension finds the server as the CLI does: `<PI_CODING_AGENT_DIR>/workflows`, or
`PI_WORKFLOWS_STATE_DIR`.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.engine._pi_child import PiChild, PiTimeout
from pi_workflows.testing import FakeProvider, text_turn
from tests.conftest import write_workflow
from tests.pi.agents import running_server
from tests.pi.rigs import PiRoot
from tests.server.runs import TERMINAL, wait_for

pytestmark = pytest.mark.timeout(120)

UI_TIMEOUT_S = 30.0
STARTED = re.compile(r"^Started workflow (\S+): (run-[0-9a-f]+)$", re.M)  # line 1 of 2

APPROVAL = """
from pi_workflows import checkpoint, compute, define_workflow

workflow = define_workflow(
    name="approval",
    start_at="ask",
    nodes={
        "ask": checkpoint(summary="Ship it?", input_schema={
            "type": "object", "required": ["approved"],
            "properties": {"approved": {"type": "boolean"}}}),
        "done": compute(lambda ctx: {"shipped": ctx.outputs["ask"]["approved"]}),
    },
    edges=[{"from": "ask", "to": "done"}],
)
"""


@dataclass
class Origin:
    """One real pi with the extension, and everything it showed the user so far.

    The widget follows the server's subscription, so its update for a command may reach
    pi's stdout before or after the command's own notification: a wait looks at every
    UI event since the last command was sent that no earlier wait took, then reads on.
    """

    child: PiChild
    seen: list[dict[str, Any]] = field(default_factory=list)
    taken: set[int] = field(default_factory=set)
    mark: int = 0

    def run(self, text: str) -> None:
        """Send `text` as a prompt (an extension command) and wait for pi to take it."""
        self.mark = len(self.seen)
        response = self.child.wait_response(
            self.child.send({"type": "prompt", "message": text}), UI_TIMEOUT_S
        )
        assert response.get("success"), response

    def wait_ui(
        self, method: str, matches: Callable[[dict[str, Any]], bool], timeout: float = UI_TIMEOUT_S
    ) -> dict[str, Any]:
        """The first `extension_ui_request` of `method` that `matches`, since the last
        command, not taken by an earlier wait."""
        index = self.mark
        deadline = time.monotonic() + timeout
        while True:
            while index < len(self.seen):
                event = self.seen[index]
                if index not in self.taken and event.get("method") == method and matches(event):
                    self.taken.add(index)
                    return event
                index += 1
            try:
                event = self.child.next_event(max(0.0, deadline - time.monotonic()))
            except PiTimeout:
                shown = [
                    (e.get("method"), e.get("message") or e.get("widgetLines")) for e in self.seen
                ]
                raise AssertionError(
                    f"no {method} as wanted; the last UI events: {shown[-6:]}"
                ) from None
            if event.get("type") == "extension_ui_request":
                self.seen.append(event)

    def notice(self, text: str, *, level: str | None = None) -> str:
        """Run a command and return the next notification's text."""
        self.run(text)
        event = self.wait_ui("notify", lambda _: True)
        if level is not None:
            assert event.get("notifyType", "info") == level, event
        return str(event["message"])

    def widget_with(self, words: str) -> list[str]:
        """Wait for the widget to show a line containing `words`; its lines."""
        event = self.wait_ui(
            "setWidget",
            lambda e: any(words in line for line in e.get("widgetLines") or []),
        )
        return list(event["widgetLines"])

    def start(self, name: str, raw_input: str = "") -> str:
        message = self.notice(f"/workflow start {name} {raw_input}".rstrip(), level="info")
        found = STARTED.match(message)
        assert found is not None and found.group(1) == name, message
        return found.group(2)


@dataclass
class Rig(PiRoot):
    def spawn(self, session: Path | None = None, **extra_env: str) -> Origin:
        """A pi with the extension; with `session`, on that session file (a restart of pi
        on the same file is a Pi restart), else with no session file."""
        return Origin(self.spawn_extension(session, extra_env))


@pytest.fixture
def rig(pi_binary: Path, provider: FakeProvider, pi_slot: None, short_tmp: Path) -> Iterator[Rig]:
    for folder in ("project", "tmp"):
        (short_tmp / folder).mkdir()
    provider.write_agent_dir(short_tmp / "agent")
    provider.script()  # no model turn is expected: commands never prompt the model
    setup = Rig(short_tmp, provider, pi_binary, [])
    try:
        yield setup
    finally:
        for child in setup.children:
            child.stop()  # by PID: pi's keeper and its group


@pytest.fixture
def server(rig: Rig) -> Iterator[WorkflowServer]:
    with running_server(rig.state_dir) as instance:
        yield instance


def _view(state_dir: Path, run_id: str) -> dict[str, Any]:
    with WorkflowClient(state_dir, autostart=False) as client:
        receipt: dict[str, Any] = client.call("run.get", run_id=run_id)["receipt"]
    return receipt


def _settle(state_dir: Path, run_id: str, wanted: set[str]) -> dict[str, Any]:
    with WorkflowClient(state_dir, autostart=False) as client:
        return wait_for(client, run_id, wanted)


PI_VERBS = ("pause", "resume", "cancel", "restart")
"""The controls these tests' runs allow, and their one `/workflow` form each."""


def _command_lines(run_id: str, display: dict[str, Any]) -> list[str]:
    """What the widget shows of the display's advice and controls: the server's words,
    then each advised and each other allowed control as the /workflow command."""
    advised = [step for step in display.get("next") or [] if step in PI_VERBS]
    lines = [f"what to do: {display['action']}"] if display.get("action") else []
    lines += [f"  /workflow {step} {run_id}" for step in advised]
    rest = [c for c in display.get("controls") or [] if c in PI_VERBS and c not in advised]
    if rest:
        lines += ["allowed now:", *(f"  /workflow {control} {run_id}" for control in rest)]
    return lines


# --- start, the widget and the status line ----------------------------------------------


def test_workflow_start_starts_a_run_in_pis_project_and_the_widget_shows_the_servers_display(
    rig: Rig, server: WorkflowServer
) -> None:
    origin = rig.spawn()
    run_id = origin.start("hello", '{"name": "Ada"}')
    final = _settle(rig.state_dir, run_id, TERMINAL)
    assert final["display"]["status"] == "completed", final
    view = _view(rig.state_dir, run_id)
    assert view["workflow"] == "hello"
    assert view["result"] is not None
    lines = origin.widget_with(f"{run_id}: completed")
    assert lines == [
        f"workflow hello {run_id}: completed",
        *_command_lines(run_id, view["display"]),
    ]
    status = origin.wait_ui("setStatus", lambda e: "completed" in str(e.get("statusText")))
    assert status["statusText"] == "workflow hello: completed"
    assert status["statusKey"] == "pi-workflows"
    with WorkflowClient(rig.state_dir, autostart=False) as client:
        listed = client.call("run.list")["receipt"]["items"]
    assert [item["runId"] for item in listed] == [run_id], "exactly one run was started"


def test_list_and_status_show_the_servers_runs(rig: Rig, server: WorkflowServer) -> None:
    origin = rig.spawn()
    run_id = origin.start("hello")
    _settle(rig.state_dir, run_id, TERMINAL)
    listed = origin.notice("/workflow list", level="info")
    assert listed.splitlines() == [f"{run_id}  completed  hello"], listed
    status = origin.notice("/workflow status", level="info").splitlines()
    view = _view(rig.state_dir, run_id)
    assert status[0] == f"{run_id}  completed  hello", status
    assert all(line in status for line in _command_lines(run_id, view["display"])), status
    # The run's revision may still move after it completed (its runner's exit is
    # recorded): the report names the revision it read, never a later one.
    (reported,) = [int(line.split()[1]) for line in status if line.startswith("revision ")]
    assert 0 < reported <= view["revision"], (status, view["revision"])
    named = origin.notice(f"/workflow status {run_id}", level="info")
    assert named.splitlines()[0] == status[0]
    # Not inside tmux (pi's environment is built from scratch: no $TMUX): the exact
    # command, naming the run and the test's state folder, with a program that exists.
    viewer = origin.notice("/piw", level="info").splitlines()
    said = f"Pi is not running inside tmux. To watch {run_id} in piw, run this in a terminal:"
    assert viewer[0] == said, viewer
    command = shlex.split(viewer[1])
    # The session's own run: piw gets the session, so its Clear acts on this session's view.
    session = _origin_session(rig.state_dir, run_id)
    assert command[1:] == ["--state-dir", str(rig.state_dir), "--session", session, run_id], viewer
    assert shutil.which(command[0]) is not None and Path(command[0]).name == "piw", viewer
    assert origin.notice(f"/piw split {run_id}", level="info").splitlines() == viewer
    refused = origin.notice("/piw now", level="error")
    assert refused.startswith('/piw does not take "now".'), refused


def _origin_session(state_dir: Path, run_id: str) -> str:
    """The Pi session a run was started from (its binding, read directly)."""
    conn = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        row = conn.execute(
            "SELECT origin_session_id FROM run_bindings WHERE run_id = ?", (run_id,)
        ).fetchone()
    finally:
        conn.close()
    assert row is not None and isinstance(row[0], str), row
    return row[0]


# --- pause, resume, answer, cancel ---------------------------------------------------


def test_pause_resume_and_answer_a_checkpoint_from_pi(rig: Rig, server: WorkflowServer) -> None:
    write_workflow(rig.project, "approval", APPROVAL)
    origin = rig.spawn()
    run_id = origin.start("approval")
    waiting = _settle(rig.state_dir, run_id, {"waiting"} | TERMINAL)
    assert waiting["display"]["status"] == "waiting", waiting
    origin.widget_with(f"{run_id}: waiting")

    assert origin.notice("/workflow pause", level="info") == f"pause: {run_id}"
    assert _view(rig.state_dir, run_id)["display"]["status"] == "paused"
    paused = origin.widget_with(f"{run_id}: paused")
    shown = _command_lines(run_id, _view(rig.state_dir, run_id)["display"])
    assert shown and all(line in paused for line in shown), paused

    assert origin.notice("/workflow resume", level="info") == f"resume: {run_id}"
    assert _settle(rig.state_dir, run_id, {"waiting"})["display"]["status"] == "waiting"
    origin.widget_with(f"{run_id}: waiting")

    answered = origin.notice('/workflow answer {"approved": true}', level="info")
    found = re.fullmatch(rf"Answered {run_id}; the workflow continues as (run-[0-9a-f]+)", answered)
    assert found is not None, answered
    continuation = found.group(1)
    done = _settle(rig.state_dir, continuation, TERMINAL)
    assert done["display"]["status"] == "completed", done
    origin.widget_with(f"{continuation}: completed")  # the widget follows the continuation


def test_cancel_from_pi_and_a_refused_command_says_why(rig: Rig, server: WorkflowServer) -> None:
    write_workflow(rig.project, "approval", APPROVAL)
    origin = rig.spawn()
    run_id = origin.start("approval")
    _settle(rig.state_dir, run_id, {"waiting"} | TERMINAL)
    refused = origin.notice('/workflow answer {"approved": "yes"}', level="error")
    assert refused.startswith("rejected (answerInvalid):"), refused
    assert origin.notice(f"/workflow cancel {run_id}", level="info") == f"cancel: {run_id}"
    assert _settle(rig.state_dir, run_id, TERMINAL)["display"]["status"] == "cancelled"
    origin.widget_with(f"{run_id}: cancelled")
    again = origin.notice("/workflow resume", level="error")
    assert again.startswith("rejected"), again


# --- bad input and no server ---------------------------------------------------------


def test_bad_json_and_bad_arguments_are_refused_before_anything_is_sent(
    rig: Rig, server: WorkflowServer
) -> None:
    origin = rig.spawn()
    bad = origin.notice("/workflow start hello {name: Ada", level="error")
    assert bad == 'The workflow input is not valid JSON; pass a value such as {"name": "Ada"}.'
    assert "not valid JSON" in origin.notice("/workflow answer {oops", level="error")
    assert "No run was started in this Pi session" in origin.notice(
        "/workflow status", level="error"
    )
    assert origin.notice("/workflow frobnicate", level="error").startswith(
        'Unknown /workflow command "frobnicate".'
    )
    refused = origin.notice("/workflow start no-such-workflow", level="error")
    assert refused.startswith("rejected (workflowNotFound):"), refused
    with WorkflowClient(rig.state_dir, autostart=False) as client:
        assert client.call("run.list")["receipt"]["items"] == [], "no run was started"


def test_without_a_server_commands_say_how_to_start_one_and_work_once_it_runs(
    rig: Rig, short_tmp: Path
) -> None:
    elsewhere = short_tmp / "state"  # PI_WORKFLOWS_STATE_DIR wins over the agent dir
    origin = rig.spawn(PI_WORKFLOWS_STATE_DIR=str(elsewhere))
    message = origin.notice("/workflow list", level="error")
    assert message == (
        "The workflow server is not running. Start it with `pi-workflows server start` "
        "in a terminal, then try again."
    )
    assert str(short_tmp) not in message, "the error names no user path"
    with running_server(elsewhere):
        run_id = origin.start("hello")
        assert _settle(elsewhere, run_id, TERMINAL)["display"]["status"] == "completed"
        origin.widget_with(f"{run_id}: completed")
    assert not (rig.state_dir / "host").exists(), "the agent dir's state folder was not used"


def test_the_widget_recovers_after_the_server_restarts(rig: Rig) -> None:
    write_workflow(rig.project, "approval", APPROVAL)
    with running_server(rig.state_dir):
        origin = rig.spawn()
        run_id = origin.start("approval")
        _settle(rig.state_dir, run_id, {"waiting"} | TERMINAL)
        origin.widget_with(f"{run_id}: waiting")
    lost = origin.widget_with("connection to the workflow server lost")
    assert lost[0] == f"workflow approval {run_id}: waiting", "the last view stays, with a note"
    with running_server(rig.state_dir):
        with WorkflowClient(rig.state_dir, autostart=False) as client:
            answered = client.call("run.answer", {"answer": {"approved": True}}, run_id=run_id)
        continuation = answered["receipt"]["continuationRunId"]
        done = _settle(rig.state_dir, continuation, TERMINAL)
        assert done["display"]["status"] == "completed"
        # The session view's one subscription is back on a new connection, and the widget
        # shows the run it names: the continuation the answer started.
        origin.widget_with(f"{continuation}: completed")


# --- a lost response: the retry adopts ------------------------------------------------


class DroppingRelay:
    """A Unix-socket relay to the server that swallows the first response to one
    operation and drops that connection: the server committed, the client never heard
    (client-protocol.md § Commands and uncertain results)."""

    def __init__(self, listen: Path, upstream: Path, operation: str) -> None:
        self.upstream = upstream
        self.operation = operation
        self.requests: list[dict[str, Any]] = []
        self.responses: list[dict[str, Any]] = []
        self.dropped = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(listen))
        self._server.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        # A blocked accept() is not woken by close() alone: shut the listener down first,
        # or the extension's next once-a-second reconnect is still accepted.
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        for sock in [self._server, *list(self._sockets)]:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(str(self.upstream))
            except OSError:  # the server is gone (teardown): refuse this one as it would
                client.close()
                upstream.close()
                continue
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, outbound: bool) -> None:
        with contextlib.suppress(OSError):
            self._relay(source, sink, outbound)
        for sock in (source, sink):  # one side ended, or a response was dropped: both go
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _relay(self, source: socket.socket, sink: socket.socket, outbound: bool) -> None:
        buffer = b""
        while chunk := source.recv(65536):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if not self._forward(json.loads(line), outbound):
                    return
                sink.sendall(line + b"\n")

    def _forward(self, message: dict[str, Any], outbound: bool) -> bool:
        with self._lock:
            if outbound:
                if message.get("type") == "request":
                    self.requests.append(message)
                return True
            if message.get("type") != "response":
                return True
            ours = [r for r in self.requests if r["operation"] == self.operation]
            if any(r["requestId"] == message["requestId"] for r in ours):
                self.responses.append(message)
                if self.dropped == 0:
                    self.dropped = 1
                    return False
            return True


@contextlib.contextmanager
def dropping_relay(listen: Path, upstream: Path, operation: str) -> Iterator[DroppingRelay]:
    listen.parent.mkdir(parents=True, exist_ok=True)
    relay = DroppingRelay(listen, upstream, operation)
    try:
        yield relay
    finally:
        relay.close()


def test_a_start_whose_response_was_lost_is_retried_with_the_same_key_and_adopted(
    rig: Rig, server: WorkflowServer, short_tmp: Path
) -> None:
    relayed = short_tmp / "relay"
    with dropping_relay(
        relayed / "host" / "host.sock", rig.state_dir / "host" / "host.sock", "run.start"
    ) as relay:
        origin = rig.spawn(PI_WORKFLOWS_STATE_DIR=str(relayed))
        run_id = origin.start("hello")
        assert relay.dropped == 1, "the first response never reached the extension"
        starts = [r for r in relay.requests if r["operation"] == "run.start"]
        assert len(starts) == 2, starts
        first, retry = starts
        assert first["requestId"] != retry["requestId"], "a new request ID per attempt"
        assert first["idempotencyKey"] == retry["idempotencyKey"], "one durable identity"
        assert first["payload"] == retry["payload"]
        assert first["payload"]["projectPath"] == str(rig.project), "pi's cwd is the project"
        assert [r["outcome"] for r in relay.responses] == ["accepted", "adopted"]
        with WorkflowClient(rig.state_dir, autostart=False) as client:
            runs = client.call("run.list")["receipt"]["items"]
        assert [item["runId"] for item in runs] == [run_id], "exactly one run"


# --- a Pi restart ------------------------------------------------------------------------


def test_a_restarted_pi_on_the_same_session_follows_the_run_it_started(
    rig: Rig, server: WorkflowServer
) -> None:
    write_workflow(rig.project, "approval", APPROVAL)
    session = rig.root / "sessions" / "origin.jsonl"
    session.parent.mkdir()
    first = rig.spawn(session)
    # pi writes a session file only once it holds a model reply (SessionManager defers
    # every entry until then): an ordinary conversation comes first.
    rig.provider.script(text_turn("Hello."))
    assert first.child.run_turn("Hi", 60).stop_reason == "stop"
    run_id = first.start("approval")
    _settle(rig.state_dir, run_id, {"waiting"} | TERMINAL)
    first.widget_with(f"{run_id}: waiting")
    first.child.stop()
    entries = [json.loads(line) for line in session.read_text().splitlines()]
    recorded = [e for e in entries if e.get("customType") == "pi-workflows.run"]
    session_id = entries[0]["id"]  # the header: a run started here names this origin session
    assert [e["data"] for e in recorded] == [{"runId": run_id, "originSessionId": session_id}]

    again = rig.spawn(session)  # nothing typed yet: the widget is back from the session
    assert again.widget_with(f"{run_id}: waiting")[0] == f"workflow approval {run_id}: waiting"
    status = again.notice("/workflow status", level="info")
    assert status.splitlines()[0] == f"{run_id}  waiting  approval", status
    answered = again.notice('/workflow answer {"approved": false}', level="info")
    assert answered.startswith(f"Answered {run_id}; the workflow continues as run-"), answered


# --- conformance bullet 33: no workflow or manager code in pi ---------------------------

MARK = """
import os
from pathlib import Path

import psutil

_chain = [os.getpid(), *(p.pid for p in psutil.Process().parents())]
with open(Path(__file__).resolve().parents[2] / "marks", "a") as _marks:
    _marks.write(" ".join(map(str, _chain)) + "\\n")
"""

MARKED = (
    MARK
    + """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="marked",
    start_at="work",
    nodes={"work": compute(lambda ctx: {"pid": os.getpid()})},
)
"""
)

MARKED_MANAGER = (
    MARK
    + """
from pi_workflows.resource_managers import condition_true, define_resource_manager

resource_manager = define_resource_manager(
    name="marker",
    initial_status=lambda spec: {},
    reconcile=lambda ctx: ctx.settled(status={"pid": os.getpid()},
                                      conditions=[condition_true("Ready", "Marked")]),
)
"""
)


def _importers(project: Path) -> list[list[int]]:
    """Each importing process's PID followed by its ancestors' PIDs."""
    lines = (project / "marks").read_text().splitlines()
    return [[int(pid) for pid in line.split()] for line in lines]


def _settled_pass(state_dir: Path, project: Path) -> dict[str, Any]:
    """The `marker/k` resource once a pass has settled it."""
    ref = {"manager": "marker", "key": "k", "projectPath": str(project.resolve())}
    deadline = time.monotonic() + UI_TIMEOUT_S
    with WorkflowClient(state_dir, autostart=False) as client:
        while True:
            view: dict[str, Any] = client.call("resourceManager.get", ref)["receipt"]
            if view["resource"]["conditions"]:
                return view
            assert time.monotonic() < deadline, view
            time.sleep(0.05)


def test_code_started_from_pi_runs_only_in_the_servers_children(
    rig: Rig, server: WorkflowServer
) -> None:
    """The workflow and manager files record each importing process and its ancestors:
    they must be imported (by the server's resolver, runner and resource runner
    children), never by pi, its keeper, or a process below them."""
    write_workflow(rig.project, "marked", MARKED)
    managers = rig.project / ".pi" / "resource-managers"
    managers.mkdir(parents=True)
    (managers / "marker.resource_manager.py").write_text(MARKED_MANAGER)
    origin = rig.spawn()
    keeper, pi = origin.child.pid, origin.child.pi_pid
    assert pi is not None
    run_id = origin.start("marked")
    final = _settle(rig.state_dir, run_id, TERMINAL)
    assert final["display"]["status"] == "completed", final
    applied = origin.notice("/resource-manager apply marker k {}", level="info")
    assert applied == "marker/k generation 1 version 1 (created)"
    settled = _settled_pass(rig.state_dir, rig.project)
    assert settled["resource"]["status"]["pid"] not in (keeper, pi)
    importers = _importers(rig.project)
    # The start's resolver and the runner; the apply's resolver and the pass's child.
    assert len(importers) >= 4, importers
    for chain in importers:
        assert keeper not in chain and pi not in chain, (
            "workflow or manager code ran in pi or in a process pi started"
        )
