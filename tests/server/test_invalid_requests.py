"""A request whose envelope would be invalid fails in the client, before it is sent.

Issue 13, item 7 (last bullet). The server closes a connection on an invalid envelope;
`WorkflowClient` checks each attempt against `client.v1` first and raises
`InvalidRequestError` naming the field, so the CLI prints that and exits 2 (bad input)
instead of reporting a lost server. Nothing is sent and no server is started for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pi_workflows import InvalidRequestError, WorkflowClient, WorkflowServer
from tests.conftest import Processes

pytestmark = pytest.mark.timeout(90)

EXIT_USAGE = 2


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"run_id": ""}, "runId", "the run ID is invalid"),
        ({"run_id": "r" * 300}, "runId", "the run ID is invalid"),
        ({"run_id": "run-1\n"}, "runId", "the run ID is invalid"),
        ({"idempotency_key": ""}, "idempotencyKey", "the idempotency key is invalid"),
        ({"idempotency_key": "k" * 257}, "idempotencyKey", "the idempotency key is invalid"),
        ({"expected_revision": -1}, "expectedRevision", "the expected revision is invalid"),
    ],
)
def test_the_client_refuses_an_invalid_envelope_and_keeps_its_connection(
    client: WorkflowClient, options: dict[str, Any], field: str, words: str
) -> None:
    connection = client.connection_id
    with pytest.raises(InvalidRequestError) as caught:
        client.request("run.get", **options)
    assert caught.value.field == field
    assert str(caught.value).startswith(words)
    assert "'run.get' request was not sent" in str(caught.value)
    # Nothing reached the server: the same connection still answers.
    assert client.call("server.status")["outcome"] == "accepted"
    assert client.connection_id == connection


def _adopt_started_server(processes: Processes, state_dir: Path) -> None:
    """A server started by mistake (the test fails) is killed at teardown, by its PID."""
    lock = state_dir / "host" / "server.lock"
    text = lock.read_text("ascii").strip() if lock.exists() else ""
    if text.isdigit():
        processes.adopt(int(text))


def test_a_malformed_operation_or_client_id_is_refused_before_connecting(
    processes: Processes, state_dir: Path
) -> None:
    try:
        _refused_before_connecting(state_dir)
    finally:
        _adopt_started_server(processes, state_dir)


def _refused_before_connecting(state_dir: Path) -> None:
    unknown = WorkflowClient(state_dir, autostart=True, timeout=5)
    with pytest.raises(InvalidRequestError) as caught:
        unknown.request("run/explode")  # outside the grammar: the server would close
    assert caught.value.field == "operation"
    long_client = WorkflowClient(state_dir, client_id="c" * 256, autostart=True, timeout=5)
    with pytest.raises(InvalidRequestError) as caught:
        long_client.request("server.status")
    assert caught.value.field == "requestId"  # made from the client ID, so too long
    # Both clients may start a server on demand; an invalid request never does.
    assert not (state_dir / "host" / "host.sock").exists()


def test_a_well_formed_unknown_operation_is_sent_and_rejected_by_name(
    client: WorkflowClient,
) -> None:
    answer = client.request("run.explode")
    assert answer["outcome"] == "rejected"
    assert answer["error"] == {
        "code": "unknownOperation",
        "message": "unknown operation run.explode",
    }


def test_the_cli_prints_the_error_and_exits_2_with_a_server_running(
    server: WorkflowServer, processes: Processes
) -> None:
    for args in (("run", "status", ""), ("run", "cancel", "r" * 300)):
        result = processes.cli(server.state_dir, *args)
        assert result.returncode == EXIT_USAGE, result.stderr
        assert "the run ID is invalid" in result.stderr
        assert "was not sent" in result.stderr
        assert "lost the connection" not in result.stderr
    with WorkflowClient(server.state_dir, autostart=False, timeout=10) as client:
        assert client.call("server.status")["outcome"] == "accepted"


def test_the_cli_starts_no_server_for_an_invalid_request(
    processes: Processes, state_dir: Path
) -> None:
    try:
        result = processes.cli(state_dir, "run", "status", "")
    finally:
        _adopt_started_server(processes, state_dir)
    assert result.returncode == EXIT_USAGE, result.stderr
    assert result.stderr.startswith("pi-workflows: the run ID is invalid")
    assert not (state_dir / "host" / "host.sock").exists()
