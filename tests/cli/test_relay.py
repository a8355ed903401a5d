"""`piw serve` through real processes: a server (`pi-workflows server run`), the relay
(`piw serve`) and real `websockets` clients.

A WebSocket at `/ws` gets the answers a local `WorkflowClient` gets; it and its server
connection close together (the server's connections are counted from the OS, as
`server.status` reports no connection count); a non-loopback bind is refused; a bad frame
closes only its own WebSocket; without a server a WebSocket is closed with the reason.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from pi_workflows import WorkflowClient
from pi_workflows.cli._relay import NonLoopbackBindError, parse_bind
from pi_workflows.wire import CLIENT_SCHEMA, MAX_FRAME_BYTES, dumps, loads
from tests.conftest import Processes, write_workflow

pytestmark = pytest.mark.timeout(120)

PIW = Path(sys.executable).parent / "piw"
WAIT_S = 30.0


@dataclass(frozen=True)
class Rig:
    """A server process, a relay process in front of it, and the relay's URL."""

    state_dir: Path
    server: subprocess.Popen[str]
    relay: subprocess.Popen[str]
    url: str

    @property
    def server_pid(self) -> int:
        return int((self.state_dir / "host" / "server.lock").read_text().strip())


def _start_server(processes: Processes, state_dir: Path) -> subprocess.Popen[str]:
    server = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0", "--no-execute")
    assert server.stdout is not None
    line = server.stdout.readline()  # the banner comes once the socket accepts
    assert "running" in line, f"server did not start: {line!r}"
    for child in psutil.Process(server.pid).children(recursive=True):
        processes.adopt(child.pid)  # the zygote outlives a SIGKILLed server
    return server


