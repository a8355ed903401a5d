"""The reader actor: reads from a read-only connection that never waits for the writer.

Real SQLite files, a real database actor holding its write transaction open, and a real
reader actor: the reader answers from the last committed state while the writer is in
the middle of a batch, one read transaction per `Read`, and it cannot write.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from pi_workflows._address import ReplyBox
from pi_workflows.actors._base import wait_reply
from pi_workflows.actors._database import DatabaseActor, Transact
from pi_workflows.actors._reader import Read, ReaderActor
from pi_workflows.domain import ClientOperation, RunViewCache
from pi_workflows.domain._operations import OperationContext, handle_operation
from pi_workflows.domain._run_view import build_run_view
from pi_workflows.storage import (
    Database,
    SystemClock,
    open_database,
    put_blob,
    start_node_attempt,
)
from pi_workflows.testing import CallUnit, perform_with_calls
from tests.storage.storage_helpers import enqueue, running

pytestmark = pytest.mark.timeout(60)

WAIT_S = 20.0


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[Database]:
    db = open_database(tmp_path / "state.sqlite")
    try:
        yield db
    finally:
        db.close()


@pytest.fixture
def actors(writer: Database) -> Iterator[tuple[pykka.ActorRef[Any], pykka.ActorRef[Any]]]:
    failures: list[str] = []
    database = DatabaseActor.start(
        writer, lambda name, exc: failures.append(name), units=perform_with_calls
    )
    reader = ReaderActor.start(
        writer.path,
        SystemClock(),
        lambda name, exc: failures.append(name),
        units=perform_with_calls,
    )
    try:
        yield database, reader
    finally:
        for ref in (reader, database):
            if ref.is_alive():
                ref.stop(block=True, timeout=WAIT_S)
        assert failures == []


def read(reader: pykka.ActorRef[Any], work: Any) -> Any:
    return wait_reply(lambda box: reader.tell(Read(CallUnit(work), box)), WAIT_S)


def runs(db: Database) -> int:
    return int(db.fetch_value("SELECT count(*) FROM runs", {}))


def test_reads_are_answered_while_the_writer_holds_its_transaction(
    actors: tuple[pykka.ActorRef[Any], pykka.ActorRef[Any]], writer: Database
) -> None:
    database, reader = actors
    enqueue(writer, "run-1")
    inside, release = threading.Event(), threading.Event()
    committed = ReplyBox()

    def long_write(db: Database) -> None:
        with db.write() as tx:
            tx.execute("DELETE FROM run_queue WHERE run_id = 'run-1'")
            tx.execute("DELETE FROM runs WHERE run_id = 'run-1'")
            inside.set()
            assert release.wait(WAIT_S)

    database.tell(Transact(CallUnit(long_write), committed))
    assert inside.wait(WAIT_S)
    try:
        # The write lock is held and the delete is not committed: the reader does not wait
        # and sees the committed run.
        assert read(reader, runs) == 1
    finally:
        release.set()
    wait_reply(lambda box: database.tell(Transact(CallUnit(lambda db: None), box)), WAIT_S)
    committed.wait(0)  # answered, without an error (it raises one)
    assert read(reader, runs) == 0, "a read after the reply sees the commit"


def test_one_read_is_one_snapshot(
    actors: tuple[pykka.ActorRef[Any], pykka.ActorRef[Any]], writer: Database, tmp_path: Path
) -> None:
    _, reader = actors
    other = open_database(tmp_path / "state.sqlite")  # a second writer, for this test only

    def twice(db: Database) -> tuple[int, int]:
        first = int(db.fetch_value("SELECT count(*) FROM blobs", {}))
        with other.write() as tx:  # commits between the two reads of one Read
            put_blob(tx, b"between")
        return first, int(db.fetch_value("SELECT count(*) FROM blobs", {}))

    try:
        first, second = read(reader, twice)
        assert first == second == 0
        assert read(reader, lambda db: db.fetch_value("SELECT count(*) FROM blobs", {})) == 1
    finally:
        other.close()


def test_the_reader_cannot_write(actors: tuple[pykka.ActorRef[Any], pykka.ActorRef[Any]]) -> None:
    _, reader = actors

    def write(db: Database) -> None:
        with db.write() as tx:
            put_blob(tx, b"x")

    with pytest.raises(RuntimeError, match="read-only"):
        read(reader, write)

    def raw_insert(db: Database) -> None:
        db.connection.execute("DELETE FROM blobs")

    with pytest.raises(sqlite3.OperationalError):
        read(reader, raw_insert)


def test_server_status_counts_live_runner_epochs_from_the_database(
    actors: tuple[pykka.ActorRef[Any], pykka.ActorRef[Any]], writer: Database
) -> None:
    _, reader = actors
    running(writer, "run-1")  # one runner epoch, ready
    enqueue(writer, "run-2")
    request: Any = {
        "schema": "pi-workflows.client.v1",
        "type": "request",
        "requestId": "r-1",
        "clientId": "c-1",
        "operation": "server.status",
        "idempotencyKey": "k-1",
        "payload": {},
    }
    ctx = OperationContext(epoch=7, owner_id="server-1")  # knows no runner
    answer = read(reader, lambda db: handle_operation(db, request, ctx))
    receipt = answer["receipt"]
    assert receipt["activeRunners"] == 1
    assert receipt["runs"] == {"queued": 1, "running": 1, "parked": 0, "waiting": 0}
    assert receipt["epoch"] == 7


def test_run_get_on_the_reader_is_served_from_its_cache_until_a_commit_moves_the_run(
    writer: Database,
) -> None:
    """The reader's cache answers an unchanged run without a build, and the first
    `run.get` after a commit (through the database actor) has the new revision."""
    failures: list[str] = []
    database = DatabaseActor.start(
        writer, lambda name, exc: failures.append(name), units=perform_with_calls
    )
    views = RunViewCache()
    reader = ReaderActor.start(
        writer.path, SystemClock(), lambda name, exc: failures.append(name), run_views=views
    )
    try:
        claim = running(writer, "run-1")
        request: Any = {
            "schema": "pi-workflows.client.v1",
            "type": "request",
            "requestId": "r-1",
            "clientId": "c-1",
            "operation": "run.get",
            "idempotencyKey": "k-1",
            "payload": {},
            "runId": "run-1",
        }
        ctx = OperationContext(epoch=7, owner_id="server-1")

        def run_get() -> dict[str, Any]:
            unit = ClientOperation(request, ctx)
            answer = wait_reply(lambda box: reader.tell(Read(unit, box)), WAIT_S)
            receipt: dict[str, Any] = answer["receipt"]
            return receipt

        first = run_get()
        assert run_get() == first and views.counts.builds == 1 and views.counts.hits == 1

        def start_attempt(db: Database) -> None:
            with db.write() as tx:
                start_node_attempt(tx, claim, attempt_id="a1", node_path="n", node_type="compute")

        wait_reply(lambda box: database.tell(Transact(CallUnit(start_attempt), box)), WAIT_S)
        second = run_get()
        assert second["revision"] > first["revision"]
        assert second["display"].get("currentNode") == "n"
        assert second == build_run_view(writer, "run-1")
        assert views.counts.builds == 2
    finally:
        for ref in (reader, database):
            ref.stop(block=True, timeout=WAIT_S)
    assert failures == []
