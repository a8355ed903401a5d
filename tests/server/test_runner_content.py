"""The server side of oversized runner replies: measured frames, blob references, parts.

Drives the runner host's own functions (the frame check, `apply_message`, the delta,
the exit policy) on a real state database with runner messages as dicts: the frame
limit applies to encoded frames only, so a test can commit outputs a runner could not
send in one frame and then watch what the server sends back.
"""

from __future__ import annotations

import base64
import hashlib
import os
from typing import Any

import msgspec
import pytest

from pi_workflows.actors._runner_host import ActiveRunner, refuse_frame
from pi_workflows.domain._runner_content import INLINE_FRAME_LIMIT
from pi_workflows.domain._runner_exits import record_exit
from pi_workflows.domain._runner_handlers import apply_message
from pi_workflows.domain._runner_launch import launch_state, prepare_launch, record_spawn
from pi_workflows.storage import Database, NewRun, enqueue_run
from pi_workflows.supervision import ChildFrame, identity_of
from pi_workflows.wire.canonical import dumps, loads
from pi_workflows.wire.framing import MAX_FRAME_BYTES
from pi_workflows.wire.protocol import LAUNCH_SCHEMA, ProtocolViolation, encode_runner_message
from pi_workflows.wire.runner import RunnerMessage

pytestmark = pytest.mark.timeout(60)

BIG = 700_000
"""Characters of one large output: two of them make a state over the frame limit."""
PART = 512 * 1024


