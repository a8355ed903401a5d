"""A refused request changes nothing (issue 25, items 4 and 5), over the real socket.

Refused submissions store no blob: 100 submissions of 900 KB refused while another one
validates, and the losers of a 200-submit race, leave nothing behind, and an applied
`state.prune` collects every blob no row names, whatever left it behind (here blobs a
crash of an older release would have left), while the accepted submission stays intact.
A refused `run.start` leaves no definition snapshot. A refused coordinator claim, for
each refusal reason, leaves the active coordinator active: its next submit is accepted.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.wire.canonical import dumps
from tests.conftest import write_workflow
from tests.server import origin, test_interaction_submit, test_origin_submit
from tests.server.origin import SESSION
from tests.server.runs import start_run, wait_fifo
from tests.server.test_interaction_submit import (
    AGENT,
    _rows,
    accepted_rows,
    pending_request,
    stored_value,
    submit,
)
from tests.server.test_origin_submit import Waiting

pytestmark = pytest.mark.timeout(180)

gate = test_interaction_submit.gate
running = origin.running
ask_project = origin.ask_project
waiting = test_origin_submit.waiting

REFUSED = 100
RACERS, PER_RACER = 20, 10
PLANTED = 3
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@pytest.fixture
def server(
    state_dir: Path, gate: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[WorkflowServer]:
    # No grace period: the test waits until nothing is in flight, so every unnamed blob
    # is collected at once (the default of a day protects in-flight uploads).
    monkeypatch.setenv("PI_WORKFLOWS_BLOB_GRACE_SECONDS", "0")
    instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown", 0)


def _connect(state_dir: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(state_dir / "state.sqlite", timeout=30)
    conn.execute("PRAGMA busy_timeout = 30000")
    return conn


def unnamed_blobs(state_dir: Path) -> set[str]:
    """Blobs that no row names, found independently of the server's own list: every
    column of every table whose name says it holds a hash or a digest, and every digest
    an event payload names."""
    with closing(_connect(state_dir)) as conn:
        named: set[str] = set()
        tables = [
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        for table in tables:
            if table in ("blobs", "run_view_content"):
                continue
            for column in conn.execute(f"PRAGMA table_info({table})"):
                name = str(column[1])
                if name.endswith(("_hash", "_digest")):
                    named |= {row[0] for row in conn.execute(f"SELECT {name} FROM {table}")}
        for (payload,) in conn.execute("SELECT payload FROM events"):
            named |= set(_DIGEST.findall(payload))
        return {row[0] for row in conn.execute("SELECT digest FROM blobs")} - named


def large_blobs(state_dir: Path) -> int:
    """Blobs as large as a refused output (the run's own values are far smaller; its
    runner goes on writing small ones meanwhile, so totals would race)."""
    with closing(_connect(state_dir)) as conn:
        (count,) = conn.execute("SELECT count(*) FROM blobs WHERE byte_length > 800000").fetchone()
        return int(count)


def plant_leftovers(state_dir: Path) -> set[str]:
    """Blobs an older release's refusals or a crash left behind: named by no row."""
    planted = set()
    with closing(_connect(state_dir)) as conn, conn:
        for index in range(PLANTED):
            data = f"left behind {index}".encode()
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            conn.execute(
                "INSERT INTO blobs (digest, byte_length, content, created_at) VALUES (?, ?, ?, 0)",
                (digest, len(data), data),
            )
            planted.add(digest)
    return planted


def _race(state_dir: Path, run_id: str, request_id: str) -> list[dict[str, Any]]:
    """200 submissions of distinct valid outputs from 20 connections at once."""
    answers: list[dict[str, Any]] = []
    lock = threading.Lock()
    start = threading.Barrier(RACERS)

    def racer(index: int) -> None:
        with WorkflowClient(state_dir, autostart=False, timeout=120) as client:
            start.wait(60)
            for turn in range(PER_RACER):
                n = index * PER_RACER + turn
                answer = submit(client, run_id, request_id, {"n": n}, f"race-{n}")
                with lock:
                    answers.append(answer)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(150)
    assert not any(thread.is_alive() for thread in threads), "a racer never got its answers"
    return answers


