"""`LiveViews`: subscriptions as iterators of typed views, across server restarts.

Real embedded servers on a real socket and database; a restart is a real stop of one
server and a start of the next on the same state folder.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.wire.client import HostUnavailableError
from pi_workflows.wire.live import LiveViews, RunNotFoundError, ViewKey, WatchTimeoutError
from pi_workflows.wire.views import RunListPage, RunView, SessionView
from tests.server.runs import start_run


def _server(state_dir: Path) -> WorkflowServer:
    instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=False)
    instance.start()
    return instance


@pytest.fixture
def restartable(state_dir: Path) -> Iterator[list[WorkflowServer]]:
    """The servers a test started, in order; every one is stopped at teardown."""
    servers = [_server(state_dir)]
    try:
        yield servers
    finally:
        for instance in servers:
            instance.stop("test teardown")


def _cpu_s() -> float:
    """CPU seconds of this thread: the client's (the embedded servers run in others)."""
    return time.thread_time()


def _run_ids(page: RunListPage) -> set[str]:
    return {item["runId"] for item in page["items"]}


def test_watch_run_list_yields_typed_pages_as_runs_start(
    restartable: list[WorkflowServer], project: Path, state_dir: Path
) -> None:
    with (
        LiveViews(state_dir, autostart=False, timeout=10) as live,
        WorkflowClient(state_dir, autostart=False, timeout=10) as client,
    ):
        pages = live.watch_run_list(timeout=60)
        first = next(pages)
        assert first["schema"] == "pi-workflows.run-list-page.v1"
        assert first["items"] == []
        run_id = start_run(client, project, "hello")
        page = next(pages)
        while run_id not in _run_ids(page):
            page = next(pages)
        item = next(item for item in page["items"] if item["runId"] == run_id)
        assert item["display"]["status"] == "queued"  # typed: mypy knows the keys
        assert live.revision(ViewKey.run_list()) == page["revision"]
        pages.close()  # leaving the loop unsubscribes
        assert live.view(ViewKey.run_list()) is None


def test_a_restarted_server_gets_every_subscription_again(
    restartable: list[WorkflowServer], project: Path, state_dir: Path
) -> None:
    with LiveViews(state_dir, autostart=False, timeout=10, reconnect_timeout=60) as live:
        live.subscribe(ViewKey.run_list())
        update = live.next_update(timeout=30)
        assert update is not None and update.via == "snapshot"
        restartable[0].stop("restart")
        restartable.append(_server(state_dir))
        with WorkflowClient(state_dir, autostart=False, timeout=10) as client:
            run_id = start_run(client, project, "hello")
        # The lost connection is noticed, the list is subscribed again on the new one,
        # and the run started after the restart shows up.
        deadline = time.monotonic() + 60
        seen: set[str] = set()
        while run_id not in seen:
            update = live.next_update(timeout=deadline - time.monotonic())
            assert update is not None, "no run-list view after the restart"
            assert update.key == ViewKey.run_list()
            seen = _run_ids(update.view)
        assert live.reconnects == 1


def test_waiting_through_an_outage_backs_off_instead_of_spinning(
    restartable: list[WorkflowServer], project: Path, state_dir: Path
) -> None:
    with LiveViews(state_dir, autostart=False, timeout=10, reconnect_timeout=60) as live:
        live.subscribe(ViewKey.run_list())
        assert live.next_update(timeout=30) is not None
        before = _cpu_s()
        assert live.next_update(timeout=1.0) is None  # connected, nothing changes
        restartable[0].stop("outage")
        assert live.next_update(timeout=1.5) is None  # no server: reconnect attempts
        spent = _cpu_s() - before
        # A spinning loop burns the whole 2.5 s; waits on a socket and a bounded
        # backoff (at most ~20 connection attempts) burn next to nothing.
        assert spent < 0.25, f"the client used {spent:.2f} s of CPU while waiting"
        restartable.append(_server(state_dir))
        assert live.next_update(timeout=30) is not None
        assert live.reconnects == 1


def test_an_outage_longer_than_the_reconnect_timeout_is_a_clear_error(
    restartable: list[WorkflowServer], state_dir: Path
) -> None:
    with LiveViews(state_dir, autostart=False, timeout=10, reconnect_timeout=0.5) as live:
        live.subscribe(ViewKey.run_list())
        assert live.next_update(timeout=30) is not None
        restartable[0].stop("outage")
        with pytest.raises(HostUnavailableError, match="unreachable for"):
            live.next_update(timeout=30)


