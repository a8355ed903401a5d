"""The database actor's group commit, on real SQLite files and a real actor thread.

Units waiting in the mailbox run as one transaction (each unit's `write()` a savepoint)
with one COMMIT, and their replies are released only after it, in mailbox order. A
failing unit rolls back only its own writes; a failing COMMIT fails every unit in it.
A crash between the COMMIT and the replies (a real SIGKILL at the crash point) leaves
state that recovery and retrying clients and runners adopt. A full disk (SQLITE_FULL
through `max_page_count`) holds the server's own units in order and refuses a client's.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from pi_workflows.actors._base import Address, Done, Reply
from pi_workflows.actors._database import RETRY_FULL_EVERY_TICKS, DatabaseActor, Transact
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain._operations import OperationContext, handle_operation
from pi_workflows.domain._recovery import recover_at_startup
from pi_workflows.storage import (
    ClaimLostError,
    CommandRequest,
    Database,
    DiskFullError,
    GroupLostError,
    LookupOutcome,
    Tx,
    is_disk_full,
    lookup_receipt,
    lookup_runner_reply,
    open_database,
    pause_run,
    protected_write,
    put_blob,
    runner_message_fingerprint,
)
from pi_workflows.supervision import CRASH_ENV, CRASH_ONCE_ENV, ProcessIdentity
from pi_workflows.testing import CallUnit, perform_with_calls
from pi_workflows.wire.protocol import RequestMessage
from tests.storage.storage_helpers import running

pytestmark = pytest.mark.timeout(60)

WAIT_S = 20.0


class Recorder:
    """Collects replies in arrival order; `wait` blocks until `count` arrived."""

    def __init__(self) -> None:
        self.replies: list[tuple[str, Reply]] = []
        self._done = threading.Condition()

    def reply(self, name: str, then: Callable[[Reply], None] | None = None) -> Address:
        """An address for one unit's answer: recorded as `name` (after `then` saw it)."""
        recorder = self

        class Box:
            def tell(self, message: Any) -> None:
                assert isinstance(message, Done)
                if then is not None:
                    then(message.reply)
                with recorder._done:
                    recorder.replies.append((name, message.reply))
                    recorder._done.notify_all()

        return Box()

    def wait(self, count: int) -> dict[str, Reply]:
        with self._done:
            assert self._done.wait_for(lambda: len(self.replies) >= count, WAIT_S)
        return dict(self.replies)


@pytest.fixture
def statements() -> list[str]:
    return []


@pytest.fixture
def traced(tmp_path: Path, statements: list[str]) -> Iterator[Database]:
    db = open_database(
        tmp_path / "state.sqlite", tracer=lambda sql, _params: statements.append(sql.strip())
    )
    try:
        yield db
    finally:
        db.close()


@pytest.fixture
def actor(traced: Database) -> Iterator[pykka.ActorRef[Any]]:
    failures: list[str] = []
    ref = DatabaseActor.start(
        traced, lambda name, exc: failures.append(name), units=perform_with_calls
    )
    try:
        yield ref
    finally:
        if ref.is_alive():
            ref.stop(block=True, timeout=WAIT_S)
        assert failures == []


def hold(actor: pykka.ActorRef[Any]) -> threading.Event:
    """Keep the actor busy with a read-only unit until the returned event is set, so the
    units told meanwhile wait in the mailbox and run as one batch."""
    started, release = threading.Event(), threading.Event()

    def gate(db: Database) -> None:
        started.set()
        assert release.wait(WAIT_S)

    actor.tell(Transact(CallUnit(gate)))
    assert started.wait(WAIT_S)
    return release


def blob_count(path: Path, data: bytes) -> int:
    """Read with a second connection: only committed rows are visible to it."""
    with sqlite3.connect(path) as conn:
        return int(
            conn.execute("SELECT count(*) FROM blobs WHERE content = ?", (data,)).fetchone()[0]
        )


def store(data: bytes) -> Callable[[Database], str]:
    def work(db: Database) -> str:
        with db.write() as tx:
            return put_blob(tx, data)

    return work


