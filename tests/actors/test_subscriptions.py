"""The subscription actor, ticked by hand: a Tick flushes each new revision, once.

Real parts: a database actor on a real SQLite file, the reader actor beside it, the real
listener on a Unix socket, and raw client sockets reading the frames. No `Ticker` runs,
so a snapshot is read only when a subscription is installed and on each `Tick` the test
sends.
"""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pykka
import pytest

from pi_workflows import __version__
from pi_workflows.actors._base import wait_reply
from pi_workflows.actors._database import DatabaseActor
from pi_workflows.actors._reader import ReaderActor
from pi_workflows.actors._subscriptions import (
    ConnectionClosed,
    Subscribe,
    SubscriptionActor,
    Unsubscribe,
)
from pi_workflows.domain import ReadView, ViewSnapshot, ViewSpec
from pi_workflows.domain._run_view import build_run_view
from pi_workflows.domain._view_subscriptions import run_view_read
from pi_workflows.storage import (
    Database,
    ManualClock,
    enqueue_run,
    get_run,
    open_database,
    pause_run,
    resume_run,
)
from pi_workflows.storage._queries import SELECT_RUN_VIEW_REVISION
from pi_workflows.testing import perform_with_calls
from pi_workflows.wire._listener import ClientListener, Connection
from pi_workflows.wire.framing import SocketFrameReader
from pi_workflows.wire.protocol import RequestMessage
from pi_workflows.wire.view_patch import apply_patch
from tests.actors.ticks import WAIT_S, handled, on_database, tick
from tests.storage.storage_helpers import new_run

pytestmark = pytest.mark.timeout(30)

RUN_LIST = ViewSpec("runList")


class _Connections:
    """The listener's handler: hands each new connection to the test."""

    def __init__(self) -> None:
        self.connected: queue.Queue[Connection] = queue.Queue()
        self.gone: queue.Queue[str] = queue.Queue()

    def on_connect(self, connection: Connection) -> None:
        self.connected.put(connection)

    def on_request(self, connection: Connection, request: RequestMessage) -> None:
        raise AssertionError("these clients only read")

    def on_disconnect(self, connection: Connection) -> None:
        self.gone.put(connection.connection_id)


@dataclass
class CountedReads:
    """The reader actor's units, counting the view reads (on the reader actor's thread)."""

    builds: int = 0

    def __call__(self, db: Database, unit: object) -> Any:
        if isinstance(unit, ReadView):
            self.builds += 1
        return perform_with_calls(db, unit)


@dataclass
class Views:
    """The actors, the listener, and how often a snapshot was read."""

    database: pykka.ActorRef[Any]
    reader: pykka.ActorRef[Any]
    actor: pykka.ActorRef[Any]
    listener: ClientListener
    handler: _Connections
    path: Path
    counted: CountedReads
    sockets: list[socket.socket] = field(default_factory=list)

    @property
    def builds(self) -> int:
        return self.counted.builds

    def connect(self) -> tuple[Connection, SocketFrameReader]:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.settimeout(WAIT_S)
        client.connect(str(self.path))
        self.sockets.append(client)
        reader = SocketFrameReader(client)
        hello = reader.read_message()
        assert hello is not None and hello["type"] == "hello"
        # The client can read the hello before the loop has finished the write that sent
        # it; the connection counts as drained (a snapshot may be built) only after that.
        self.written()
        return self.handler.connected.get(timeout=WAIT_S), reader

    def subscribe(
        self,
        connection: Connection,
        subscription_id: str,
        spec: ViewSpec = RUN_LIST,
        revision: int | None = None,
    ) -> None:
        self.actor.tell(Subscribe(connection, subscription_id, spec, revision))
        self.flush()

    def counter(self, name: str) -> int:
        return int(getattr(self.actor.proxy(), name).get(timeout=WAIT_S))

    def toggle(self, run_id: str) -> None:
        """Pause or resume the queued run: one committed change of its view."""

        def write(db: Database) -> None:
            run = get_run(db, run_id)
            assert run is not None
            with db.write() as tx:
                (resume_run if run.paused else pause_run)(tx, run_id)

        on_database(self.database, write)

    def tick(self, *sequences: int) -> None:
        """Tick, then wait until every snapshot it asked for is read and written."""
        tick(self.actor, *sequences)
        self.flush()

    def flush(self) -> None:
        # What was told to the actor (it may ask for a read), the read, then its delivery:
        # a read still in flight would coalesce the next subscriber's into it.
        handled(self.actor, self.reader, self.actor)
        self.written()

    def written(self) -> None:
        """Wait for the listener's loop to finish what it was doing: a frame offered
        before is written, and a write the client already saw has finished."""
        loop = self.listener._loop  # private: a barrier on the loop, for the test
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(WAIT_S)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(WAIT_S)

    def enqueue(self, *run_ids: str) -> None:
        def write(db: Database) -> None:
            for run_id in run_ids:
                with db.write() as tx:
                    enqueue_run(tx, new_run(run_id))

        on_database(self.database, write)

    def unsubscribe(self, connection: Connection, subscription_id: str) -> bool:
        return bool(
            wait_reply(
                lambda box: self.actor.tell(
                    Unsubscribe(connection.connection_id, subscription_id, box)
                ),
                WAIT_S,
            )
        )