def test_refused_submissions_store_nothing_and_prune_collects_every_unnamed_blob(
    server: WorkflowServer, short_tmp: Path, gate: Path
) -> None:
    state_dir = server.state_dir
    project = short_tmp / "project"
    write_workflow(project, "ask", AGENT)
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        # A 200 KB input (and so a 200 KB `prep` output): with a 900 KB output, the
        # validation request would not fit one frame.
        run_id = start_run(client, project, "ask", {"tag": "t" * 200_000})
    request_id = pending_request(state_dir, run_id)
    with WorkflowClient(state_dir, autostart=False, timeout=120) as client:
        big = {"n": 1, "pad": "x" * 900_000}
        too_large = submit(client, run_id, request_id, big, "too-large")
    assert too_large["outcome"] == "rejected", too_large
    assert (
        too_large["error"]["message"] == "the output and the run's state are too large to validate"
    )
    assert large_blobs(state_dir) == 0, "the refusal stored nothing"
    assert _rows(state_dir, "SELECT count(*) FROM interactive_submissions") == [(0,)]

    held: list[dict[str, Any]] = []

    def validating() -> None:
        with WorkflowClient(state_dir, autostart=False, timeout=120) as client:
            held.append(submit(client, run_id, request_id, {"n": -1, "hold": True}, "held"))

    holder = threading.Thread(target=validating)
    holder.start()
    wait_fifo(gate / "announce")  # its validation child is running: the request is busy
    with WorkflowClient(state_dir, autostart=False, timeout=120) as client:
        for index in range(REFUSED):
            big = {"n": index, "pad": f"{index:04d}" + "x" * 900_000}
            answer = submit(client, run_id, request_id, big, f"big-{index}")
            assert answer["outcome"] == "rejected", answer
            assert answer["error"]["message"] == "another submission is being validated"
    assert large_blobs(state_dir) == 0, "100 refusals of 900 KB stored nothing"
    with open(gate / "gate", "w") as pipe:
        pipe.write("go")
    holder.join(60)
    assert [answer["outcome"] for answer in held] == ["rejected"], held

    answers = _race(state_dir, run_id, request_id)
    outcomes = [answer["outcome"] for answer in answers]
    assert outcomes.count("accepted") == 1, sorted(set(outcomes))
    assert set(outcomes) <= {"accepted", "rejected", "claimLost"}, sorted(set(outcomes))
    [(winner,)] = accepted_rows(state_dir, request_id)
    [accepted] = [a for a in answers if a["outcome"] == "accepted"]
    assert accepted["receipt"]["submissionId"] == winner
    value = stored_value(state_dir, request_id)

    assert unnamed_blobs(state_dir) == set(), "no refusal left a blob behind"
    planted = plant_leftovers(state_dir)
    assert unnamed_blobs(state_dir) == planted
    backup = short_tmp / "backup.sqlite"
    with WorkflowClient(state_dir, autostart=False, timeout=120) as client:
        listed = client.call("state.prune", {})
        assert listed["receipt"]["unnamedBlobs"] == PLANTED, "a dry run counts them"
        assert unnamed_blobs(state_dir) == planted, "and deletes nothing"
        pruned = client.call("state.prune", {"apply": True, "backupPath": str(backup)})
    assert pruned["outcome"] == "accepted", pruned
    assert pruned["receipt"]["treeCount"] == 0, "the run is not old enough to go"
    assert pruned["receipt"]["blobsDeleted"] == PLANTED
    assert unnamed_blobs(state_dir) == set()

    # The accepted submission is intact: its request, receipt and payload bytes.
    assert accepted_rows(state_dir, request_id) == [(winner,)]
    assert stored_value(state_dir, request_id) == value
    with closing(_connect(state_dir)) as conn:
        digest, content = conn.execute(
            "SELECT s.payload_hash, b.content FROM interactive_submissions s "
            "JOIN blobs b ON b.digest = s.payload_hash WHERE s.submission_id = ?",
            (winner,),
        ).fetchone()
    assert digest == "sha256:" + hashlib.sha256(content).hexdigest()
    assert content == dumps({"n": value["n"]})


def _fill_subscriptions(client: WorkflowClient) -> None:
    for _ in range(32):
        answer = client.request("view.subscribe", {"kind": "runList"})
        assert answer["outcome"] == "accepted", answer


REFUSALS: dict[str, tuple[dict[str, Any], str]] = {
    "tooManySubscriptions": ({"sessionId": SESSION}, "tooManySubscriptions"),
    "sessionIdInvalid": ({"sessionId": "bad\nid"}, "sessionIdInvalid"),
    "revisionInvalid": ({"sessionId": SESSION, "revision": -1}, "revisionInvalid"),
}


@pytest.mark.parametrize("reason", sorted(REFUSALS))
def test_a_refused_coordinator_claim_leaves_the_active_coordinator_active(
    waiting: Waiting, reason: str
) -> None:
    extra, code = REFUSALS[reason]
    with WorkflowClient(waiting.server.state_dir, autostart=False, timeout=60) as other:
        if reason == "tooManySubscriptions":
            _fill_subscriptions(other)
        refused = other.request(
            "view.subscribe", {"kind": "sessionView", "coordinator": True, **extra}
        )
        assert refused["outcome"] == "rejected", refused
        assert refused["error"]["code"] == code, refused
        answer = waiting.submit({"summary": "the diff adds a test"})
    assert answer["outcome"] == "accepted", answer
    assert waiting.request_row()[0] == "settled"


def test_a_refused_start_leaves_no_definition_snapshot(
    running: WorkflowServer, ask_project: Path
) -> None:
    """`run.start` stores the resolved definition's snapshot, then finds the origin
    session reserved: the refusal's receipt commits, the snapshot does not."""
    state_dir = running.state_dir
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        first = origin.start(client, ask_project, "ask", SESSION)
        assert first["outcome"] == "accepted", first
        refused = origin.start(client, ask_project, "echo", SESSION)
    assert refused["outcome"] == "rejected", refused
    assert refused["error"]["code"] == "sessionReserved"
    assert unnamed_blobs(state_dir) == set(), "the refused start's snapshot is undone"