def test_a_failing_unit_rolls_back_only_its_own_writes(
    actor: pykka.ActorRef[Any], traced: Database, statements: list[str]
) -> None:
    claim = running(traced, "run-1")
    with traced.write() as tx:  # a pause releases the claim: it fails its check now
        pause_run(tx, "run-1", claim=claim)
    statements.clear()

    def stale_claim_write(db: Database) -> None:
        with db.write() as tx:
            put_blob(tx, b"second")
            protected_write(tx, claim, event_type="node_update", payload={})

    recorder = Recorder()
    release = hold(actor)
    actor.tell(Transact(CallUnit(store(b"first")), recorder.reply("first")))
    actor.tell(Transact(CallUnit(stale_claim_write), recorder.reply("second")))
    actor.tell(Transact(CallUnit(store(b"third")), recorder.reply("third")))
    release.set()
    replies = recorder.wait(3)

    assert [name for name, _ in recorder.replies] == ["first", "second", "third"]
    assert replies["first"].error is None and replies["third"].error is None
    assert isinstance(replies["second"].error, ClaimLostError)
    assert blob_count(traced.path, b"first") == blob_count(traced.path, b"third") == 1
    assert blob_count(traced.path, b"second") == 0
    assert statements.count("BEGIN IMMEDIATE") == 1, "the three units shared one transaction"
    assert statements.count("COMMIT") == 1, "and one commit"
    assert statements.count("ROLLBACK TO unit") == 1


def test_replies_are_released_only_after_the_commit(
    actor: pykka.ActorRef[Any], traced: Database
) -> None:
    seen_in_work: list[int] = []
    seen_in_reply: list[int] = []

    def write_then_look(data: bytes) -> Callable[[Database], None]:
        def work(db: Database) -> None:
            with db.write() as tx:
                put_blob(tx, data)
            seen_in_work.append(blob_count(db.path, data))  # not committed yet

        return work

    def look(data: bytes) -> Callable[[Reply], None]:
        return lambda reply: seen_in_reply.append(blob_count(traced.path, data))

    recorder = Recorder()
    release = hold(actor)
    for index in range(5):
        data = f"unit-{index}".encode()
        unit = CallUnit(write_then_look(data))
        actor.tell(Transact(unit, recorder.reply(str(index), look(data))))
    release.set()
    replies = recorder.wait(5)

    assert all(reply.error is None for reply in replies.values())
    assert seen_in_work == [0] * 5, "a unit's write is not visible outside before the COMMIT"
    assert seen_in_reply == [1] * 5, "every reply sees its unit's write committed"


def test_a_failing_commit_fails_every_unit_of_the_batch(
    actor: pykka.ActorRef[Any], traced: Database
) -> None:
    def broken_run(db: Database) -> None:  # a deferred foreign key fails only at COMMIT
        with db.write() as tx:
            tx.execute(
                "INSERT INTO runs (run_id, workflow_name, project_path, source_identity,"
                " definition_digest, input_hash, input, status, revision, root_run_id,"
                " created_at, updated_at) VALUES ('r', 'w', '/', '{}', 'd', 'h', '{}',"
                " 'queued', 1, 'missing-root', 1, 1)"
            )

    def read_only(db: Database) -> int:
        return int(db.fetch_value("SELECT count(*) FROM runs", {}))

    recorder = Recorder()
    release = hold(actor)
    actor.tell(Transact(CallUnit(read_only), recorder.reply("read before any write")))
    actor.tell(Transact(CallUnit(store(b"neighbour")), recorder.reply("neighbour")))
    actor.tell(Transact(CallUnit(broken_run), recorder.reply("broken")))
    release.set()
    replies = recorder.wait(3)

    assert replies["read before any write"].value == 0, "it ran before the transaction began"
    assert isinstance(replies["neighbour"].error, sqlite3.IntegrityError)
    assert isinstance(replies["broken"].error, sqlite3.IntegrityError)
    assert blob_count(traced.path, b"neighbour") == 0, "nothing of the batch is durable"
    # The actor carries on: the next unit commits on its own.
    again = Recorder()
    actor.tell(Transact(CallUnit(store(b"later")), again.reply("later")))
    assert again.wait(1)["later"].error is None
    assert blob_count(traced.path, b"later") == 1