def test_no_server_at_the_first_connection_fails_at_once(state_dir: Path) -> None:
    started = time.monotonic()
    with (
        LiveViews(state_dir, autostart=False, timeout=5, reconnect_timeout=60) as live,
        pytest.raises(HostUnavailableError, match="not running"),
    ):
        live.subscribe(ViewKey.run_list())
    assert time.monotonic() - started < 30  # not the 60 s reconnect timeout


def test_a_watch_timeout_ends_the_watch(restartable: list[WorkflowServer], state_dir: Path) -> None:
    with LiveViews(state_dir, autostart=False, timeout=10) as live:
        pages = live.watch_run_list(timeout=1.0)
        next(pages)
        with pytest.raises(WatchTimeoutError):
            next(pages)


def test_watch_run_yields_typed_run_views_and_a_missing_run_fails_at_once(
    restartable: list[WorkflowServer], project: Path, state_dir: Path
) -> None:
    with (
        LiveViews(state_dir, autostart=False, timeout=10) as live,
        WorkflowClient(state_dir, autostart=False, timeout=10) as client,
    ):
        started = time.monotonic()
        with pytest.raises(RunNotFoundError, match="run-does-not-exist") as missing:
            next(live.watch_run("run-does-not-exist", timeout=60))
        assert missing.value.run_id == "run-does-not-exist"
        assert time.monotonic() - started < 30, "notFound is an answer, not a wait"
        assert live.view(ViewKey.run("run-does-not-exist")) is None  # not wanted any more
        run_id = start_run(client, project, "hello")
        views = live.watch_run(run_id, timeout=60)
        view: RunView = next(views)
        assert view["schema"] == "pi-workflows.run-view.v1" and view["runId"] == run_id
        assert view["display"]["status"] == "queued"
        assert "pause" in view["display"]["controls"]
        client.call("run.pause", run_id=run_id)
        paused = next(views)
        assert paused["display"]["status"] == "paused" and paused["revision"] > view["revision"]
        views.close()


def test_a_reconnect_with_a_retained_revision_gets_a_patch_equal_to_a_fresh_snapshot(
    restartable: list[WorkflowServer], project: Path, state_dir: Path
) -> None:
    with (
        LiveViews(state_dir, autostart=False, timeout=10) as live,
        WorkflowClient(state_dir, autostart=False, timeout=10) as client,
    ):
        run_id = start_run(client, project, "hello")
        key = ViewKey.run(run_id)
        live.subscribe(key)
        first = live.next_update(timeout=30)
        assert first is not None and first.via == "snapshot"
        # The server closes a connection that breaks framing: a real lost connection,
        # to the same server, which still retains the revision this client holds.
        live._client.send_raw(b"this is not a frame\n")
        client.call("run.pause", run_id=run_id)
        update = live.next_update(timeout=30)
        while update is not None and update.revision == first.revision:
            update = live.next_update(timeout=30)
        assert update is not None and update.key == key
        assert live.reconnects == 1
        assert update.via == "patch", "a retained revision gets a patch, not a snapshot"
        fresh = client.call("run.get", run_id=run_id)["receipt"]
        assert fresh["revision"] == update.revision
        assert update.view == fresh, "the patched view equals a fresh snapshot"


def test_watch_session_yields_the_session_view_shape(
    restartable: list[WorkflowServer], state_dir: Path
) -> None:
    with LiveViews(state_dir, autostart=False, timeout=10) as live:
        sessions = live.watch_session("session-1", timeout=30)
        view: SessionView = next(sessions)
        assert view["schema"] == "pi-workflows.session-view.v1"
        assert view["sessionId"] == "session-1" and view["activeRun"] is None
        assert view["messages"] == {"count": 0, "items": [], "complete": True}
        assert view["coordinator"] is False and view["nextMessage"] is None
        sessions.close()


def test_workflow_client_live_shares_its_state_folder_and_settings(
    restartable: list[WorkflowServer], project: Path, state_dir: Path
) -> None:
    with WorkflowClient(state_dir, autostart=False, timeout=10) as client:
        run_id = start_run(client, project, "hello")
        with client.live(reconnect_timeout=5) as live:
            assert (live.state_dir, live.autostart, live.reconnect_timeout) == (
                state_dir,
                False,
                5,
            )
            view = next(live.watch_run(run_id, timeout=30))
            assert view["runId"] == run_id
