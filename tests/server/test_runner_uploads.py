"""The server side of values a runner sends by reference (issue 11, item 3).

`content.write` stores one part as a blob; `effect.settle`, `node.finished` and
`run.finished` may then name the whole value with an `uploadRef`. The server reads the
parts back, checks them, and records the value exactly as if it had come inline; a
reference that does not check out is refused and changes nothing. Driven through
`apply_message` on a real state database, as `test_runner_content` does.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from pi_workflows.storage import (
    Database,
    get_run,
    read_json_blob,
    read_resume_state,
)
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.framing import MAX_FRAME_BYTES
from tests.server.test_runner_content import PART, Runner, _enqueue

pytestmark = pytest.mark.timeout(60)


RESULT = {"exitCode": 0, "stdout": "\x00" * 200_000, "stderr": "", "truncated": False}
"""200 KB of NUL bytes: 1.2 MB of JSON, more than one frame holds."""


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _upload(runner: Runner, data: bytes) -> dict[str, Any]:
    parts = []
    for offset in range(0, len(data), PART):
        part = data[offset : offset + PART]
        (reply,) = runner.send("content.write", {"data": base64.b64encode(part).decode()})
        assert reply["outcome"] == "accepted", reply
        assert reply["result"] == {"digest": _digest(part)}
        parts.append(_digest(part))
    return {
        "mediaType": "application/json",
        "byteCount": len(data),
        "digest": _digest(data),
        "parts": parts,
    }


def _applying(runner: Runner, attempt: str = "attempt-sh") -> None:
    started = {"nodePath": "noise", "nodeKind": "shell", "visit": 1}
    assert runner.send("node.started", started, attempt)[0]["outcome"] == "accepted"
    reserve = {"effectType": "shell", "idempotencyKey": "k", "request": {"argv": ["x"]}}
    (reserved,) = runner.send("effect.reserve", reserve, attempt)
    assert reserved["result"]["decision"] == "proceed"


def _effect(db: Database) -> tuple[str, str | None]:
    row = db.connection.execute("SELECT state, result_hash FROM effects").fetchone()
    return row[0], row[1]


def test_a_result_by_reference_settles_finishes_the_node_and_the_run(db: Database) -> None:
    run_id = _enqueue(db)
    runner = Runner(db, run_id)
    runner.ready()
    _applying(runner)
    data = dumps(RESULT)
    assert len(data) > MAX_FRAME_BYTES
    ref = _upload(runner, data)
    settle = {"idempotencyKey": "k", "outcome": "succeeded", "resultRef": ref}
    (settled,) = runner.send("effect.settle", settle, "attempt-sh")
    assert settled["outcome"] == "accepted", settled
    state, result_hash = _effect(db)
    assert state == "applied" and result_hash == ref["digest"]
    assert read_json_blob(db, ref["digest"]) == RESULT, "recorded exactly as if inline"

    finished = {"nodePath": "noise", "outputRef": ref}
    assert runner.send("node.finished", finished, "attempt-sh")[0]["outcome"] == "accepted"
    assert read_resume_state(db, run_id).outputs["noise"] == RESULT

    (done,) = runner.send("run.finished", {"status": "completed", "outputRef": ref})
    assert done["outcome"] == "accepted", done
    run = get_run(db, run_id)
    assert run is not None and run.status == "completed"
    payload = db.connection.execute(
        "SELECT payload FROM events WHERE event_type = 'run_completed'"
    ).fetchone()[0]
    assert ref["digest"] in payload and len(payload) < 1000, "the event row stays small"


def _refused(runner: Runner, ref: dict[str, Any]) -> dict[str, Any]:
    settle = {"idempotencyKey": "k", "outcome": "succeeded", "resultRef": ref}
    (reply,) = runner.send("effect.settle", settle, "attempt-sh")
    assert reply["outcome"] == "rejected", reply
    assert reply["error"]["code"] == "contentRejected"
    assert "\x00" not in reply["error"]["message"]
    return reply


def test_a_reference_that_does_not_check_out_is_refused_and_changes_nothing(
    db: Database,
) -> None:
    run_id = _enqueue(db)
    runner = Runner(db, run_id)
    runner.ready()
    _applying(runner)
    data = dumps(RESULT)
    ref = _upload(runner, data)
    first, *rest = ref["parts"]
    other = _digest(b"never written")
    for broken in (
        {**ref, "digest": other},  # the parts are another value
        {**ref, "byteCount": ref["byteCount"] - 1},  # the last part's length
        {**ref, "parts": rest},  # too few parts for the byte count
        {**ref, "parts": [other, *rest]},  # a part this runner never wrote
        {**ref, "parts": [rest[0], first, *rest[1:]]},  # the parts out of order
    ):
        _refused(runner, broken)
    assert _effect(db) == ("applying", None), "a refused settlement records nothing"
    (settled,) = runner.send(
        "effect.settle",
        {"idempotencyKey": "k", "outcome": "succeeded", "resultRef": ref},
        "attempt-sh",
    )
    assert settled["outcome"] == "accepted", "the right reference still settles it"


def test_bytes_that_are_not_json_are_refused(db: Database) -> None:
    run_id = _enqueue(db)
    runner = Runner(db, run_id)
    runner.ready()
    _applying(runner)
    _refused(runner, _upload(runner, b"{" * (PART + 10)))


def test_another_runners_parts_cannot_be_named(db: Database) -> None:
    """Parts are content-addressed, so only the runner that wrote them may name them:
    a digest alone (of another run's content) never becomes this run's value."""
    other_run = Runner(db, _enqueue(db, "run-other"))
    other_run.ready()
    stolen = _upload(other_run, dumps(RESULT))
    runner = Runner(db, _enqueue(db))
    runner.ready()
    _applying(runner)
    _refused(runner, stolen)


def test_a_part_that_is_not_a_bounded_base64_part_is_refused(db: Database) -> None:
    runner = Runner(db, _enqueue(db))
    runner.ready()
    (not_base64,) = runner.send("content.write", {"data": "!!!!"})
    assert not_base64["outcome"] == "rejected"
    oversized = base64.b64encode(b"x" * (PART + 3)).decode()
    (too_long,) = runner.send("content.write", {"data": oversized})
    assert too_long["outcome"] == "rejected"


def test_a_stale_runner_cannot_write_content(db: Database) -> None:
    runner = Runner(db, _enqueue(db))
    runner.ready()
    assert runner.send("run.parked", {"reason": "paused"})[0]["outcome"] == "accepted"
    (reply,) = runner.send("content.write", {"data": base64.b64encode(b"late").decode()})
    assert reply["outcome"] == "claimLost"
    stored = db.connection.execute("SELECT 1 FROM blobs WHERE digest = ?", (_digest(b"late"),))
    assert stored.fetchone() is None