def _spawn_relay(processes: Processes, state_dir: Path, bind: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PI_CODING_AGENT_DIR=str(state_dir.parent))
    relay = subprocess.Popen(
        [str(PIW), "serve", "--bind", bind, "--state-dir", str(state_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    processes.started.append(relay)
    return relay


def _start_relay(processes: Processes, state_dir: Path) -> tuple[subprocess.Popen[str], str]:
    relay = _spawn_relay(processes, state_dir, "127.0.0.1:0")
    assert relay.stdout is not None
    line = relay.stdout.readline()  # printed once the port is bound
    assert "relaying ws://127.0.0.1:" in line, f"relay did not start: {line!r}"
    return relay, line.split()[3]


@pytest.fixture
def rig(processes: Processes, state_dir: Path) -> Rig:
    server = _start_server(processes, state_dir)
    relay, url = _start_relay(processes, state_dir)
    return Rig(state_dir, server, relay, url)


@pytest.fixture
def opened(rig: Rig) -> Iterator[Callable[[], ClientConnection]]:
    """Opens WebSockets to the relay (each after its hello) and closes them at teardown."""
    with contextlib.ExitStack() as stack:

        def open_one() -> ClientConnection:
            websocket = stack.enter_context(connect(rig.url, open_timeout=WAIT_S, close_timeout=5))
            hello = _decoded(_recv_text(websocket))
            assert hello["type"] == "hello" and hello["schema"] == CLIENT_SCHEMA
            return websocket

        yield open_one


def _recv_text(websocket: ClientConnection) -> str:
    message = websocket.recv(timeout=WAIT_S)
    assert isinstance(message, str), "the relay sends text frames only"
    return message


def _decoded(text: str) -> dict[str, Any]:
    message = loads(text.encode())
    assert isinstance(message, dict)
    return message


def _request(
    websocket: ClientConnection, operation: str, run_id: str | None = None
) -> dict[str, Any]:
    """Send one request through the relay and return its response (events are skipped)."""
    request: dict[str, Any] = {
        "schema": CLIENT_SCHEMA,
        "type": "request",
        "clientId": "relay-test",
        "operation": operation,
        "idempotencyKey": f"key-{time.monotonic_ns()}",
        "requestId": f"request-{time.monotonic_ns()}",
        "payload": {},
    }
    if run_id is not None:
        request["runId"] = run_id
    websocket.send(dumps(request).decode())
    while True:
        text = _recv_text(websocket)
        message = _decoded(text)  # canonical: forwarded as the server wrote it
        if message["type"] == "response" and message["requestId"] == request["requestId"]:
            return dict(message)


def _server_connections(rig: Rig) -> int:
    """Client connections the server holds: its sockets bound to host.sock, less the
    listening one (accepted Unix sockets carry the listener's path)."""
    path = str(rig.state_dir / "host" / "host.sock")
    found = psutil.Process(rig.server_pid).net_connections(kind="unix")
    return sum(1 for connection in found if str(connection.laddr) == path) - 1


def _wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    pause = threading.Event()
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        pause.wait(0.05)


def _closed_by_relay(websocket: ClientConnection) -> tuple[int, str]:
    """Wait until the relay closes `websocket`; return its close code and reason."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            websocket.recv(timeout=WAIT_S)
    assert closed.value.rcvd is not None, "the relay closed without a close frame"
    return closed.value.rcvd.code, closed.value.rcvd.reason


# --- the same answers as a local client -----------------------------------------------


def test_a_websocket_gets_the_answers_a_local_client_gets(
    rig: Rig, opened: Callable[[], ClientConnection], short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "hello")
    with WorkflowClient(rig.state_dir, autostart=False, timeout=WAIT_S) as local:
        started = local.call(
            "run.start", {"workflow": "hello", "input": {}, "projectPath": str(project)}
        )
        run_id = started["receipt"]["runId"]
        direct_status = local.call("server.status")["receipt"]
        direct_run = local.call("run.get", run_id=run_id)
        direct_list = local.call("run.list")["receipt"]
    websocket = opened()

    status = _request(websocket, "server.status")
    assert status["outcome"] == "accepted"
    for key in ("state", "epoch", "pid", "runs"):  # the run is queued: no runner moves
        assert status["receipt"][key] == direct_status[key], key

    relayed = _request(websocket, "run.get", run_id)
    assert relayed["outcome"] == "accepted"
    assert relayed["receipt"]["runId"] == run_id
    assert relayed["revision"] == direct_run["revision"]
    assert relayed["receipt"]["status"] == direct_run["receipt"]["status"]
    assert relayed["receipt"]["display"] == direct_run["receipt"]["display"]

    listed = _request(websocket, "run.list")["receipt"]
    assert [item["runId"] for item in listed["items"]] == [
        item["runId"] for item in direct_list["items"]
    ]


# --- coupled lifecycles ----------------------------------------------------------------


def test_closing_the_websocket_closes_its_server_connection(
    rig: Rig, opened: Callable[[], ClientConnection]
) -> None:
    before = _server_connections(rig)
    websocket = opened()
    _wait_for(lambda: _server_connections(rig) == before + 1, "the relay connected")
    websocket.close()
    _wait_for(lambda: _server_connections(rig) == before, "the server connection closed")
    assert rig.relay.poll() is None


def test_killing_the_server_closes_the_websocket_and_the_relay_keeps_serving(
    rig: Rig, opened: Callable[[], ClientConnection], processes: Processes
) -> None:
    websocket = opened()
    os.kill(rig.server.pid, signal.SIGKILL)
    rig.server.wait(WAIT_S)

    code, reason = _closed_by_relay(websocket)
    assert code == 1001 and "workflow server closed" in reason
    assert rig.relay.poll() is None

    # The relay never starts a server: a new WebSocket is closed with the reason.
    with connect(rig.url, open_timeout=WAIT_S, close_timeout=5) as later:
        code, reason = _closed_by_relay(later)
    assert code == 1013 and "not running" in reason and "server start" in reason
    assert rig.relay.poll() is None

    # It holds nothing of the old server: after a start, a new WebSocket gets its hello.
    _start_server(processes, rig.state_dir)
    assert _request(opened(), "server.status")["outcome"] == "accepted"


def test_sigterm_stops_the_relay_and_closes_its_connections(
    rig: Rig, opened: Callable[[], ClientConnection]
) -> None:
    before = _server_connections(rig)
    websocket = opened()
    _wait_for(lambda: _server_connections(rig) == before + 1, "the relay connected")
    rig.relay.send_signal(signal.SIGTERM)
    assert rig.relay.wait(WAIT_S) == 0
    code, _ = _closed_by_relay(websocket)
    assert code == 1001
    _wait_for(lambda: _server_connections(rig) == before, "the server connection closed")


# --- bad input -------------------------------------------------------------------------

BAD_FRAMES: dict[str, tuple[str | bytes, int]] = {
    "binary": (b'{"type":"request"}', 1003),
    "oversized": ('{"a":"' + "x" * MAX_FRAME_BYTES + '"}', 1009),
    "not canonical": ('{"type": "request"}', 1007),
    "not JSON": ("{", 1007),
    "not an object": ("[1,2]", 1007),
}


def test_a_bad_frame_closes_only_its_websocket(
    rig: Rig, opened: Callable[[], ClientConnection]
) -> None:
    bystander = opened()
    before = _server_connections(rig)
    for name, (frame, expected) in BAD_FRAMES.items():
        offender = opened()
        offender.send(frame)
        code, reason = _closed_by_relay(offender)
        assert code == expected and reason, name
        _wait_for(lambda: _server_connections(rig) == before, f"{name}: its connection closed")
        assert _request(bystander, "server.status")["outcome"] == "accepted", name
    assert rig.relay.poll() is None


def test_a_path_other_than_ws_is_refused_with_404(rig: Rig) -> None:
    with (
        pytest.raises(InvalidStatus) as refused,
        connect(rig.url.replace("/ws", "/other"), open_timeout=WAIT_S),
    ):
        pass
    assert refused.value.response.status_code == 404


# --- the bind address ------------------------------------------------------------------


@pytest.mark.parametrize("bind", ["0.0.0.0:9377", "192.0.2.1:9377", "[::]:9377"])
def test_a_non_loopback_bind_is_refused(processes: Processes, state_dir: Path, bind: str) -> None:
    relay = _spawn_relay(processes, state_dir, bind)
    out, err = relay.communicate(timeout=WAIT_S)
    assert relay.returncode == 2
    assert "only a loopback address" in err and "ssh -L" in err
    assert err.count("\n") == 1 and "relaying" not in out


def test_an_address_in_use_exits_1(processes: Processes, state_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        relay = _spawn_relay(processes, state_dir, f"127.0.0.1:{taken.getsockname()[1]}")
        _, err = relay.communicate(timeout=WAIT_S)
    assert relay.returncode == 1 and "cannot listen on 127.0.0.1:" in err


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("127.0.0.1:9377", "127.0.0.1", 9377),
        ("[::1]:0", "::1", 0),
        ("localhost:9377", "localhost", 9377),
        ("LOCALHOST:1", "localhost", 1),
    ],
)
def test_loopback_binds_are_accepted(text: str, host: str, port: int) -> None:
    address = parse_bind(text)
    assert (address.host, address.port) == (host, port)


@pytest.mark.parametrize(
    "text", ["example.com:9377", "127.0.0.2:9377", "127.0.0.1", "127.0.0.1:70000", ":9377"]
)
def test_other_binds_are_refused(text: str) -> None:
    with pytest.raises(NonLoopbackBindError):
        parse_bind(text)
