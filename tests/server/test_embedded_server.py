"""The embedded server over its real Unix socket: hello, operations, receipts, bad input."""

from __future__ import annotations

import contextlib
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import HostUnavailableError, WorkflowClient, WorkflowServer
from pi_workflows._version import __version__
from pi_workflows.storage import ManualClock, list_runs, open_database
from pi_workflows.wire.framing import MAX_FRAME_BYTES, SocketFrameReader, encode_frame

pytestmark = pytest.mark.timeout(60)


def _start(client: WorkflowClient, project: Path, key: str | None = None) -> dict[str, Any]:
    return dict(
        client.call(
            "run.start",
            {"workflow": "hello", "input": {"n": 1}, "projectPath": str(project)},
            idempotency_key=key,
        )
    )


def _raw_connection(server: WorkflowServer) -> tuple[socket.socket, SocketFrameReader]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(server.socket_path))
    reader = SocketFrameReader(sock)
    return sock, reader


def test_server_sends_hello_first(server: WorkflowServer) -> None:
    sock, reader = _raw_connection(server)
    with sock:
        hello = reader.read_message()
    assert hello is not None
    assert hello["type"] == "hello"
    assert hello["schema"] == "pi-workflows.client.v1"
    assert hello["packageVersion"] == __version__
    assert hello["connectionId"].startswith("connection-")


