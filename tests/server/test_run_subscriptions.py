"""Run and session-view subscriptions: snapshots, patches, reconnects, unsubscribe, close.

Real parts: an embedded server (runs stay queued: `execute_runs=False`), its Unix
socket, raw subscriber sockets (tests/server/watchers.py) and `WorkflowClient` for the
commands that change a run. Pause and resume change a queued run's view (its pause
flag, display status and controls), so each is a new view revision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.wire.protocol import validate
from tests.server.watchers import HeldView, Watcher, wait_for

pytestmark = pytest.mark.timeout(90)


def _start(client: WorkflowClient, project: Path, index: int = 0) -> str:
    answer = client.call(
        "run.start", {"workflow": "hello", "input": {"i": index}, "projectPath": str(project)}
    )
    return str(answer["receipt"]["runId"])


def _fresh(client: WorkflowClient, run_id: str) -> dict[str, Any]:
    view: dict[str, Any] = client.call("run.get", run_id=run_id)["receipt"]
    return view


def _toggle(client: WorkflowClient, run_id: str, times: int) -> None:
    """Pause and resume in turn: each is a committed change of the run's view."""
    paused = bool(_fresh(client, run_id)["paused"])
    for _ in range(times):
        client.call("run.resume" if paused else "run.pause", run_id=run_id)
        paused = not paused


def _count(server: WorkflowServer) -> int:
    subscriptions = server._subscriptions  # private: the actor's own count, for the test
    assert subscriptions is not None
    return int(subscriptions.proxy().subscription_count().get(timeout=10))


def _watch_until(watcher: Watcher, held: HeldView, revision: int) -> None:
    while held.view is None or held.revision < revision:
        event = watcher.event()
        validate("client.v1", event)
        held.apply(event)


def test_a_missing_run_is_not_found_and_installs_nothing(
    server: WorkflowServer, client: WorkflowClient
) -> None:
    watcher = Watcher(server.socket_path)
    try:
        answer = watcher.request("view.subscribe", {"kind": "run"}, runId="run-missing")
        assert answer["outcome"] == "notFound"
        assert answer["error"]["code"] == "runNotFound"
        assert _count(server) == 0
        no_run = watcher.request("view.subscribe", {"kind": "run"})
        assert no_run["outcome"] == "rejected" and no_run["error"]["code"] == "runIdRequired"
        assert _count(server) == 0
    finally:
        watcher.close()


