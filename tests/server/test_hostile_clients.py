"""Hostile clients (issue 11): descriptor exhaustion, silent connections, the connection
cap, malformed-frame floods, SIGHUP, bounded output, and stalled subscribers.

Real parts: server processes started through the CLI (under `setrlimit` where the test
is about descriptors) or embedded, raw Unix-socket clients, the rotated logs on disk.
Floods are bounded: small sizes here, the big ones in benchmarks/bench_hostile_clients.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.actors._subscriptions import MAX_SUBSCRIPTIONS_PER_CONNECTION, event_frame
from pi_workflows.wire._listener import ConnectionLimits
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.client import HostUnavailableError
from pi_workflows.wire.framing import SocketFrameReader, encode_frame
from pi_workflows.wire.protocol import CLIENT_SCHEMA
from tests.conftest import Processes, write_workflow

pytestmark = pytest.mark.timeout(180)

IDLE_CONNECTIONS = 1_000
SERVER_NOFILE = 256
MALFORMED_FRAMES = 2_000


# --- helpers ----------------------------------------------------------------------------


def _limit_descriptors(soft: int, hard: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextlib.contextmanager
def server_process(
    state_dir: Path, nofile: tuple[int, int] | None = None, **env: str
) -> Iterator[subprocess.Popen[str]]:
    """`server run --no-execute` as a child (optionally under a descriptor limit)."""
    environment = dict(os.environ, PI_CODING_AGENT_DIR=str(state_dir.parent), **env)
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pi_workflows.cli",
            "--state-dir",
            str(state_dir),
            "server",
            "run",
            "--idle-exit",
            "0",
            "--no-execute",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        preexec_fn=(lambda: _limit_descriptors(*nofile)) if nofile else None,  # noqa: PLW1509
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert "running" in line, f"server did not start: {line!r}"
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(20)


def stop_gracefully(child: subprocess.Popen[str]) -> None:
    child.send_signal(signal.SIGTERM)
    assert child.wait(60) == 0


def log_bytes(state_dir: Path) -> int:
    logs = state_dir / "logs"
    return sum(path.stat().st_size for path in logs.glob("server.*") if path.is_file())


def log_lines(state_dir: Path) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for path in sorted((state_dir / "logs").glob("server.log*")):
        lines.extend(json.loads(line) for line in path.read_text().splitlines())
    return lines


def rejection_summaries(state_dir: Path) -> list[dict[str, Any]]:
    return [line for line in log_lines(state_dir) if line.get("action") == "connection.rejected"]


def connect_when_queued(path: Path, timeout: float = 30) -> socket.socket:
    """A raw connection; while the accept queue is full (EAGAIN), try again."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock.connect(str(path))
            return sock
        except BlockingIOError:
            assert time.monotonic() < deadline, "the accept queue never had room"
            threading.Event().wait(0.005)


def raw_connect(path: Path, timeout: float = 30) -> tuple[socket.socket, SocketFrameReader]:
    sock = connect_when_queued(path, timeout)
    return sock, SocketFrameReader(sock)


def request_frame(operation: str, key: str, payload: dict[str, Any] | None = None) -> bytes:
    return encode_frame(
        {
            "schema": CLIENT_SCHEMA,
            "type": "request",
            "requestId": f"r-{key}",
            "clientId": "hostile-test",
            "operation": operation,
            "idempotencyKey": key,
            "payload": payload or {},
        }
    )


def read_refusal(reader: SocketFrameReader) -> dict[str, Any]:
    """The `unavailable` event a refused connection gets, then its end of stream."""
    while True:
        message = reader.read_message()
        assert message is not None, "closed without saying why"
        if message["type"] == "event" and message["kind"] == "unavailable":
            assert reader.read_message() is None, "the refused connection is closed"
            return message