def test_state_folders_and_socket_are_private(server: WorkflowServer) -> None:
    assert stat.S_IMODE(server.socket_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(server.host_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(server.state_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((server.state_dir / "state.sqlite").stat().st_mode) == 0o600


def test_server_status_reports_exactly_the_safe_keys(client: WorkflowClient) -> None:
    status = client.call("server.status")["receipt"]
    assert set(status) == {
        "state",
        "epoch",
        "pid",  # the server's process ID (an operator's fact, no user data)
        "socket",
        "activeRunners",
        "runs",
        "expiredClaims",
        "pendingInteractions",
        "ambiguousEffects",
    }
    assert set(status["runs"]) == {"queued", "running", "parked", "waiting"}
    assert status["state"] == "running"
    assert status["epoch"] >= 1


def test_run_lifecycle_through_commands(client: WorkflowClient, project: Path) -> None:
    started = _start(client, project)
    run_id = started["receipt"]["runId"]
    assert started["outcome"] == "accepted"
    assert client.call("run.get", run_id=run_id)["receipt"]["display"]["status"] == "queued"
    listed = client.call("run.list")["receipt"]
    assert [item["runId"] for item in listed["items"]] == [run_id]

    client.call("run.pause", run_id=run_id)
    assert client.call("run.get", run_id=run_id)["receipt"]["display"]["status"] == "paused"
    client.call("run.resume", run_id=run_id)
    assert client.call("run.get", run_id=run_id)["receipt"]["display"]["status"] == "queued"
    client.call("run.cancel", run_id=run_id)
    view = client.call("run.get", run_id=run_id)["receipt"]
    assert view["display"]["status"] == "cancelled"

    restarted = client.call("run.restart", run_id=run_id)["receipt"]
    assert restarted["restartOf"] == run_id
    assert client.call("run.get", run_id=restarted["runId"])["receipt"]["restartOf"] == run_id
    status = client.call("server.status")["receipt"]
    assert status["runs"]["queued"] == 1


def test_retry_with_a_new_request_id_adopts_the_receipt(
    client: WorkflowClient, project: Path
) -> None:
    first = _start(client, project, key="start-once")
    again = _start(client, project, key="start-once")
    assert first["outcome"] == "accepted"
    assert again["outcome"] == "adopted"
    assert again["receipt"] == first["receipt"]
    assert len(client.call("run.list")["receipt"]["items"]) == 1


def test_same_key_with_another_payload_is_a_conflict(client: WorkflowClient, project: Path) -> None:
    _start(client, project, key="key-1")
    other = client.request(
        "run.start",
        {"workflow": "hello", "input": {"n": 2}, "projectPath": str(project)},
        idempotency_key="key-1",
    )
    assert other["outcome"] == "conflict"
    assert len(client.call("run.list")["receipt"]["items"]) == 1


def test_rejections_commit_no_run(client: WorkflowClient, project: Path) -> None:
    missing = client.request("run.start", {"workflow": "absent", "projectPath": str(project)})
    assert missing["outcome"] == "rejected"
    assert missing["error"]["code"] == "workflowNotFound"
    assert client.call("run.list")["receipt"]["items"] == []
    unknown = client.request("run.teleport", {})
    assert unknown["outcome"] == "rejected"
    gone = client.request("run.pause", {}, run_id="run-absent")
    assert gone["outcome"] == "notFound"


def test_pausing_a_terminal_run_is_rejected(client: WorkflowClient, project: Path) -> None:
    run_id = _start(client, project)["receipt"]["runId"]
    client.call("run.cancel", run_id=run_id)
    answer = client.request("run.pause", run_id=run_id)
    assert answer["outcome"] == "rejected"
    assert answer["error"]["code"] == "invalidTransition"


@pytest.mark.parametrize(
    "bad_bytes",
    [
        b"not json\n",
        b'{"type": "request"}\n',
        b'{"schema":"pi-workflows.client.v1","type":"request","unknown":1}\n',
        b"x" * (MAX_FRAME_BYTES + 10),
        b'{"a":1,"a":2}\n',
    ],
    ids=["invalid-json", "non-canonical", "unknown-field", "oversized", "duplicate-key"],
)
def test_bad_input_closes_only_that_connection(
    server: WorkflowServer, client: WorkflowClient, bad_bytes: bytes
) -> None:
    sock, reader = _raw_connection(server)
    with sock:
        assert reader.read_message() is not None  # hello
        # The server may close while an oversized frame is still arriving.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(bad_bytes)
        try:
            closed = reader.read_message() is None
        except ConnectionResetError:
            closed = True
        assert closed
    assert client.call("server.status")["outcome"] == "accepted"
    assert server.running


def test_clients_may_only_send_requests(server: WorkflowServer, client: WorkflowClient) -> None:
    sock, reader = _raw_connection(server)
    with sock:
        assert reader.read_message() is not None
        hello = {
            "connectionId": "c",
            "packageVersion": "0",
            "schema": "pi-workflows.client.v1",
            "type": "hello",
        }
        sock.sendall(encode_frame(hello))
        assert reader.read_message() is None
    assert client.call("server.status")["outcome"] == "accepted"


def test_an_actor_failure_stops_the_server_and_says_why(server: WorkflowServer) -> None:
    scheduler = server._scheduler
    assert scheduler is not None
    scheduler.tell("not a scheduler message")  # a raise in a tell handler kills the actor
    assert server.wait(20)
    assert server.stop_reason is not None and "scheduler" in server.stop_reason
    assert not server.socket_path.exists()


def test_stop_waits_for_in_flight_commands(server: WorkflowServer, project: Path) -> None:
    results: list[dict[str, Any]] = []
    first_answer = threading.Event()

    def start_many() -> None:
        with WorkflowClient(server.state_dir, autostart=False, timeout=10) as own:
            for index in range(20):
                try:
                    answer = own.request(
                        "run.start",
                        {"workflow": "hello", "input": {"i": index}, "projectPath": str(project)},
                    )
                except HostUnavailableError:
                    return  # the server finished stopping
                results.append(dict(answer))
                first_answer.set()
                if answer["outcome"] == "unavailable":
                    return

    worker = threading.Thread(target=start_many)
    worker.start()
    assert first_answer.wait(20)
    server.stop("test")
    worker.join(20)
    accepted = [r for r in results if r["outcome"] == "accepted"]
    assert accepted, "some commands were answered before the stop"
    # Every accepted answer had its receipt committed: reopen and count.
    with open_database(server.state_dir / "state.sqlite") as db:
        stored = {run.run_id for run in list_runs(db, limit=1000)}
    assert {r["receipt"]["runId"] for r in accepted} <= stored


def test_idle_server_exits_after_its_idle_period(state_dir: Path) -> None:
    instance = WorkflowServer(state_dir, idle_exit_s=0.3, tick_s=0.05, execute_runs=False)
    instance.start()
    try:
        assert instance.wait(20)
        assert instance.stop_reason == "idle"
    finally:
        instance.stop("teardown")


def _advance_until_stopped(instance: WorkflowServer, clock: ManualClock) -> None:
    """Move the manual clock in small steps until the server stops on its own.

    The idle period starts when the server first sees itself idle, which a loaded machine
    may delay, so one big jump could come too early. Each step is far inside the 15 s
    lease the renewer keeps extending on this clock.
    """
    deadline = time.monotonic() + 30
    while not instance.wait(0.1):
        assert time.monotonic() < deadline, "advancing the clock never ended the idle period"
        clock.advance(250)


IDLE_S = 4
"""The idle period of the manual-clock servers (well inside their 15 s lease)."""


def _manual_server(state_dir: Path) -> tuple[WorkflowServer, ManualClock]:
    clock = ManualClock()
    instance = WorkflowServer(
        state_dir, idle_exit_s=IDLE_S, tick_s=0.05, execute_runs=False, clock=clock
    )
    instance.start()
    return instance, clock


def test_idle_exit_reads_the_injectable_clock(state_dir: Path) -> None:
    instance, clock = _manual_server(state_dir)
    try:
        assert not instance.wait(0.3), "the period has not passed on the manual clock"
        _advance_until_stopped(instance, clock)
        assert instance.stop_reason == "idle"
        assert clock.monotonic_ms() >= IDLE_S * 1000, "the period ended on the manual clock"
    finally:
        instance.stop("teardown")


# With the manual clock, the idle period cannot end before the test's client connects,
# however slowly a loaded machine runs the test.


def test_a_connected_client_keeps_the_server_awake(state_dir: Path) -> None:
    instance, clock = _manual_server(state_dir)
    try:
        with WorkflowClient(state_dir, autostart=False) as connected:
            assert connected.call("server.status")["outcome"] == "accepted"
            clock.advance(IDLE_S * 1000 + 1)  # the idle period passes while connected
            assert not instance.wait(0.5)
            assert connected.call("server.status")["outcome"] == "accepted"
        _advance_until_stopped(instance, clock)  # and starts once it left
        assert instance.stop_reason == "idle"
    finally:
        instance.stop("teardown")


def test_queued_work_keeps_the_server_awake(state_dir: Path, project: Path) -> None:
    instance, clock = _manual_server(state_dir)
    try:
        with WorkflowClient(state_dir, autostart=False) as connected:
            _start(connected, project)
        deadline = time.monotonic() + 30
        while clock.monotonic_ms() <= 2 * IDLE_S * 1000:  # two idle periods, in small steps
            assert not instance.wait(0.1), "a queued run keeps the server up"
            assert time.monotonic() < deadline
            clock.advance(250)
        assert not instance.wait(0.3)
        assert instance.running
    finally:
        instance.stop("teardown")