def test_a_transaction_sqlite_rolls_back_under_a_unit_fails_the_units_before_it(
    actor: pykka.ActorRef[Any], traced: Database
) -> None:
    # A full database makes SQLite roll back the whole transaction, not only the unit.
    pages = traced.fetch_value("PRAGMA page_count", {})
    traced.connection.execute(f"PRAGMA max_page_count = {pages + 16}")
    recorder = Recorder()
    release = hold(actor)
    actor.tell(Transact(CallUnit(store(b"before")), recorder.reply("before")))
    actor.tell(Transact(CallUnit(store(b"x" * 1_000_000)), recorder.reply("too big")))
    actor.tell(Transact(CallUnit(store(b"after")), recorder.reply("after")))
    release.set()
    replies = recorder.wait(3)

    assert isinstance(replies["before"].error, GroupLostError), "its write went with the rest"
    assert isinstance(replies["too big"].error, sqlite3.OperationalError)
    assert not isinstance(replies["too big"].error, GroupLostError)
    assert replies["after"].error is None, "the rest of the batch ran in a new group"
    assert blob_count(traced.path, b"before") == 0
    assert blob_count(traced.path, b"after") == 1


def test_a_stop_envelope_ends_the_batch_and_keeps_its_place(
    actor: pykka.ActorRef[Any], traced: Database
) -> None:
    recorder = Recorder()
    release = hold(actor)
    actor.tell(Transact(CallUnit(store(b"before stop")), recorder.reply("before")))
    stopped = actor.stop(block=False)
    actor.tell(Transact(CallUnit(store(b"after stop")), recorder.reply("after")))
    release.set()
    stopped.get(timeout=WAIT_S)
    assert [name for name, _ in recorder.replies] == ["before"]
    path = traced.path
    assert blob_count(path, b"before stop") == 1 and blob_count(path, b"after stop") == 0


def test_an_ask_between_tells_runs_in_mailbox_order(
    actor: pykka.ActorRef[Any], traced: Database
) -> None:
    order: list[str] = []

    def mark(name: str) -> Callable[[Database], None]:
        def work(db: Database) -> None:
            with db.write() as tx:
                put_blob(tx, name.encode())
            order.append(name)

        return work

    release = hold(actor)
    actor.tell(Transact(CallUnit(mark("a"))))
    asked = actor.ask(Transact(CallUnit(mark("b"))), block=False)
    actor.tell(Transact(CallUnit(mark("c"))))
    release.set()
    asked.get(timeout=WAIT_S)
    recorder = Recorder()
    actor.tell(Transact(CallUnit(lambda db: None), recorder.reply("end")))
    recorder.wait(1)
    assert order == ["a", "b", "c"]


def test_after_commit_actions_run_after_the_commit_and_not_after_a_rollback(
    actor: pykka.ActorRef[Any], traced: Database
) -> None:
    seen: list[tuple[str, int]] = []

    def act(name: str, data: bytes, fail: bool) -> Callable[[Database], None]:
        def work(db: Database) -> None:
            with db.write() as tx:
                put_blob(tx, data)
                db.after_commit(lambda: seen.append((name, blob_count(db.path, data))))
                if fail:
                    raise ValueError("refused")

        return work

    recorder = Recorder()
    release = hold(actor)
    actor.tell(Transact(CallUnit(act("kept", b"kept", False)), recorder.reply("kept")))
    actor.tell(Transact(CallUnit(act("undone", b"undone", True)), recorder.reply("undone")))
    release.set()
    replies = recorder.wait(2)
    assert isinstance(replies["undone"].error, ValueError)
    assert seen == [("kept", 1)], "the action saw the commit; the rolled back one never ran"


# --- a real crash between the COMMIT and the replies ----------------------------------