@pytest.fixture
def views(short_tmp: Path) -> Iterator[Views]:
    db = open_database(short_tmp / "state.sqlite", clock=ManualClock())
    failures: list[str] = []
    database = DatabaseActor.start(
        db, lambda name, exc: failures.append(name), units=perform_with_calls
    )
    counted = CountedReads()
    reader = ReaderActor.start(
        db.path, ManualClock(), lambda name, exc: failures.append(name), units=counted
    )
    handler = _Connections()
    path = short_tmp / "host.sock"
    listener = ClientListener(path, handler, __version__, lambda exc: failures.append("listener"))
    listener.start()
    actor = SubscriptionActor.start(reader, lambda name, exc: failures.append(name))
    started = Views(database, reader, actor, listener, handler, path, counted)
    try:
        yield started
    finally:
        for client in started.sockets:
            client.close()
        listener.stop()
        actor.stop(block=True, timeout=10)
        reader.stop(block=True, timeout=10)
        database.stop(block=True, timeout=10)
    assert not failures


def _event(reader: SocketFrameReader) -> dict[str, Any]:
    message = reader.read_message()
    assert message is not None and message["type"] == "event", message
    return message


def test_a_tick_sends_the_newest_revision_once(views: Views) -> None:
    connection, reader = views.connect()
    views.subscribe(connection, "sub-1")
    first = _event(reader)  # a subscription's first snapshot needs no tick
    assert first["subscriptionId"] == "sub-1" and first["payload"]["items"] == []
    views.enqueue("run-1")
    views.enqueue("run-2")
    views.tick(1)
    second = _event(reader)
    assert second["revision"] > first["revision"]
    runs = sorted(item["runId"] for item in second["payload"]["items"])
    assert runs == ["run-1", "run-2"], "one snapshot for both changes: none between ticks"
    views.tick(2)  # nothing changed: nothing is sent
    views.enqueue("run-3")
    views.tick(3)
    third = _event(reader)
    assert third["revision"] > second["revision"], "no repeat of the unchanged revision"
    assert len(third["payload"]["items"]) == 3


def test_a_view_is_read_only_on_subscribe_and_on_a_tick(views: Views) -> None:
    connection, reader = views.connect()
    views.subscribe(connection, "sub-1")
    _event(reader)
    assert views.builds == 1
    views.enqueue("run-1")
    views.flush()
    assert views.builds == 1, "a change alone reads nothing"
    views.tick(1)
    _event(reader)
    assert views.builds == 2
    assert views.unsubscribe(connection, "sub-1") is True
    assert views.unsubscribe(connection, "sub-1") is False
    views.enqueue("run-2")
    views.tick(2)
    assert views.builds == 2, "an unsubscribed view is never read again"


def test_closed_connections_lose_their_subscriptions_on_the_next_tick(views: Views) -> None:
    kept, kept_reader = views.connect()
    closing, closing_reader = views.connect()
    released, released_reader = views.connect()
    for connection, reader in ((kept, kept_reader), (closing, closing_reader)):
        views.subscribe(connection, "sub-1")
        _event(reader)
    views.subscribe(released, "sub-1")
    views.subscribe(released, "sub-2")
    _event(released_reader)
    _event(released_reader)
    assert views.builds == 4
    views.sockets[1].close()  # the client of `closing` goes away
    assert views.handler.gone.get(timeout=WAIT_S) == closing.connection_id
    views.actor.tell(ConnectionClosed(released.connection_id))  # the router's message
    views.enqueue("run-1")
    views.tick(1)
    assert views.builds == 5, "only the open connection's view was read"
    assert len(_event(kept_reader)["payload"]["items"]) == 1
    views.tick(2)
    assert views.builds == 6, "one read per open subscription and tick (unchanged: no event)"


def _view_now(views: Views, run_id: str) -> dict[str, Any]:
    view = on_database(views.database, lambda db: build_run_view(db, run_id))
    assert isinstance(view, dict)
    return view