def wait_until(condition: Any, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        pause.wait(0.02)


@pytest.fixture
def many_descriptors() -> None:
    """This test process holds about a thousand sockets: raise its own soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = IDLE_CONNECTIONS + 200
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard descriptor limit {hard} is below {wanted}")
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


# --- connections ------------------------------------------------------------------------


@pytest.mark.usefixtures("many_descriptors")
def test_a_thousand_idle_connections_under_256_descriptors_leave_a_client_served(
    state_dir: Path,
) -> None:
    # A first-frame deadline longer than the hold: on a slow machine the thousand
    # connects can outlast the default 10 s, and then the oldest are closed for their
    # deadline, not evicted (that deadline has its own test below).
    with server_process(
        state_dir, nofile=(SERVER_NOFILE, SERVER_NOFILE), PI_WORKFLOWS_FIRST_FRAME_SECONDS="300"
    ) as child:
        socket_path = state_dir / "host" / "host.sock"
        before = log_bytes(state_dir)
        held: list[socket.socket] = []
        try:
            for _ in range(IDLE_CONNECTIONS):  # connect and never send
                held.append(connect_when_queued(socket_path))
            # All thousand are still open on this side: a new, well-behaved client is served.
            with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
                for _ in range(5):
                    assert client.call("server.status")["outcome"] == "accepted"
            with WorkflowClient(state_dir, autostart=False, timeout=30) as again:
                assert again.call("server.status")["outcome"] == "accepted"
            server = psutil.Process(child.pid)
            assert server.num_fds() < SERVER_NOFILE, "the server never ran out of descriptors"
            # The oldest silent connections made room for newer ones: each was told why.
            told = 0
            for sock in held[:50]:
                if read_refusal(SocketFrameReader(sock))["payload"]["code"] == "tooManyConnections":
                    told += 1
            assert told == 50
        finally:
            for sock in held:
                sock.close()
        stop_gracefully(child)
    assert log_bytes(state_dir) - before <= 1_048_576, "the hold adds at most 1 MiB of logs"
    summaries = rejection_summaries(state_dir)
    cap = ConnectionLimits().cap(SERVER_NOFILE)
    assert sum(line["count"] for line in summaries) >= IDLE_CONNECTIONS - cap
    assert len(summaries) <= 20, "rejections are summarised, not logged one by one"
    assert not [
        line for line in log_lines(state_dir) if line.get("action") == "listener.loop_error"
    ]


def test_a_burst_accepted_in_one_batch_evicts_older_silent_slots_and_serves_the_newest(
    state_dir: Path,
) -> None:
    """Slots admitted in one accept batch are evictable before their tasks have run.

    The server is stopped while the connections queue, so one batch admits far more
    than the cap before any connection object exists: the newest is still served.
    """
    queued = 100
    with server_process(state_dir, PI_WORKFLOWS_MAX_CONNECTIONS="4") as child:
        socket_path = state_dir / "host" / "host.sock"
        held: list[socket.socket] = []
        child.send_signal(signal.SIGSTOP)
        try:
            try:
                for _ in range(queued):
                    held.append(connect_when_queued(socket_path))
                newest = held[-1]
                newest.sendall(request_frame("server.status", "newest"))
            finally:
                child.send_signal(signal.SIGCONT)
            reader = SocketFrameReader(newest)
            hello = reader.read_message()
            assert hello is not None and hello["type"] == "hello"
            response = reader.read_message()
            assert response is not None and response["type"] == "response", response
            assert response["outcome"] == "accepted"
            refusal = read_refusal(SocketFrameReader(held[0]))
            assert refusal["payload"]["code"] == "tooManyConnections"
        finally:
            for sock in held:
                sock.close()
        stop_gracefully(child)


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one_at_start(state_dir: Path) -> None:
    with server_process(state_dir, nofile=(256, 512)) as child:
        soft, hard = psutil.Process(child.pid).rlimit(psutil.RLIMIT_NOFILE)
        assert (soft, hard) == (512, 512)
        stop_gracefully(child)


def test_a_connection_that_sends_nothing_is_closed_at_the_first_frame_deadline(
    state_dir: Path,
) -> None:
    limits = ConnectionLimits(first_frame_s=0.5)
    with WorkflowServer(
        state_dir, idle_exit_s=None, execute_runs=False, connection_limits=limits
    ) as server:
        talker, talker_reader = raw_connect(server.socket_path)
        silent, silent_reader = raw_connect(server.socket_path)
        try:
            assert talker_reader.read_message() is not None  # hello
            talker.sendall(request_frame("server.status", "first"))
            answer = talker_reader.read_message()
            assert answer is not None and answer["outcome"] == "accepted"
            hello = silent_reader.read_message()
            assert hello is not None and hello["type"] == "hello"
            refusal = read_refusal(silent_reader)  # the silent one is closed with a reason
            assert refusal["subscriptionId"] == hello["connectionId"]
            assert refusal["payload"]["code"] == "firstFrameTimeout"
            # The deadline is for the first frame only: the talker, connected before the
            # silent one was refused, may stay quiet after its first request.
            talker.sendall(request_frame("server.status", "second"))
            answer = talker_reader.read_message()
            assert answer is not None and answer["outcome"] == "accepted"
        finally:
            talker.close()
            silent.close()
    assert "firstFrameTimeout=1" in rejection_summaries(state_dir)[-1]["reason"]


def test_at_the_cap_a_silent_connection_makes_room_and_otherwise_a_client_is_refused(
    state_dir: Path,
) -> None:
    limits = ConnectionLimits(max_connections=3)
    with WorkflowServer(
        state_dir, idle_exit_s=None, execute_runs=False, connection_limits=limits
    ) as server:
        clients = [WorkflowClient(state_dir, autostart=False, timeout=20) for _ in range(3)]
        try:
            for client in clients:
                client.call("server.status")  # each has sent a frame: none can be evicted
            with pytest.raises(HostUnavailableError, match="connection limit"):
                WorkflowClient(state_dir, autostart=False, timeout=20).connect()
            clients.pop().close()
            wait_until(
                lambda: server._listener is not None and server._listener.connection_count == 2,
                what="the close",
            )
            silent, silent_reader = raw_connect(server.socket_path)
            try:
                assert silent_reader.read_message() is not None  # admitted: hello only
                wait_until(
                    lambda: server._listener is not None and server._listener.connection_count == 3,
                    what="the admission",
                )
                with WorkflowClient(state_dir, autostart=False, timeout=20) as newcomer:
                    assert newcomer.call("server.status")["outcome"] == "accepted"
                refusal = read_refusal(silent_reader)
                assert refusal["payload"]["code"] == "tooManyConnections"
            finally:
                silent.close()
            for client in clients:  # the established clients were never touched
                assert client.call("server.status")["outcome"] == "accepted"
        finally:
            for client in clients:
                client.close()
    reasons = rejection_summaries(state_dir)[-1]["reason"]
    assert "connectionLimit=1" in reasons and "evictedSilent=1" in reasons


def test_a_bad_connection_limit_setting_stops_the_start_with_a_clear_error(
    processes: Processes, state_dir: Path
) -> None:
    env = dict(
        os.environ, PI_CODING_AGENT_DIR=str(state_dir.parent), PI_WORKFLOWS_MAX_CONNECTIONS="0"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pi_workflows.cli", "--state-dir", str(state_dir), "server", "run"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 1
    assert "PI_WORKFLOWS_MAX_CONNECTIONS must be a positive number" in result.stderr


# --- log flood --------------------------------------------------------------------------


def test_two_thousand_malformed_frames_write_a_bounded_number_of_log_lines(
    state_dir: Path,
) -> None:
    with server_process(state_dir) as child:
        socket_path = state_dir / "host" / "host.sock"
        started = time.monotonic()
        for index in range(MALFORMED_FRAMES):
            sock, reader = raw_connect(socket_path)
            with sock:
                assert reader.read_message() is not None  # hello
                sock.sendall(b"{not json %d}\n" % index)
                with contextlib.suppress(OSError):
                    while reader.read_message() is not None:
                        pass
        elapsed = time.monotonic() - started
        stop_gracefully(child)
    summaries = rejection_summaries(state_dir)
    assert sum(line["count"] for line in summaries) == MALFORMED_FRAMES
    assert all(
        set(line["reason"].split("=")[0].split(",")) <= {"MalformedFrameError"}
        for line in summaries
    )
    # One summary per 10 s interval, plus the one flushed at stop.
    assert len(summaries) <= elapsed / 10 + 2
    assert len(log_lines(state_dir)) <= len(summaries) + 20, "no line per bad frame"


# --- SIGHUP and output ------------------------------------------------------------------


def test_sighup_stops_a_detached_server_gracefully(processes: Processes, state_dir: Path) -> None:
    started = processes.cli(state_dir, "server", "start")
    assert started.returncode == 0, started.stderr
    pid = int((state_dir / "host" / "server.lock").read_text().strip())
    processes.adopt(pid)
    server = psutil.Process(pid)
    os.kill(pid, signal.SIGHUP)
    server.wait(60)
    stopping = [line for line in log_lines(state_dir) if line.get("action") == "server.stopping"]
    assert [line["reason"] for line in stopping] == ["signal SIGHUP"]
    # A graceful stop's marks: the socket is removed and the lock file emptied.
    assert not (state_dir / "host" / "host.sock").exists()
    assert (state_dir / "host" / "server.lock").read_text().strip() == ""


OUTPUT_CHILD = r"""
import os, sys
from pathlib import Path
from pi_workflows.server._logging import redirect_output
path = Path(sys.argv[1])
redirect_output(path)
for _ in range(3000):
    print("x" * 1023)
sys.stderr.write("last python line\n")
os.write(2, b"written below python\n")
"""


def test_a_detached_servers_output_rotates_at_its_bound(short_tmp: Path) -> None:
    path = short_tmp / "server.out"
    with path.open("wb") as out:
        subprocess.run(
            [sys.executable, "-c", OUTPUT_CHILD, str(path)],
            stdout=out,
            stderr=out,
            timeout=60,
            check=True,
        )
    rotated = path.with_name("server.out.1")
    assert path.stat().st_size <= 1_048_576 + 100
    assert rotated.stat().st_size <= 1_048_576
    tail = path.read_text()
    assert tail.endswith("last python line\nwritten below python\n"), "fd 2 follows the rotation"
    assert path.stat().st_mode & 0o777 == 0o600


# --- fan-out ----------------------------------------------------------------------------

STALLED = 30
BURST = 100


def _stalled_subscriber(socket_path: Path, index: int) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(str(socket_path))
    sock.sendall(request_frame("view.subscribe", f"stalled-{index}", {"kind": "runList"}))
    return sock  # never read from here on, until the test says so


def test_stalled_subscribers_coalesce_and_never_delay_commands(
    state_dir: Path, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "hello")
    with WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=False) as server:
        subscriptions = server._subscriptions
        listener = server._listener
        assert subscriptions is not None and listener is not None
        stalled = [_stalled_subscriber(server.socket_path, index) for index in range(STALLED)]
        try:
            with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
                first_revision = client.call("run.list")["revision"]
                wait_until(lambda: listener.connection_count == STALLED + 1, what="subscribers")
                most_pending = 0
                for index in range(BURST):  # every command is answered, within its timeout
                    answer = client.call(
                        "run.start",
                        {"workflow": "hello", "input": {"i": index}, "projectPath": str(project)},
                    )
                    assert answer["outcome"] == "accepted"
                    for connection in list(listener._connections):
                        most_pending = max(most_pending, len(connection._events))
                final_revision = client.call("run.list")["revision"]
            proxy = subscriptions.proxy()
            built = proxy.pages_built.get(timeout=10)
            # One read builds the page for all 30 subscribers: at most one page per revision.
            assert built <= final_revision - first_revision + 1
            assert most_pending <= 1, "a blocked connection holds one pending snapshot"
            assert proxy.snapshots_skipped_undrained.get(timeout=10) > 0, "stalled ones coalesced"
            # Reading again, every stalled subscriber catches up to the newest revision, each
            # event newer than the last.
            for sock in stalled:
                reader = SocketFrameReader(sock)
                revisions: list[int] = []
                while not revisions or revisions[-1] != final_revision:
                    message = reader.read_message()
                    assert message is not None
                    if message["type"] == "event":
                        revisions.append(message["revision"])
                assert revisions == sorted(set(revisions))
                assert len(revisions) <= BURST + 1
        finally:
            for sock in stalled:
                sock.close()


def test_a_connection_holds_a_bounded_number_of_subscriptions(
    state_dir: Path,
) -> None:
    with (
        WorkflowServer(state_dir, idle_exit_s=None, execute_runs=False),
        WorkflowClient(state_dir, autostart=False, timeout=20) as client,
    ):
        for _ in range(MAX_SUBSCRIPTIONS_PER_CONNECTION):
            assert client.call("view.subscribe", {"kind": "runList"})["outcome"] == "accepted"
        refused = client.request("view.subscribe", {"kind": "runList"})
        assert refused["outcome"] == "rejected"
        assert refused["error"]["code"] == "tooManySubscriptions"


def test_a_shared_event_frame_is_the_canonical_encoding_of_the_event() -> None:
    payload = {"schema": "pi-workflows.run-list-page.v1", "revision": 7, "items": [{"é": 1}]}
    spliced = event_frame("runList", "sub-1", 7, dumps(payload))
    whole = encode_frame(
        {
            "schema": CLIENT_SCHEMA,
            "type": "event",
            "subscriptionId": "sub-1",
            "kind": "runList",
            "revision": 7,
            "payload": payload,
        }
    )
    assert spliced == whole
