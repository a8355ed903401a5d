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
    ViewGone,
    ViewSnapshot,
    ViewSpec,
)
from pi_workflows.server._view_subscriptions import read_view
from pi_workflows.storage import Database, ManualClock, enqueue_run, open_database
from pi_workflows.wire._listener import ClientListener, Connection
from pi_workflows.wire.framing import SocketFrameReader
from pi_workflows.wire.protocol import RequestMessage
from tests.actors.ticks import WAIT_S, handled, on_database, tick
from tests.storage.storage_helpers import new_run

pytestmark = pytest.mark.timeout(30)


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
    """The server's view reader, counting its calls (on the reader actor's thread)."""

    builds: int = 0

    def __call__(self, db: Database, spec: ViewSpec, since: int) -> ViewSnapshot | ViewGone | None:
        self.builds += 1
        return read_view(db, spec, since)


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

    def subscribe(self, connection: Connection, subscription_id: str) -> None:
        self.actor.tell(Subscribe(connection, subscription_id, ViewSpec("runList")))
        self.flush()

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
                lambda deliver: self.actor.tell(
                    Unsubscribe(connection.connection_id, subscription_id, deliver)
                ),
                WAIT_S,
            )
        )


@pytest.fixture
def views(short_tmp: Path) -> Iterator[Views]:
    db = open_database(short_tmp / "state.sqlite", clock=ManualClock())
    failures: list[str] = []
    database = DatabaseActor.start(db, lambda name, exc: failures.append(name))
    reader = ReaderActor.start(db.path, ManualClock(), lambda name, exc: failures.append(name))
    handler = _Connections()
    path = short_tmp / "host.sock"
    listener = ClientListener(path, handler, __version__, lambda exc: failures.append("listener"))
    listener.start()
    counted = CountedReads()
    actor = SubscriptionActor.start(reader, counted, lambda name, exc: failures.append(name))
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