def test_a_run_subscription_sends_its_view_then_patches_that_rebuild_it(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    run_id = _start(client, project)
    watcher = Watcher(server.socket_path)
    try:
        subscription = watcher.subscribe({"kind": "run"}, runId=run_id)
        first = watcher.event()
        validate("client.v1", first)
        assert first["kind"] == "runSnapshot" and first["subscriptionId"] == subscription
        assert first["payload"]["schema"] == "pi-workflows.run-view.v1"
        assert first["payload"] == _fresh(client, run_id)
        held = HeldView()
        held.apply(first)
        _toggle(client, run_id, 3)
        fresh = _fresh(client, run_id)
        _watch_until(watcher, held, fresh["revision"])
        assert held.view == fresh, "the patched view is the fresh snapshot"
        assert set(held.kinds[1:]) == {"runPatch"}, "a subscriber that keeps up gets patches"
    finally:
        watcher.close()


def test_a_reconnect_with_a_retained_revision_gets_only_patches(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    run_id = _start(client, project)
    first = Watcher(server.socket_path)
    held = HeldView()
    try:
        first.subscribe({"kind": "run"}, runId=run_id)
        held.apply(first.event())
        _toggle(client, run_id, 1)
        _watch_until(first, held, _fresh(client, run_id)["revision"])
    finally:
        first.close()  # the connection is lost; the client keeps the view it holds
    wait_for(lambda: _count(server) == 0, "the closed connection's subscription to go")
    _toggle(client, run_id, 2)  # changes while the client is away
    again = Watcher(server.socket_path)
    try:
        again.subscribe({"kind": "run", "revision": held.revision}, runId=run_id)
        fresh = _fresh(client, run_id)
        _watch_until(again, held, fresh["revision"])
        _toggle(client, run_id, 1)
        fresh = _fresh(client, run_id)
        _watch_until(again, held, fresh["revision"])
        assert held.kinds[:2] == ["runSnapshot", "runPatch"]
        assert set(held.kinds[2:]) == {"runPatch"}, "after the reconnect: only patches"
        assert held.view == fresh, "the patched view equals a fresh run.get"
    finally:
        again.close()


def test_a_revision_the_server_does_not_retain_gets_a_snapshot(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    run_id = _start(client, project)
    _toggle(client, run_id, 1)
    never_read = _fresh(client, run_id)["revision"]  # no subscriber has read this one
    _toggle(client, run_id, 1)
    watcher = Watcher(server.socket_path)
    try:
        for revision in (never_read, 10**9):
            subscription = watcher.subscribe({"kind": "run", "revision": revision}, runId=run_id)
            event = watcher.event()
            assert event["subscriptionId"] == subscription
            assert event["kind"] == "runSnapshot"
            assert event["payload"] == _fresh(client, run_id)
    finally:
        watcher.close()


def test_a_session_view_subscription_of_an_unknown_session_is_empty(
    server: WorkflowServer,
) -> None:
    watcher = Watcher(server.socket_path)
    try:
        subscription = watcher.subscribe({"kind": "sessionView", "sessionId": "session-1"})
        event = watcher.event()
        validate("client.v1", event)
        assert event["kind"] == "sessionSnapshot" and event["subscriptionId"] == subscription
        assert event["payload"] == {
            "schema": "pi-workflows.session-view.v1",
            "sessionId": "session-1",
            "revision": 0,
            "activeRun": None,
            "coordinator": False,
            "messages": {"count": 0, "items": [], "complete": True},
            "nextMessage": None,
        }
        for bad in ("", "s" * 300, 7, "a\nb"):
            answer = watcher.request("view.subscribe", {"kind": "sessionView", "sessionId": bad})
            assert answer["outcome"] == "rejected", bad
        assert _count(server) == 1
    finally:
        watcher.close()


def test_unsubscribe_removes_every_kind(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    run_id = _start(client, project)
    watcher = Watcher(server.socket_path)
    try:
        ids = [
            watcher.subscribe({"kind": "runList"}),
            watcher.subscribe({"kind": "run"}, runId=run_id),
            watcher.subscribe({"kind": "sessionView", "sessionId": "session-1"}),
        ]
        assert _count(server) == 3
        for subscription in ids:
            removed = watcher.request("view.unsubscribe", {"subscriptionId": subscription})
            assert removed["outcome"] == "accepted"
            again = watcher.request("view.unsubscribe", {"subscriptionId": subscription})
            assert again["outcome"] == "notFound"
        assert _count(server) == 0
        watcher.events.clear()  # events sent before the unsubscribes were answered
        _toggle(client, run_id, 2)
        _start(client, project, 1)
        # A sentinel subscription's first event is the next one on this connection: no
        # event of the removed subscriptions came in between.
        sentinel = watcher.subscribe({"kind": "sessionView", "sessionId": "sentinel"})
        assert watcher.event()["subscriptionId"] == sentinel
    finally:
        watcher.close()


def test_closing_a_connection_removes_its_run_and_session_subscriptions(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    run_id = _start(client, project)
    kept = Watcher(server.socket_path)
    closing = Watcher(server.socket_path)
    try:
        kept.subscribe({"kind": "run"}, runId=run_id)
        closing.subscribe({"kind": "run"}, runId=run_id)
        closing.subscribe({"kind": "sessionView", "sessionId": "session-1"})
        assert _count(server) == 3
        closing.close()
        wait_for(lambda: _count(server) == 1, "the closed connection's subscriptions to go")
        held = HeldView()
        _toggle(client, run_id, 1)
        _watch_until(kept, held, _fresh(client, run_id)["revision"])
        assert held.view == _fresh(client, run_id), "the other subscriber is unaffected"
    finally:
        kept.close()
        closing.close()
