"""WorkflowClient against real servers, server logs, the renewer and a lost server lease."""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import stat
import threading
import time
from pathlib import Path

import pytest

from pi_workflows import (
    HostUnavailableError,
    PackageMismatchError,
    WorkflowClient,
    WorkflowServer,
)
from pi_workflows.server._logging import PrivateRotatingFileHandler
from pi_workflows.wire.framing import encode_frame
from tests.conftest import Processes

pytestmark = pytest.mark.timeout(90)


def test_no_server_and_no_autostart_is_one_clear_unavailable_error(state_dir: Path) -> None:
    client = WorkflowClient(state_dir, autostart=False)
    with pytest.raises(HostUnavailableError, match="not running"):
        client.call("server.status")


def test_a_server_of_another_version_is_refused(short_tmp: Path) -> None:
    state_dir = short_tmp / "workflows"
    (state_dir / "host").mkdir(parents=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(state_dir / "host" / "host.sock"))
    listener.listen(1)

    def other_version() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.sendall(
                encode_frame(
                    {
                        "schema": "pi-workflows.client.v1",
                        "type": "hello",
                        "connectionId": "connection-1",
                        "packageVersion": "99.0.0",
                    }
                )
            )
            connection.recv(1)

    peer = threading.Thread(target=other_version, daemon=True)
    peer.start()
    try:
        with pytest.raises(PackageMismatchError, match=r"99\.0\.0"):
            WorkflowClient(state_dir, autostart=False, timeout=5).connect()
    finally:
        listener.close()
        peer.join(5)


def test_client_reconnects_once_after_the_server_restarts(state_dir: Path) -> None:
    first = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=False)
    first.start()
    client = WorkflowClient(state_dir, autostart=False, timeout=10)
    try:
        epoch = client.call("server.status")["receipt"]["epoch"]
        first.stop("restart")
        second = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=False)
        second.start()
        try:
            again = client.call("server.status")["receipt"]
            assert again["epoch"] == epoch + 1
        finally:
            second.stop("teardown")
    finally:
        client.close()
        first.stop("teardown")


def test_autostart_runs_server_start(processes: Processes, state_dir: Path) -> None:
    with WorkflowClient(state_dir, autostart=True, timeout=20) as client:
        status = client.call("server.status")["receipt"]
        assert status["state"] == "running"
        processes.adopt(int((state_dir / "host" / "server.lock").read_text().strip()))
        client.call("server.stop")


def test_logs_are_private_bounded_json_lines_without_secrets(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    run_id = client.call(
        "run.start",
        {"workflow": "hello", "input": {"secret": "hunter2"}, "projectPath": str(project)},
    )["receipt"]["runId"]
    client.call("run.pause", run_id=run_id)
    client.send_raw(b"garbage\n")  # a rejected connection is logged
    claim = server._server_claim
    assert claim is not None
    server.stop("test")
    log_file = server.state_dir / "logs" / "server.log"
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    text = log_file.read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    actions = {line.get("action") for line in lines}
    assert {"server.started", "server.stopping", "connection.rejected"} <= actions
    assert claim.token not in text
    assert "hunter2" not in text and str(project) not in text


def test_claim_renewer_keeps_the_server_lease_alive(server: WorkflowServer) -> None:
    database = sqlite3.connect(f"file:{server.state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        query = "SELECT heartbeat_at FROM server_lease WHERE singleton = 1"
        first = database.execute(query).fetchone()[0]
        deadline = time.monotonic() + 20
        # No event marks a renewal in another thread's transaction: poll the file.
        while database.execute(query).fetchone()[0] <= first:
            assert time.monotonic() < deadline, "the renewer never renewed the server lease"
            server.wait(0.1)
    finally:
        database.close()


def test_a_server_whose_lease_was_taken_stops_instead_of_writing(server: WorkflowServer) -> None:
    database = sqlite3.connect(str(server.state_dir / "state.sqlite"))
    try:
        with database:
            database.execute("UPDATE server_lease SET epoch = epoch + 1 WHERE singleton = 1")
    finally:
        database.close()
    assert server.wait(30), "the old-epoch server kept running"
    assert server.stop_reason is not None and "lease lost" in server.stop_reason


def test_rotated_log_files_stay_private(short_tmp: Path) -> None:
    handler = PrivateRotatingFileHandler(short_tmp / "server.log", maxBytes=200, backupCount=2)
    logger = logging.getLogger("pi_workflows.test_rotation")
    logger.addHandler(handler)
    try:
        for index in range(20):
            logger.warning("line %d with some padding to force a rotation", index)
    finally:
        logger.removeHandler(handler)
        handler.close()
    files = sorted(short_tmp.glob("server.log*"))
    assert len(files) == 3
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in files)


def test_server_start_creates_private_folders(processes: Processes, short_tmp: Path) -> None:
    state_dir = short_tmp / "fresh" / "agent" / "workflows"
    started = processes.cli(state_dir, "server", "start")
    assert started.returncode == 0, started.stderr
    processes.adopt(int((state_dir / "host" / "server.lock").read_text().strip()))
    for folder in (state_dir, state_dir / "logs", state_dir / "host"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    processes.cli(state_dir, "server", "stop")
