"""`WorkflowClient` and `LiveViews` over a `piw serve` URL, through real processes: a
server (`pi-workflows server run`), the relay (`piw serve`) and clients in this process.

Over the relay a client sees what a local one sees (the same revisions and views), its
commands keep their idempotency, a killed server reads as a lost connection and a
restarted one gets the subscriptions again; a relay never starts a server, and a URL to
another machine is refused before anything is sent.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient
from pi_workflows.wire import dumps
from pi_workflows.wire.client import HostUnavailableError, RelayURLError
from pi_workflows.wire.live import LiveViews, ViewKey
from tests.cli.test_relay import WAIT_S, Rig, _start_relay, _start_server
from tests.conftest import Processes, write_workflow

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def rig(processes: Processes, state_dir: Path) -> Rig:
    server = _start_server(processes, state_dir)
    relay, url = _start_relay(processes, state_dir)
    return Rig(state_dir, server, relay, url)


@pytest.fixture
def run_id(rig: Rig, short_tmp: Path) -> str:
    """A queued run (the server executes nothing), so only commands change it."""
    project = short_tmp / "project"
    write_workflow(project, "hello")
    with WorkflowClient(rig.state_dir, autostart=False, timeout=WAIT_S) as local:
        started = local.call(
            "run.start", {"workflow": "hello", "input": {}, "projectPath": str(project)}
        )
    return str(started["receipt"]["runId"])


def _until_revision(live: LiveViews, key: ViewKey, revision: int) -> Any:
    """Apply updates until `live` holds `key` at `revision` or later; return that view."""
    while (live.revision(key) or -1) < revision:
        assert live.next_update(timeout=WAIT_S) is not None, f"no update to {revision}"
    return live.view(key)


def test_a_url_live_view_equals_the_local_one(rig: Rig, run_id: str) -> None:
    key = ViewKey.run(run_id)
    with (
        LiveViews(rig.state_dir, autostart=False, timeout=WAIT_S) as local,
        LiveViews(rig.state_dir, url=rig.url, timeout=WAIT_S) as remote,
        WorkflowClient(rig.state_dir, url=rig.url, timeout=WAIT_S) as commands,
    ):
        local.subscribe(key, timeout=WAIT_S)
        remote.subscribe(key, timeout=WAIT_S)
        first = commands.call("run.get", run_id=run_id)["revision"]
        assert dumps(_until_revision(remote, key, first)) == dumps(
            _until_revision(local, key, first)
        )
        assert remote.revision(key) == local.revision(key)

        for operation, status in (("run.pause", "paused"), ("run.resume", "queued")):
            commands.call(operation, run_id=run_id)
            revision = commands.call("run.get", run_id=run_id)["revision"]  # after the command
            seen_remote = _until_revision(remote, key, revision)
            seen_local = _until_revision(local, key, revision)
            assert remote.revision(key) == local.revision(key) == revision, operation
            assert dumps(seen_remote) == dumps(seen_local), operation
            assert seen_remote["display"]["status"] == status


def test_commands_through_a_url_keep_their_idempotency(rig: Rig, run_id: str) -> None:
    with (
        WorkflowClient(rig.state_dir, url=rig.url, timeout=WAIT_S) as remote,
        WorkflowClient(rig.state_dir, autostart=False, timeout=WAIT_S) as local,
    ):
        status = remote.call("server.status")["receipt"]
        assert status["pid"] == local.call("server.status")["receipt"]["pid"] == rig.server_pid
        first = remote.request("run.pause", run_id=run_id, idempotency_key="pause-once")
        again = remote.request("run.pause", run_id=run_id, idempotency_key="pause-once")
        assert (first["outcome"], again["outcome"]) == ("accepted", "adopted")
        assert again["receipt"] == first["receipt"]
        assert local.call("run.get", run_id=run_id)["receipt"]["display"]["status"] == "paused"
        assert remote.list_runs().items[0]["runId"] == run_id
        assert remote.connections == 1


def test_a_killed_server_is_a_lost_connection_and_a_restart_restores_the_view(
    rig: Rig, run_id: str, processes: Processes
) -> None:
    key = ViewKey.run(run_id)
    with (
        LiveViews(rig.state_dir, url=rig.url, timeout=WAIT_S, reconnect_timeout=120) as live,
        LiveViews(rig.state_dir, url=rig.url, timeout=WAIT_S, reconnect_timeout=1) as brief,
        WorkflowClient(rig.state_dir, url=rig.url, timeout=WAIT_S) as commands,
    ):
        live.subscribe(key, timeout=WAIT_S)
        brief.subscribe(key, timeout=WAIT_S)
        held = commands.call("run.get", run_id=run_id)["revision"]
        _until_revision(live, key, held)
        _until_revision(brief, key, held)

        os.kill(rig.server.pid, signal.SIGKILL)
        rig.server.wait(WAIT_S)

        with pytest.raises(HostUnavailableError, match="unreachable for 1 s"):
            brief.next_update(timeout=WAIT_S)  # lost, and not back within its 1 s
        with pytest.raises(HostUnavailableError, match="cannot start one"):
            commands.call("server.status")  # the relay says why, and starts nothing
        assert live.next_update(timeout=0.5) is None  # still waiting, with backoff
        assert rig.relay.poll() is None

        _start_server(processes, rig.state_dir)
        commands.call("run.pause", run_id=run_id)
        revision = commands.call("run.get", run_id=run_id)["revision"]
        view = _until_revision(live, key, revision)
        assert view["display"]["status"] == "paused"
        assert live.reconnects == 1


def test_a_relay_without_a_server_never_starts_one(processes: Processes, state_dir: Path) -> None:
    _, url = _start_relay(processes, state_dir)
    client = WorkflowClient(state_dir, url=url, autostart=True, timeout=WAIT_S)
    with pytest.raises(HostUnavailableError) as refused:
        client.connect()
    assert "not running" in str(refused.value) and "cannot start one" in str(refused.value)
    assert not (state_dir / "host" / "host.sock").exists()


def test_no_relay_at_the_url_says_what_to_start(state_dir: Path) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # closed again: nothing listens there
    client = WorkflowClient(state_dir, url=f"ws://127.0.0.1:{port}/ws", timeout=WAIT_S)
    with pytest.raises(HostUnavailableError, match=r"no relay answers.*piw serve"):
        client.connect()


def test_a_path_other_than_ws_is_not_a_relay(rig: Rig) -> None:
    client = WorkflowClient(rig.state_dir, url=rig.url.replace("/ws", "/other"), timeout=WAIT_S)
    with pytest.raises(HostUnavailableError, match="not a relay endpoint"):
        client.connect()


@pytest.mark.parametrize(
    "url",
    [
        "ws://192.0.2.1:9377/ws",
        "ws://example.com:9377/ws",
        "ws://0.0.0.0:9377/ws",
        "wss://127.0.0.1:9377/ws",
        "http://127.0.0.1:9377/ws",
        "ws://127.0.0.1/ws",
        "ws://127.0.0.1:99999/ws",
    ],
)
def test_only_a_loopback_ws_url_is_accepted(state_dir: Path, url: str) -> None:
    with pytest.raises(RelayURLError, match="relay URL"):
        WorkflowClient(state_dir, url=url)
    with pytest.raises(RelayURLError, match="relay URL"):
        LiveViews(state_dir, url=url)


@pytest.mark.parametrize(
    "url", ["ws://127.0.0.1:9377/ws", "ws://localhost:9377/ws", "ws://[::1]:9377/ws"]
)
def test_loopback_urls_are_accepted(state_dir: Path, url: str) -> None:
    assert WorkflowClient(state_dir, url=url).url == url