class Runner:
    """One launched runner generation, handled as the runner host handles it."""

    def __init__(self, db: Database, run_id: str) -> None:
        plan = prepare_launch(db, run_id, "server-test")
        assert plan is not None
        self.db, self.envelope = db, plan.envelope
        self.epoch = plan.runner_epoch
        identity = identity_of(os.getpid())
        assert identity is not None
        record_spawn(db, self.epoch, identity)
        self.active = ActiveRunner(plan, identity=identity)
        self._ids = 0

    def message(
        self, kind: str, payload: dict[str, Any], attempt_id: str | None = None
    ) -> dict[str, Any]:
        self._ids += 1
        message: dict[str, Any] = {
            "schema": LAUNCH_SCHEMA,
            "kind": kind,
            "runId": self.envelope["runId"],
            "generation": self.envelope["generation"],
            "runnerEpoch": self.epoch,
            "expectedRevision": 0,
            "messageId": f"{self.epoch}-m{self._ids}",
            "payload": payload,
        }
        if attempt_id is not None:
            message["attemptId"] = attempt_id
        return message

    def handle(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        frames = self._frames(message)
        for frame in frames:  # every frame the server sends fits one runner frame
            assert len(encode_runner_message(frame, sender="server")) <= MAX_FRAME_BYTES
        return frames

    def _frames(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            frame = ChildFrame(self.epoch, _NoChannel(), RunnerMessage.from_wire(message))
        except ProtocolViolation as exc:
            frame = ChildFrame(self.epoch, _NoChannel(), None, message, str(exc))
        refusal = refuse_frame(self.active, frame)
        if refusal is not None:
            return [refusal]
        assert frame.message is not None
        handled = apply_message(self.db, self.active.view(False), frame.message)
        self.active.apply(handled.delta)
        return handled.frames

    def exit(self, returncode: int) -> str:
        return record_exit(self.db, self.active.facts(), returncode)

    def send(
        self, kind: str, payload: dict[str, Any], attempt_id: str | None = None
    ) -> list[dict[str, Any]]:
        return self.handle(self.message(kind, payload, attempt_id))

    def ready(self) -> dict[str, Any]:
        reply, command = self.send(
            "runner.ready", {"protocolVersion": 1, "definitionDigest": "sha256:" + "d" * 64}
        )
        assert reply["outcome"] == "accepted"
        assert command["kind"] == "command"
        return command

    def finish_node(self, path: str, output: Any) -> None:
        attempt = f"attempt-{path}"
        started = self.send(
            "node.started", {"nodePath": path, "nodeKind": "compute", "visit": 1}, attempt
        )
        assert started[0]["outcome"] == "accepted"
        finished = self.send("node.finished", {"nodePath": path, "output": output}, attempt)
        assert finished[0]["outcome"] == "accepted", finished

    def read(self, ref: dict[str, Any], part: int = PART) -> bytes:
        """Read a referenced value in parts, as the runner does, and verify it."""
        data = b""
        while len(data) < ref["byteCount"]:
            length = min(part, ref["byteCount"] - len(data))
            (reply,) = self.send(
                "content.read", {"digest": ref["digest"], "offset": len(data), "length": length}
            )
            assert reply["outcome"] == "accepted", reply
            assert reply["result"]["offset"] == len(data)
            data += base64.b64decode(reply["result"]["data"])
        assert "sha256:" + hashlib.sha256(data).hexdigest() == ref["digest"]
        return data


class _NoChannel:
    """The frames are returned to the test instead of sent."""

    def send(self, message: Any) -> None:
        raise AssertionError("frames are returned, not sent")

    def close(self) -> None:
        raise AssertionError("the channel is not closed here")


def _enqueue(db: Database, run_id: str = "run-big") -> str:
    with db.write() as tx:
        enqueue_run(
            tx,
            NewRun(
                run_id=run_id,
                workflow_name="big",
                project_path="/project",
                source_identity={"root": {"kind": "file", "path": "/p/big.workflow.py"}},
                definition_digest="sha256:" + "d" * 64,
                input_hash="sha256:" + "i" * 64,
                input={"n": 1},
            ),
        )
    return run_id


def _crashed_after_big_outputs(db: Database) -> tuple[str, Runner]:
    """A run whose first runner committed two large outputs and then died."""
    run_id = _enqueue(db)
    first = Runner(db, run_id)
    assert "state" in first.ready()["payload"], "a small state is sent inline"
    first.finish_node("a", {"text": "a" * BIG})
    first.finish_node("b", {"text": "b" * BIG})
    assert first.exit(-9) == "workerCrashed"
    return run_id, Runner(db, run_id)


def test_a_resume_state_over_the_frame_limit_is_sent_by_reference(db: Database) -> None:
    run_id, second = _crashed_after_big_outputs(db)
    command = second.ready()
    assert command["command"] == "resume"
    payload = command["payload"]
    assert "state" not in payload
    ref = payload["stateRef"]
    assert ref["mediaType"] == "application/json"
    assert ref["byteCount"] > MAX_FRAME_BYTES
    assert len(dumps(command)) < INLINE_FRAME_LIMIT
    state = loads(second.read(ref))
    assert state["outputs"]["a"] == {"text": "a" * BIG}
    assert state["outputs"]["b"] == {"text": "b" * BIG}
    with db.write() as tx:
        assert state == msgspec.to_builtins(launch_state(tx, run_id)[0])
    # Smaller parts work too: the runner may ask for any length up to 512 KiB.
    assert second.read(ref, part=300_000) == dumps(state)


def test_content_reads_are_bounded_failures(db: Database) -> None:
    _run_id, second = _crashed_after_big_outputs(db)
    ref = second.ready()["payload"]["stateRef"]
    digest, total = ref["digest"], ref["byteCount"]

    (past_end,) = second.send("content.read", {"digest": digest, "offset": total, "length": 1})
    assert past_end["outcome"] == "rejected"
    assert past_end["error"]["code"] == "contentUnavailable"
    assert "badRange" in past_end["error"]["message"]

    other = "sha256:" + hashlib.sha256(b"never offered").hexdigest()
    (unknown,) = second.send("content.read", {"digest": other, "offset": 0, "length": 1})
    assert unknown["outcome"] == "notFound"
    assert unknown["error"]["code"] == "contentUnavailable"

    (too_long,) = second.send("content.read", {"digest": digest, "offset": 0, "length": PART + 1})
    assert too_long["outcome"] == "rejected"
    assert too_long["error"]["code"] == "protocolRejected"

    # The last part is short: a read never returns more than there is.
    (tail,) = second.send("content.read", {"digest": digest, "offset": total - 10, "length": PART})
    assert len(base64.b64decode(tail["result"]["data"])) == 10


def test_a_stale_runner_cannot_read_content(db: Database) -> None:
    _run_id, second = _crashed_after_big_outputs(db)
    ref = second.ready()["payload"]["stateRef"]
    parked = second.send("run.parked", {"reason": "paused"})
    assert parked[0]["outcome"] == "accepted"
    (reply,) = second.send("content.read", {"digest": ref["digest"], "offset": 0, "length": 16})
    assert reply["outcome"] == "claimLost"


def test_an_oversized_reply_result_is_referenced_and_a_retry_gets_the_same_reference(
    db: Database,
) -> None:
    run_id = _enqueue(db)
    runner = Runner(db, run_id)
    runner.ready()
    big_result = {"receipt": "r" * (MAX_FRAME_BYTES + 1000)}
    first = "attempt-charge-1"
    runner.send("node.started", {"nodePath": "charge", "nodeKind": "action", "visit": 1}, first)
    key = {"effectType": "payment.charge", "idempotencyKey": "charge-key", "request": {"n": 1}}
    (reserved,) = runner.send("effect.reserve", key, first)
    assert reserved["result"]["decision"] == "proceed"
    settle = {"idempotencyKey": "charge-key", "outcome": "succeeded", "result": big_result}
    (settled,) = runner.send("effect.settle", settle, first)
    assert settled["outcome"] == "accepted"
    failed = {"nodePath": "charge", "error": {"code": "x", "message": "y"}}
    runner.send("node.failed", failed, first)

    # The next visit reserves the same key: the server adopts the applied result,
    # which does not fit in one reply.
    second = "attempt-charge-2"
    runner.send("node.started", {"nodePath": "charge", "nodeKind": "action", "visit": 2}, second)
    message = runner.message("effect.reserve", key, second)
    (adopted,) = runner.handle(message)
    assert adopted["outcome"] == "accepted"
    assert "result" not in adopted
    ref = adopted["resultRef"]
    assert ref["byteCount"] > MAX_FRAME_BYTES
    reservation = loads(runner.read(ref))
    assert reservation["decision"] == "adopt"
    assert reservation["effect"]["result"] == big_result

    (again,) = runner.handle(message)  # a retried message: the stored reply, same reference
    assert again == adopted
    assert loads(runner.read(again["resultRef"])) == reservation


def test_a_reference_in_a_stored_reply_stays_readable_for_the_same_runner(db: Database) -> None:
    run_id = _enqueue(db)
    runner = Runner(db, run_id)
    runner.ready()
    attempt = "attempt-1"
    runner.send("node.started", {"nodePath": "n", "nodeKind": "action", "visit": 1}, attempt)
    key = {"effectType": "big.fetch", "idempotencyKey": "k", "request": {}}
    runner.send("effect.reserve", key, attempt)
    runner.send(
        "effect.settle",
        {"idempotencyKey": "k", "outcome": "succeeded", "result": "z" * MAX_FRAME_BYTES},
        attempt,
    )
    message = runner.message("effect.reserve", key, attempt)
    (reply,) = runner.handle(message)
    ref = reply["resultRef"]
    runner.active.offered.clear()  # as if only the stored reply were left
    (again,) = runner.handle(message)
    assert again["resultRef"] == ref
    assert loads(runner.read(ref))["effect"]["result"] == "z" * MAX_FRAME_BYTES


def _kept_replies(db: Database, epoch: str) -> int:
    return int(
        db.fetch_value("SELECT count(*) FROM runner_messages WHERE runner_epoch = :e", {"e": epoch})
    )


def test_a_repeat_gets_its_reply_while_the_epoch_lives_and_the_fence_after_it_ends(
    db: Database,
) -> None:
    run_id = _enqueue(db)
    runner = Runner(db, run_id)
    runner.ready()
    started = runner.message(
        "node.started", {"nodePath": "n", "nodeKind": "compute", "visit": 1}, "attempt-n"
    )
    (reply,) = runner.handle(started)
    assert reply["outcome"] == "accepted"
    revision = db.fetch_value("SELECT revision FROM runs WHERE run_id = :r", {"r": run_id})

    (again,) = runner.handle(started)  # the reply was lost: the runner repeats the message
    assert again == reply, "a repeat within a live generation gets its recorded reply"
    assert db.fetch_value("SELECT revision FROM runs WHERE run_id = :r", {"r": run_id}) == revision
    assert _kept_replies(db, runner.epoch) == 2  # runner.ready and node.started

    assert runner.exit(-9) == "workerCrashed"  # the generation ends: the run is requeued
    assert _kept_replies(db, runner.epoch) == 0, "an ended epoch's replies are not kept"
    ended = db.fetch_value("SELECT revision FROM runs WHERE run_id = :r", {"r": run_id})

    # The runner host no longer knows the epoch: the repeat is refused before the database.
    frame = ChildFrame(runner.epoch, _NoChannel(), RunnerMessage.from_wire(started))
    refused = refuse_frame(None, frame)
    assert refused is not None and refused["outcome"] == "claimLost"
    # Even a repeat that reached the database would meet the claim fence, unanswered by
    # a reply and changing nothing.
    (fenced,) = apply_message(
        db, runner.active.view(False), RunnerMessage.from_wire(started)
    ).frames
    assert fenced["outcome"] == "claimLost"
    assert db.fetch_value("SELECT revision FROM runs WHERE run_id = :r", {"r": run_id}) == ended
    assert _kept_replies(db, runner.epoch) == 0