CRASH_CHILD = r"""
import json, sys, threading, types
from pathlib import Path
from pi_workflows.actors._database import RETRY_FULL_EVERY_TICKS, DatabaseActor, Transact
from pi_workflows.actors._ticker import Tick
from pi_workflows.testing import CallUnit, perform_with_calls
from pi_workflows.domain._operations import OperationContext, handle_operation
from pi_workflows.domain import ApplyRunnerMessage, ClientOperation
from pi_workflows.domain._runner_handlers import RunnerView, apply_message
from pi_workflows.domain._runner_launch import prepare_launch
from pi_workflows.wire.runner import RunnerMessage
from pi_workflows.storage import NewRun, enqueue_run, open_database
from pi_workflows.wire.protocol import LAUNCH_SCHEMA

path, setup = Path(sys.argv[1]), Path(sys.argv[2])
db = open_database(path)
for run_id in ("queued-1", "running-1"):
    with db.write() as tx:
        enqueue_run(tx, NewRun(run_id=run_id, workflow_name="w", project_path="/p",
            source_identity={"root": {"kind": "builtin"}}, definition_digest="sha256:d",
            input_hash="sha256:i", input={}))
plan = prepare_launch(db, "running-1", "server-crashed")
view = RunnerView.launched(plan)  # plain writes: committed at once
epoch = plan.runner_epoch
def message(kind, message_id, payload, attempt=None):
    body = {"schema": LAUNCH_SCHEMA, "kind": kind, "runId": "running-1",
        "generation": plan.envelope["generation"], "runnerEpoch": epoch,
        "expectedRevision": 0, "messageId": message_id, "payload": payload}
    if attempt:
        body["attemptId"] = attempt
    return body
digest = "sha256:" + "d" * 64
ready = message("runner.ready", "m0", {"protocolVersion": 1, "definitionDigest": digest})
assert apply_message(db, view, RunnerMessage.from_wire(ready)).frames[0]["outcome"] == "accepted"
started = message("node.started", "m1", {"nodePath": "a", "nodeKind": "compute", "visit": 1},
    "attempt-1")
request = json.loads(sys.argv[3])
setup.write_text(json.dumps({"epoch": epoch, "message": started}))

gate_started, release = threading.Event(), threading.Event()
def gate(db):
    gate_started.set()
    release.wait(20)
ctx = OperationContext(epoch=1, owner_id="server-crashed")
actor = DatabaseActor.start(db, lambda name, exc: None, units=perform_with_calls)
actor.tell(Transact(CallUnit(gate)))
gate_started.wait(20)
typed = RunnerMessage.from_wire(started)
printer = types.SimpleNamespace(tell=print)
actor.tell(Transact(ApplyRunnerMessage(view, typed), printer))
actor.tell(Transact(ClientOperation(request, ctx), printer))
release.set()
threading.Event().wait(20)  # the armed point kills this process first
sys.exit(3)
"""


def _pause_request(request_id: str) -> RequestMessage:
    return {
        "schema": "pi-workflows.client.v1",
        "type": "request",
        "requestId": request_id,
        "clientId": "client-1",
        "operation": "run.pause",
        "idempotencyKey": "pause-queued-1",
        "runId": "queued-1",
        "payload": {},
    }


@pytest.mark.parametrize(
    "point", ["server.group_commit.after_commit", "server.group_commit.before_commit"]
)
def test_a_crash_at_the_group_commit_leaves_state_retries_adopt(tmp_path: Path, point: str) -> None:
    """One batch holds a runner's node.started and a client's run.pause; the process is
    SIGKILLed at the point. Recovery and the retries then see all of it or none of it."""
    path, setup = tmp_path / "state.sqlite", tmp_path / "setup.json"
    env = dict(os.environ, **{CRASH_ENV: point, CRASH_ONCE_ENV: str(tmp_path / "crashed")})
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            CRASH_CHILD,
            str(path),
            str(setup),
            json.dumps(_pause_request("request-1")),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert f"crash point {point} hit 1" in child.stderr
    assert child.stdout == "", "no unit was answered before the crash"
    facts = json.loads(setup.read_text())
    epoch, message = facts["epoch"], facts["message"]

    db = open_database(path)
    try:
        fingerprint = runner_message_fingerprint(message)
        stored = lookup_runner_reply(db, epoch, message["messageId"], fingerprint)
        recover_at_startup(db, "server-next", _nothing_recorded)
        # Recovery ends the crashed server's runner epoch (orphaned): a repeat from it is
        # refused before the database, so its replies are not kept.
        assert lookup_runner_reply(db, epoch, message["messageId"], fingerprint) is None
        attempts = db.fetch_value("SELECT count(*) FROM node_attempts", {})
        retry = handle_operation(
            db, _pause_request("request-2"), OperationContext(epoch=2, owner_id="s")
        )
        if point.endswith("after_commit"):
            # Durable before the crash: the runner's reply was stored, and the client's
            # retry adopts the stored receipt.
            assert stored is not None and stored["outcome"] == "accepted"
            assert attempts == 1
            assert retry["outcome"] == "adopted" and retry["receipt"]["state"] == "queued"
        else:
            # Lost with the whole batch: no reply, no attempt, no receipt; the retry applies.
            assert stored is None and attempts == 0
            assert retry["outcome"] == "accepted"
        with db.write() as tx:
            assert _lookup(tx).outcome is LookupOutcome.ADOPTED
        paused = db.fetch_value("SELECT paused FROM runs WHERE run_id = 'queued-1'", {})
        assert paused == 1, "paused exactly once either way"
    finally:
        db.close()


