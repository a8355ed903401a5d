"""One session-event page at position 10,000 of a 20,000-event record, against one at
position 100 (issue 29: at most 1.5x), and what recording a batch costs.

Pages are cut when events are stored and each keeps the checkpoint before its first
event, so a page is one primary-key range read plus its checkpoint (inline, or a
reference when large): its cost should not grow with the position. The record is built
through `record_session_events`, as the server's database actor runs it; each page is
read in one read transaction, as the reader actor reads it. Prints medians and ratios.

Run: .venv/bin/python benchmarks/bench_session_pages.py [--events 20000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pi_workflows.domain import ActiveEpochs
from pi_workflows.domain._epochs import CoordinatorGrant
from pi_workflows.domain._session_record import record_session_events
from pi_workflows.domain._view_pages import run_page
from pi_workflows.storage import (
    Database,
    NewRun,
    enqueue_run,
    insert_message,
    insert_turn,
    open_database,
    read_message,
)

SAMPLES = 100
SESSION = "session-bench"
BATCH = 250


def _turn(db: Database) -> tuple[str, str]:
    with db.write() as tx:
        enqueue_run(
            tx,
            NewRun(
                run_id="run-1",
                workflow_name="bench",
                project_path="/project",
                source_identity={"root": {"kind": "file", "path": "/p/b.workflow.py", "hash": "h"}},
                definition_digest="sha256:def",
                input_hash="sha256:input",
                input={"n": 1},
            ),
        )
        message_id = insert_message(
            tx, run_id="run-1", session_id=SESSION, kind="terminal", source_id="run-1", content={}
        )
        message = read_message(tx, message_id)
        assert message is not None
        insert_turn(tx, turn_id="turn-1", message=message)
    return message_id, "turn-1"


def _events(first: int, count: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for seq in range(first, first + count):
        match seq % 10:
            case 0:
                events.append({"seq": seq, "type": "messageStart", "role": "assistant"})
            case 9:
                events.append({"seq": seq, "type": "messageEnd", "entryId": f"e-{seq}"})
            case _:
                delta = f"words of reply {seq} " * 4
                events.append({"seq": seq, "type": "textDelta", "contentIndex": 0, "delta": delta})
    return events


def _record(db: Database, epochs: ActiveEpochs, message_id: str, total: int) -> list[float]:
    times = []
    for first in range(0, total, BATCH):
        request: Any = {
            "requestId": f"r-{first}",
            "runId": "run-1",
            "payload": {
                "sessionId": SESSION,
                "turnId": "turn-1",
                "messageId": message_id,
                "events": _events(first, BATCH),
            },
        }
        began = time.perf_counter()
        answer = record_session_events(db, request, connection_id="c-1", epochs=epochs)
        times.append(time.perf_counter() - began)
        assert answer["outcome"] == "accepted", answer
    return times


def _median(db: Database, work: Callable[[], Any]) -> float:
    for _ in range(5):
        with db.read():
            work()
    times = []
    for _ in range(SAMPLES):
        began = time.perf_counter()
        with db.read():
            work()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _sizes(db: Database) -> dict[str, int]:
    """What the record costs on disk (KiB): the events, and the checkpoints, which hold
    the whole folded conversation at each page boundary."""
    queries = {
        "events": "SELECT sum(length(payload)) FROM session_events",
        "checkpoints": "SELECT sum(b.byte_length) FROM blobs b JOIN session_pages p"
        " ON p.checkpoint_hash = b.digest",
        "copies": "SELECT sum(byte_length) FROM run_view_content",
    }
    return {name: int(db.fetch_value(sql, {}) or 0) // 1024 for name, sql in queries.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    epochs = ActiveEpochs()
    epochs.publish({SESSION: CoordinatorGrant(SESSION, "c-1", 1)})
    with tempfile.TemporaryDirectory() as folder:
        db = open_database(Path(folder) / "state.sqlite")
        try:
            message_id, _ = _turn(db)
            batches = _record(db, epochs, message_id, args.events)

            def page(position: int) -> Callable[[], Any]:
                payload = {"list": "sessionEvents", "revision": 1, "position": position}
                return lambda: run_page(db, "run-1", payload)

            near = _median(db, page(100))
            middle = _median(db, page(args.events // 2))
            sizes = _sizes(db)
        finally:
            db.close()
    print(f"record a {BATCH}-event batch: median {statistics.median(batches) * 1e3:.2f} ms")
    print(
        "stored: events {events} KiB, checkpoint blobs {checkpoints} KiB "
        "(+ their view-content copies {copies} KiB)".format(**sizes)
    )
    print(
        f"session-event page at 100: {near * 1e3:.2f} ms; at {args.events // 2} of "
        f"{args.events}: {middle * 1e3:.2f} ms ({middle / near:.2f}x)"
    )


if __name__ == "__main__":
    main()
