"""An unchanged run subscription's cost per tick against a full rebuild, in one run.

Issue 13 target: an unchanged subscription costs at most 0.05x a full rebuild. Each
tick, the subscription actor asks the reader actor to read the view with the revision
it last read; unchanged, that is one `run_view_revision` lookup (in one read
transaction, as the reader runs it), not `build_run_view` plus its encoding. Measured
twice: (1) the read itself, unchanged against a rebuild (what a changed view costs:
build and canonical encoding); (2) the whole tick through the real actors (Tick, the
reader's read, the reply) with a subscriber on a real socket, against the same with a
view that changed before every tick (one more finished attempt, its write not timed).

Run: .venv/bin/python benchmarks/bench_subscription_tick.py [--attempts 300]
"""

from __future__ import annotations

import argparse
import functools
import queue
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pi_workflows import __version__
from pi_workflows.actors._base import wait_reply
from pi_workflows.actors._database import DatabaseActor, Transact
from pi_workflows.actors._reader import ReaderActor
from pi_workflows.actors._subscriptions import (
    Subscribe,
    SubscriptionActor,
)
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import ViewSnapshot, ViewSpec
from pi_workflows.domain._view_subscriptions import read_view
from pi_workflows.storage import (
    Claim,
    Database,
    NewRun,
    claim_for_launch,
    enqueue_run,
    finish_node_attempt,
    mark_runner_live,
    open_database,
    start_node_attempt,
)
from pi_workflows.testing import CallUnit, perform_with_calls
from pi_workflows.wire._listener import ClientListener, Connection, ConnectionLimits
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.framing import SocketFrameReader
from pi_workflows.wire.protocol import RequestMessage

SAMPLES = 400
RUN_ID = "run-measured"
SPEC = ViewSpec("run", run_id=RUN_ID)
WAIT_S = 30.0


def _run(db: Database, attempts: int) -> Claim:
    """A running run with `attempts` finished compute attempts (outputs of ~200 bytes)."""
    with db.write() as tx:
        enqueue_run(
            tx,
            NewRun(
                run_id=RUN_ID,
                workflow_name="bench",
                project_path="/project",
                source_identity={"root": {"kind": "file", "path": "/p/b.workflow.py", "hash": "h"}},
                definition_digest="sha256:def",
                input_hash="sha256:input",
                input={"n": 1},
            ),
        )
        claim = claim_for_launch(
            tx, RUN_ID, owner_id="srv", runner_epoch="e1", launch_envelope_hash="h"
        ).claim
        mark_runner_live(tx, claim, runner_epoch="e1", pid=2, process_start_time=2)
    for number in range(attempts):
        with db.write() as tx:
            start_node_attempt(
                tx, claim, attempt_id=f"a{number}", node_path=f"n{number % 7}", node_type="compute"
            )
            finish_node_attempt(
                tx, claim, attempt_id=f"a{number}", output={"i": number, "pad": "x" * 200}
            )
    return claim


def _timed(work: Any) -> list[float]:
    times = []
    for _ in range(SAMPLES):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return times


def measure_reads(db: Database) -> tuple[float, float, int]:
    """Median seconds of an unchanged read and of a rebuild with its encoding."""
    with db.read():
        current = read_view(db, SPEC, -1)
    assert isinstance(current, ViewSnapshot)
    revision = current.revision

    def unchanged() -> None:
        with db.read():
            assert read_view(db, SPEC, revision) is None

    def rebuild() -> None:
        with db.read():
            built = read_view(db, SPEC, -1)
        assert isinstance(built, ViewSnapshot)
        dumps(built.payload)

    size = len(dumps(current.payload))
    return statistics.median(_timed(unchanged)), statistics.median(_timed(rebuild)), size


class _Handler:
    def __init__(self) -> None:
        self.connected: queue.Queue[Connection] = queue.Queue()

    def on_connect(self, connection: Connection) -> None:
        self.connected.put(connection)

    def on_request(self, connection: Connection, request: RequestMessage) -> None:
        raise AssertionError("this client only reads")

    def on_disconnect(self, connection: Connection) -> None:
        return None


def _on_database(database: Any, work: Any, box: Any) -> None:
    database.tell(Transact(CallUnit(work), box))


def _handled(*refs: Any) -> None:
    for ref in refs:
        ref.proxy().name.get(timeout=WAIT_S)


def measure_ticks(path: Path, db: Database, claim: Claim) -> tuple[float, float]:
    """Median seconds of one tick through the actors: unchanged, and changed each tick."""
    database = DatabaseActor.start(db, lambda name, exc: None, units=perform_with_calls)
    reader = ReaderActor.start(path, db.clock, lambda name, exc: None)
    actor = SubscriptionActor.start(reader, lambda name, exc: None)
    handler = _Handler()
    limits = ConnectionLimits(first_frame_s=3600.0)  # this client never sends a request
    listener = ClientListener(
        path.with_name("b.sock"), handler, __version__, lambda exc: None, limits=limits
    )
    listener.start()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.settimeout(WAIT_S)
        client.connect(str(path.with_name("b.sock")))
        frames = SocketFrameReader(client)
        assert frames.read_message() is not None  # hello
        connection = handler.connected.get(timeout=WAIT_S)
        while not connection.is_drained():  # the hello's write has finished
            time.sleep(0.001)
        actor.tell(Subscribe(connection, "sub-1", SPEC))
        first = frames.read_message()
        assert first is not None and first["kind"] == "runSnapshot", first
        sequence = iter(range(10**9))

        def one_tick() -> None:
            actor.tell(Tick(next(sequence)))
            _handled(actor, reader, actor)

        unchanged = statistics.median(_timed(one_tick))

        def step(db: Database, number: int) -> None:
            with db.write() as tx:
                attempt = f"b{number}"
                start_node_attempt(
                    tx, claim, attempt_id=attempt, node_path="n0", node_type="compute"
                )
                finish_node_attempt(tx, claim, attempt_id=attempt, output={"i": number})

        changed = []
        for number in range(SAMPLES):
            work = functools.partial(step, number=number)
            wait_reply(functools.partial(_on_database, database, work), WAIT_S)
            began = time.perf_counter()
            one_tick()
            changed.append(time.perf_counter() - began)
            frames.read_message()  # the event, read outside the timing
        return unchanged, statistics.median(changed)
    finally:
        client.close()
        listener.stop()
        actor.stop(block=True, timeout=10)
        reader.stop(block=True, timeout=10)
        database.stop(block=True, timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--attempts", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="piw-tick-") as folder:
        path = Path(folder) / "state.sqlite"
        db = open_database(path)
        claim = _run(db, args.attempts)
        unchanged, rebuild, size = measure_reads(db)
        print(f"run view: {args.attempts} attempts, {size / 1024:.0f} KiB encoded")
        print(f"unchanged read (revision lookup)  median {unchanged * 1e6:8.1f} us")
        print(f"full rebuild + encoding           median {rebuild * 1e6:8.1f} us")
        print(f"ratio unchanged/rebuild: {unchanged / rebuild:.3f}x (target <= 0.05x)")
        # From here the database actor owns `db`.
        tick_unchanged, tick_changed = measure_ticks(path, db, claim)
        print(f"tick through the actors, unchanged       median {tick_unchanged * 1e6:8.1f} us")
        print(f"tick through the actors, changed (patch) median {tick_changed * 1e6:8.1f} us")
        print(
            f"ratio unchanged/changed tick: {tick_unchanged / tick_changed:.3f}x"
            " (each tick includes three actor barriers, about 0.5 ms here)"
        )


if __name__ == "__main__":
    main()