def _nothing_recorded(identities: tuple[ProcessIdentity, ...]) -> int:
    """Recovery's process stop: the crashed child never spawned a runner."""
    assert identities == ()
    return 0


def _lookup(tx: Tx) -> Any:
    return lookup_receipt(
        tx,
        CommandRequest(
            request_id="request-3",
            client_id="client-1",
            operation="run.pause",
            idempotency_key="pause-queued-1",
            payload={"runId": "queued-1"},
        ),
    )


def _cap_pages(extra: int | None) -> Callable[[Database], None]:
    """A unit that caps the database at its size plus `extra` pages (None: no cap):
    SQLite then refuses a write that needs more with SQLITE_FULL, as on a full disk."""

    def cap(db: Database) -> None:
        limit = 4_294_967_294
        if extra is not None:
            limit = int(db.fetch_value("PRAGMA page_count", {})) + extra
        db.connection.execute(f"PRAGMA max_page_count = {limit}")

    return cap


def test_a_full_disk_holds_the_servers_own_units_in_order_and_refuses_client_units(
    actor: pykka.ActorRef[Any], traced: Database
) -> None:
    recorder = Recorder()
    actor.tell(Transact(CallUnit(_cap_pages(0)), recorder.reply("cap")))
    release = hold(actor)
    actor.tell(
        Transact(CallUnit(store(b"a" * 200_000)), recorder.reply("held a"), hold_when_full=True)
    )
    actor.tell(Transact(CallUnit(store(b"b" * 200_000)), recorder.reply("client b")))
    actor.tell(Transact(CallUnit(store(b"c")), recorder.reply("held c"), hold_when_full=True))
    release.set()
    replies = recorder.wait(2)
    assert is_disk_full(replies["client b"].error), "a client's unit is refused at once"
    actor.tell(Tick(RETRY_FULL_EVERY_TICKS))  # still full: the held units stay held
    actor.tell(Transact(CallUnit(lambda db: None), recorder.reply("barrier")))
    recorder.wait(3)
    assert [name for name, _ in recorder.replies] == ["cap", "client b", "barrier"]
    assert blob_count(traced.path, b"c") == 0, "c fits, but waits behind a: order is kept"

    actor.tell(Transact(CallUnit(_cap_pages(None)), recorder.reply("space returns")))
    actor.tell(Tick(RETRY_FULL_EVERY_TICKS))
    replies = recorder.wait(6)
    names = [name for name, _ in recorder.replies]
    assert names[-2:] == ["held a", "held c"], names
    assert replies["held a"].error is None and replies["held c"].error is None
    assert blob_count(traced.path, b"a" * 200_000) == blob_count(traced.path, b"c") == 1
    assert blob_count(traced.path, b"b" * 200_000) == 0


def test_a_unit_held_for_space_gets_a_disk_full_error_when_the_actor_stops(
    actor: pykka.ActorRef[Any], traced: Database
) -> None:
    recorder = Recorder()
    actor.tell(Transact(CallUnit(_cap_pages(0)), recorder.reply("cap")))
    actor.tell(
        Transact(CallUnit(store(b"a" * 200_000)), recorder.reply("held"), hold_when_full=True)
    )
    actor.tell(Transact(CallUnit(lambda db: None), recorder.reply("barrier")))
    recorder.wait(2)
    actor.stop(block=True, timeout=WAIT_S)
    assert isinstance(recorder.wait(3)["held"].error, DiskFullError)