def _held(events: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """The view a client rebuilds from its events: a patch applies to its exact base."""
    view: dict[str, Any] | None = None
    kinds = []
    for event in events:
        kinds.append(event["kind"])
        if event["kind"] == "runSnapshot":
            view = event["payload"]
        else:
            assert event["kind"] == "runPatch" and view is not None
            assert event["payload"]["baseRevision"] == view["revision"], (
                "a patch from a revision the client never got"
            )
            view = apply_patch(view, event["payload"]["operations"])
        assert view is not None and view["revision"] == event["revision"]
    assert view is not None
    return view, kinds


def test_an_unchanged_run_view_costs_one_revision_lookup_not_a_rebuild(
    views: Views, short_tmp: Path
) -> None:
    views.enqueue("run-1")
    connection, reader = views.connect()
    views.subscribe(connection, "sub-1", ViewSpec("run", run_id="run-1"))
    assert _event(reader)["kind"] == "runSnapshot"
    built = views.counter("pages_built")
    reads = views.counter("reads")
    views.enqueue("run-2")  # another run changes: this view's revision does not
    for sequence in (1, 2, 3):
        views.tick(sequence)
    assert views.counter("reads") == reads + 3, "one read per tick"
    assert views.counter("pages_built") == built, "no rebuild of an unchanged view"
    # What one such read executes: the revision lookup, and nothing else.
    statements: list[str] = []
    db = open_database(short_tmp / "state.sqlite", clock=ManualClock())
    try:
        since = run_view_read(db, "run-1", -1)
        assert isinstance(since, ViewSnapshot)
        db.tracer = lambda sql, params: statements.append(sql)
        assert run_view_read(db, "run-1", since.revision) is None
    finally:
        db.close()
    queries = [sql for sql in statements if sql.split()[0] not in ("BEGIN", "COMMIT")]
    assert queries == [SELECT_RUN_VIEW_REVISION]  # the lookup alone, no view read


def test_a_run_that_disappears_is_unavailable_once_and_its_subscription_ends(
    views: Views,
) -> None:
    views.enqueue("run-1")
    connection, reader = views.connect()
    views.subscribe(connection, "sub-1", ViewSpec("run", run_id="run-1"))
    assert _event(reader)["kind"] == "runSnapshot"

    def prune(db: Database) -> None:  # what pruning a run does to its rows
        with db.write() as tx:
            tx.execute("DELETE FROM runs WHERE run_id = :run_id", {"run_id": "run-1"})

    on_database(views.database, prune)
    views.tick(1)
    gone = _event(reader)
    assert gone["kind"] == "unavailable" and gone["subscriptionId"] == "sub-1"
    assert gone["payload"]["code"] == "runNotFound"
    assert views.actor.proxy().subscription_count().get(timeout=WAIT_S) == 0
    reads = views.counter("reads")
    views.tick(2)
    assert views.counter("reads") == reads, "nothing left to read"
    assert views.unsubscribe(connection, "sub-1") is False


def test_an_offer_not_yet_handed_to_the_loop_is_never_replaced_by_a_patch_on_top(
    views: Views,
) -> None:
    """The listener's loop is held while the run changes three times. The first change
    is offered (a patch from the snapshot the client has); until that offer is on the
    loop and written, nothing else is offered, so no later patch can replace it and
    leave the client holding a base it never got."""
    views.enqueue("run-1")
    connection, reader = views.connect()
    views.subscribe(connection, "sub-1", ViewSpec("run", run_id="run-1"))
    events = [_event(reader)]
    release = threading.Event()
    held = threading.Event()

    def hold() -> None:  # on the loop: nothing is queued or written meanwhile
        held.set()
        release.wait(WAIT_S)

    views.listener._loop.call_soon_threadsafe(hold)
    try:
        assert held.wait(WAIT_S)
        skipped = views.counter("snapshots_skipped_undrained")
        for sequence in (1, 2, 3):
            views.toggle("run-1")
            tick(views.actor, sequence)
            handled(views.actor, views.reader, views.actor)
        pending = views.actor.proxy().pending_events().get(timeout=WAIT_S)
        assert pending == {connection.connection_id: 1}, "one offer in flight, not three"
        assert views.counter("snapshots_skipped_undrained") > skipped
    finally:
        release.set()
    views.written()
    events.append(_event(reader))
    views.tick(4)  # handed over and drained: the newest revision goes now
    events.append(_event(reader))
    view, kinds = _held(events)
    assert kinds == ["runSnapshot", "runPatch", "runPatch"]
    assert view == _view_now(views, "run-1"), "the patched view is the current one"


def test_a_resubscribe_naming_a_retained_revision_gets_a_patch_from_it(views: Views) -> None:
    views.enqueue("run-1")
    spec = ViewSpec("run", run_id="run-1")
    first, first_reader = views.connect()
    views.subscribe(first, "sub-1", spec)
    events = [_event(first_reader)]
    views.toggle("run-1")
    views.tick(1)
    events.append(_event(first_reader))
    holding = events[-1]["revision"]
    views.actor.tell(ConnectionClosed(first.connection_id))  # the client lost it
    views.toggle("run-1")
    views.toggle("run-1")
    second, second_reader = views.connect()
    views.subscribe(second, "sub-1", spec, revision=holding)
    events.append(_event(second_reader))
    view, kinds = _held(events)
    assert kinds == ["runSnapshot", "runPatch", "runPatch"]
    assert view == _view_now(views, "run-1")
