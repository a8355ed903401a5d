"""Run-list subscriptions: revisioned snapshots, drain before the next one, slow readers."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.wire.framing import SocketFrameReader, encode_frame

pytestmark = pytest.mark.timeout(90)


def _request(operation: str, payload: dict[str, Any], key: str) -> bytes:
    return encode_frame(
        {
            "schema": "pi-workflows.client.v1",
            "type": "request",
            "requestId": f"r-{key}",
            "clientId": "subscriber",
            "operation": operation,
            "idempotencyKey": key,
            "payload": payload,
        }
    )


def _start_run(client: WorkflowClient, project: Path, index: int) -> None:
    client.call(
        "run.start", {"workflow": "hello", "input": {"i": index}, "projectPath": str(project)}
    )


def test_subscription_sends_a_snapshot_and_then_each_new_revision(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    with WorkflowClient(server.state_dir, autostart=False) as watcher:
        answer = watcher.call("view.subscribe", {"kind": "runList"})
        subscription = answer["receipt"]["subscriptionId"]
        assert answer["receipt"]["kind"] == "runList"
        first = watcher.read_message()
        assert first is not None and first["type"] == "event"
        assert first["subscriptionId"] == subscription
        assert first["payload"]["schema"] == "pi-workflows.run-list-page.v1"
        assert first["payload"]["items"] == []
        _start_run(client, project, 1)
        second = watcher.read_message()
        assert second is not None
        assert second["revision"] > first["revision"]
        assert len(second["payload"]["items"]) == 1
        removed = watcher.call("view.unsubscribe", {"subscriptionId": subscription})
        assert removed["outcome"] == "accepted"
        again = watcher.request("view.unsubscribe", {"subscriptionId": subscription})
        assert again["outcome"] == "notFound"


def test_an_unknown_view_is_rejected(client: WorkflowClient) -> None:
    answer = client.request("view.subscribe", {"kind": "everything"})
    assert answer["outcome"] == "rejected"


def test_a_stalled_subscriber_holds_one_pending_snapshot_and_delays_nobody(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.settimeout(30)
    stalled.connect(str(server.socket_path))
    reader = SocketFrameReader(stalled)
    try:
        assert reader.read_message() is not None  # hello
        stalled.sendall(_request("view.subscribe", {"kind": "runList"}, "sub-1"))
        # From here on the stalled client reads nothing while the run list changes.
        listener = server._listener
        assert listener is not None
        subscriptions = server._subscriptions
        assert subscriptions is not None
        most_pending = 0
        runs = 0
        skipped = 0
        # Change the list until the stalled socket is full and polls start coalescing.
        while skipped == 0 and runs < 2000:
            for _ in range(20):
                _start_run(client, project, runs)
                runs += 1
                for connection in list(listener._connections):
                    most_pending = max(most_pending, len(connection._events))
            skipped = subscriptions.proxy().snapshots_skipped_undrained.get(timeout=5)
        assert skipped > 0, "snapshots kept being built for a blocked connection"
        assert most_pending <= 1, "at most one buffered snapshot per subscription"
        # Nobody waits for the stalled subscriber: with its socket full, another client's
        # commands are still answered (a blocked server would time the client out; how
        # fast they are answered depends on the machine's load, which is not the point).
        for _ in range(5):
            _start_run(client, project, runs)
            runs += 1
        assert client.call("server.status")["outcome"] == "accepted"
        # Reading again, the subscriber catches up to the newest revision, coalesced.
        final_revision = client.call("run.list")["revision"]
        revisions: list[int] = []
        while True:
            message = reader.read_message()
            assert message is not None
            if message["type"] != "event":
                continue
            revisions.append(message["revision"])
            if message["revision"] == final_revision:
                assert len(message["payload"]["items"]) == min(runs, 256)
                break
        # Live views refresh on each commit, so a reader that keeps up may see every
        # revision; a stalled one never gets a stale or repeated one, nor more than one
        # event per change.
        assert revisions == sorted(set(revisions)), "each event is newer than the last"
        assert len(revisions) <= runs + 1, "the first snapshot, then at most one per change"
    finally:
        stalled.close()
