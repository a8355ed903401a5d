"""The server side of the runner protocol: launch, message handling, exit outcomes.

Implements workflow-server.md § Runner lifecycle, § Runner protocol, § Failure
classification and § Pause and cancellation. Runners propose; this module disposes:
every accepted message is one protected write under the host claim of that runner's
generation, with its reply stored for retries. Every method runs on the database
actor's thread, which owns `RunnerHost` state.
"""

from __future__ import annotations

import base64
import json
import logging
import signal
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from pi_workflows.storage import (
    Claim,
    ClaimHeldError,
    ClaimLostError,
    ContentUnavailableError,
    Database,
    EffectConflictError,
    FailureClass,
    InvalidTransitionError,
    ParkReason,
    RevisionConflictError,
    RunnerOutcome,
    RunNotFoundError,
    Tx,
    claim_for_launch,
    complete_run,
    count_runner_outcomes,
    declare_effect_ambiguous,
    fail_node_attempt,
    fail_run,
    finish_node_attempt,
    forget_recorded_process,
    forget_recorded_processes,
    get_run,
    lookup_runner_reply,
    mark_runner_live,
    open_checkpoint_decision,
    park_run,
    protected_write,
    put_blob,
    read_blob_part,
    read_continuation,
    read_resume_state,
    record_process,
    record_runner_exit,
    record_runner_reply,
    renew_claim,
    requeue_run,
    reserve_effect,
    retry_effect_after_read_back,
    runner_made_progress,
    settle_effect,
    start_node_attempt,
    time_out_run,
    unfinished_attempt,
    wait_run,
)
from pi_workflows.supervision import ProcessIdentity, identity_of, signal_group
from pi_workflows.wire.canonical import dumps, sha256_digest
from pi_workflows.wire.framing import MAX_FRAME_BYTES
from pi_workflows.wire.protocol import LAUNCH_SCHEMA, ProtocolViolation, runner_message_from_wire

__all__ = [
    "CONTENT_MEDIA_TYPE",
    "INLINE_FRAME_LIMIT",
    "STARTUP_DEADLINE_MS",
    "ActiveRunner",
    "RunnerHost",
]

log = logging.getLogger(__name__)

MAX_RUNNER_CRASHES = 3
"""Crashed runner epochs after which a run parks with `workerCrashed` instead of requeuing."""

STARTUP_DEADLINE_MS = 20_000
"""A runner must send `runner.ready` this long after its launch was recorded."""

PROTOCOL_VERSION = 1

INLINE_FRAME_LIMIT = MAX_FRAME_BYTES - 64 * 1024
"""The largest encoded reply or command sent whole; a larger one carries its result (or
state) as a digest-bound blob reference that the runner reads with `content.read`."""

CONTENT_MEDIA_TYPE = "application/json"
"""The media type of every referenced value: the canonical JSON of the logical result."""


@dataclass
class ActiveRunner:
    """One launched runner generation, as the server knows it. Internal."""

    run_id: str
    runner_epoch: str
    claim: Claim = field(repr=False)
    envelope: dict[str, Any]
    command: str
    launched_at: int
    identity: ProcessIdentity | None = None
    ready: bool = False
    settled: bool = False
    """True once the run left `running` through this runner (or a command fenced it)."""
    stop_requested: bool = False
    timed_out_attempt: str | None = None
    """The attempt whose node deadline passed, if that is why the runner was stopped."""
    registered: dict[int, ProcessIdentity] = field(default_factory=dict)
    """Process groups the runner registered (its shell commands), by PID."""
    offered: set[str] = field(default_factory=set)
    """Digests of the content references sent to this runner: all it may `content.read`."""


@dataclass
class LaunchPlan:
    """What the process supervisor needs to start one runner."""

    runner_epoch: str
    envelope: dict[str, Any]
    project_path: str


class RunnerHost:
    """Server-side bookkeeping of live runners (database-actor thread only)."""

    def __init__(self, owner_id: str) -> None:
        self.owner_id = owner_id
        self.active: dict[str, ActiveRunner] = {}

    # --- queries used by operations ------------------------------------------------------

    def claim_of(self, run_id: str) -> Claim | None:
        """The host claim of the live runner of `run_id`, if any."""
        runner = self.runner_of(run_id)
        return runner.claim if runner is not None else None

    def runner_of(self, run_id: str) -> ActiveRunner | None:
        """The live runner of `run_id`, if any.

        A settled runner (fenced by a pause or cancel, or done with the run) that has not
        exited yet is not it: its claim is released, so a resume or cancel right after a
        pause must not present that claim, and a new generation's runner may exist beside it.
        """
        return next((r for r in self.active.values() if r.run_id == run_id and not r.settled), None)

    def fence(self, run_id: str) -> ProcessIdentity | None:
        """A command took the run away from its runner: mark it and return whom to stop."""
        runner = self.runner_of(run_id)
        if runner is None:
            return None
        runner.settled = True
        runner.stop_requested = True
        _kill_registered(runner)
        return runner.identity

    def live_count(self) -> int:
        """Runners launched and not yet exited."""
        return len(self.active)

    # --- launch --------------------------------------------------------------------------

    def prepare_launch(self, db: Database, run_id: str) -> LaunchPlan | None:
        """Claim a queued run for a new runner generation and build its launch envelope.

        **Durability:** the claim, the new generation and the `starting` runner epoch
        commit before the caller spawns anything, so a crash leaves a record to reap.
        """
        run = get_run(db, run_id)
        if run is None:
            return None
        runner_epoch = f"runner-{uuid.uuid4().hex}"
        generation = run.generation + 1
        source = json.loads(run.source_identity)
        envelope = {
            "schema": LAUNCH_SCHEMA,
            "runId": run_id,
            "generation": generation,
            "runnerEpoch": runner_epoch,
            "projectPath": run.project_path,
            "workflowSource": source,
            "definitionDigest": run.definition_digest,
            "inputHash": run.input_hash,
            "protocolVersion": PROTOCOL_VERSION,
        }
        state = read_resume_state(db, run_id)
        if run.continuation_of is not None:
            command = "continue"
        else:
            command = "resume" if state.completed else "start"
        with db.write() as tx:
            launched = claim_for_launch(
                tx,
                run_id,
                owner_id=self.owner_id,
                runner_epoch=runner_epoch,
                launch_envelope_hash=sha256_digest(envelope),
            )
        if launched.claim.generation != generation:  # never expected: the claim decides
            envelope["generation"] = launched.claim.generation
        self.active[runner_epoch] = ActiveRunner(
            run_id, runner_epoch, launched.claim, envelope, command, db.clock.now_ms()
        )
        return LaunchPlan(runner_epoch, envelope, run.project_path)

    def spawned(self, db: Database, runner_epoch: str, identity: ProcessIdentity) -> None:
        """The process supervisor started the runner: record its exact identity durably.

        A server that dies after this commit leaves a record its successor stops by
        identity; before it, the runner is bound to this server's channel and the zygote
        and ends with them.
        """
        runner = self.active.get(runner_epoch)
        if runner is None:
            return
        runner.identity = identity
        with db.write() as tx:
            record_process(
                tx,
                runner_epoch,
                pid=identity.pid,
                start_ticks=identity.start_ticks,
                boot_id=identity.boot_id,
                role="runner",
            )

    def overdue(self, db: Database) -> list[ProcessIdentity]:
        """Runners past a deadline: the startup handshake, or their node's resolved deadline.

        They are stopped, then reaped; `on_exit` records `timedOut` and, for a node
        deadline, ends that attempt as `timed_out` so the next runner routes it.
        """
        now = db.clock.now_ms()
        late = []
        for runner in self.active.values():
            if runner.stop_requested or runner.settled or runner.identity is None:
                continue
            if not runner.ready:
                if now - runner.launched_at > STARTUP_DEADLINE_MS:
                    runner.stop_requested = True
                    late.append(runner.identity)
                continue
            attempt = unfinished_attempt(db, runner.run_id)
            if (
                attempt is not None
                and attempt.deadline_at is not None
                and now > attempt.deadline_at
            ):
                runner.stop_requested = True
                runner.timed_out_attempt = attempt.attempt_id
                late.append(runner.identity)
        return late

    # --- messages ------------------------------------------------------------------------

    def handle_message(
        self, db: Database, runner_epoch: str, raw: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """Check and apply one runner message; return the frames to send back (reply first)."""
        runner = self.active.get(runner_epoch)
        try:
            message = runner_message_from_wire(raw, sender="runner")
        except ProtocolViolation as exc:
            return [self._reply(runner, raw, "rejected", error=("protocolRejected", str(exc)))]
        # Generation and epoch first, before the payload is read (stale runner: claim loss).
        if (
            runner is None
            or runner.settled
            or message["runnerEpoch"] != runner_epoch
            or message["runId"] != runner.run_id
            or message["generation"] != runner.claim.generation
        ):
            return [self._reply(runner, message, "claimLost", error=("claimLost", "stale runner"))]
        if message["kind"] == "content.read":
            return [self._read_content(db, runner, message)]  # a read: no receipt
        fingerprint = sha256_digest(message)
        stored = lookup_runner_reply(db, runner_epoch, message["messageId"], fingerprint)
        if stored is not None:
            ref = stored.get("resultRef")
            if ref is not None:  # a retry gets the same reference, still readable
                runner.offered.add(ref["digest"])
            return [stored]
        try:
            frames = self._apply(db, runner, message, fingerprint)
        except ClaimLostError as exc:
            runner.settled = True
            log.info(
                "runner lost its claim",
                extra={
                    "action": "runner.claim_lost",
                    "run_id": runner.run_id,
                    "generation": runner.claim.generation,
                    "reason": exc.reason,
                },
            )
            return [self._reply(runner, message, "claimLost", error=("claimLost", exc.reason))]
        except RevisionConflictError:
            return [
                self._reply(
                    runner, message, "conflict", error=("revisionConflict", "stale revision")
                )
            ]
        except EffectConflictError as exc:
            return [self._reply(runner, message, "conflict", error=("effectConflict", str(exc)))]
        except (InvalidTransitionError, RunNotFoundError, ClaimHeldError) as exc:
            return [self._reply(runner, message, "rejected", error=("protocolRejected", str(exc)))]
        return frames

    def _apply(
        self, db: Database, runner: ActiveRunner, message: dict[str, Any], fingerprint: str
    ) -> list[dict[str, Any]]:
        kind = message["kind"]
        handler = _HANDLERS.get(kind)
        if handler is None:
            return [self._reply(runner, message, "rejected", error=("protocolRejected", kind))]
        extra: list[dict[str, Any]] = []
        with db.write() as tx:
            revision, result = handler(tx, runner, message, extra)
            reply = self._reply(runner, message, "accepted", revision=revision, result=result)
            # Measure every frame before it is stored or sent: an oversized result is
            # stored as a blob in this transaction, and the frame carries its reference.
            reply = _bounded(tx, runner, reply)
            extra = [_bounded(tx, runner, frame) for frame in extra]
            record_runner_reply(
                tx, runner.runner_epoch, message["messageId"], kind, fingerprint, reply
            )
        return [reply, *extra]

    def _read_content(
        self, db: Database, runner: ActiveRunner, message: dict[str, Any]
    ) -> dict[str, Any]:
        """One bounded part of a value this runner was sent by reference (base64)."""
        payload = message["payload"]
        digest, offset, length = payload["digest"], payload["offset"], payload["length"]
        if digest not in runner.offered:
            return self._reply(
                runner,
                message,
                "notFound",
                error=("contentUnavailable", f"content {digest} was not offered to this runner"),
            )
        try:
            part = read_blob_part(db, digest, offset, length)
        except ContentUnavailableError as exc:
            outcome = "notFound" if exc.reason == "notFound" else "rejected"
            return self._reply(runner, message, outcome, error=("contentUnavailable", str(exc)))
        except ValueError as exc:  # a length outside 1..512 KiB
            return self._reply(runner, message, "rejected", error=("contentUnavailable", str(exc)))
        result = {"offset": offset, "data": base64.b64encode(part).decode("ascii")}
        return self._reply(runner, message, "accepted", result=result)

    def _reply(
        self,
        runner: ActiveRunner | None,
        message: dict[str, Any],
        outcome: str,
        *,
        revision: int | None = None,
        result: Any = None,
        error: tuple[str, str] | None = None,
    ) -> dict[str, Any]:
        reply: dict[str, Any] = {
            "schema": LAUNCH_SCHEMA,
            "kind": "reply",
            "runId": str(message.get("runId") or (runner.run_id if runner else "unknown")),
            "generation": int(message.get("generation") or 0),
            "runnerEpoch": str(message.get("runnerEpoch") or "unknown"),
            "replyTo": str(message.get("messageId") or "unknown"),
            "outcome": outcome,
        }
        if revision is not None:
            reply["revision"] = revision
        if result is not None:
            reply["result"] = result
        if error is not None:
            reply["error"] = {"code": error[0], "message": error[1][:1000]}
        return reply

    def hand_back_all(self, db: Database) -> int:
        """At a graceful stop: requeue every run a live runner holds and close its epoch.

        The process supervisor kills the groups next, so each runner's one terminal
        outcome (`cancelled`) is recorded here; the next server resumes the runs from
        their last durable boundary.
        """
        handed = 0
        for epoch, runner in list(self.active.items()):
            del self.active[epoch]
            _kill_registered(runner)  # shell groups live in sessions of their own
            with db.write() as tx:
                # The recorded identities stay: the runners are killed only after this
                # commit, so if this server dies in between, the next one stops them.
                if not runner.settled:
                    try:
                        requeue_run(tx, runner.run_id, reason="serverStopping", claim=runner.claim)
                        handed += 1
                    except (ClaimLostError, InvalidTransitionError):
                        pass  # already handed off or finished: nothing to give back
                record_runner_exit(tx, epoch, outcome=RunnerOutcome.CANCELLED)
        return handed

    # --- exits ---------------------------------------------------------------------------

    def on_exit(self, db: Database, runner_epoch: str, returncode: int, killed: bool) -> str:
        """Record the runner's one terminal outcome and decide what the run does next.

        Returns a short reason for logs. A runner exit alone is never a run failure.
        """
        runner = self.active.pop(runner_epoch, None)
        if runner is None:
            return "unknown runner"
        _kill_registered(runner)  # the server reaps what a dead runner registered
        exit_code = returncode if returncode >= 0 else None
        signal_number = -returncode if returncode < 0 else None
        if runner.settled:
            outcome = RunnerOutcome.CANCELLED if runner.stop_requested else RunnerOutcome.EXITED
            with db.write() as tx:
                forget_recorded_processes(tx, runner_epoch)
                record_runner_exit(
                    tx, runner_epoch, outcome=outcome, exit_code=exit_code, signal=signal_number
                )
            return outcome.value
        outcome = RunnerOutcome.TIMED_OUT if runner.stop_requested else RunnerOutcome.CRASHED
        with db.write() as tx:
            forget_recorded_processes(tx, runner_epoch)
            record_runner_exit(
                tx, runner_epoch, outcome=outcome, exit_code=exit_code, signal=signal_number
            )
            no_progress = not runner_made_progress(tx, runner_epoch)
            try:
                if runner.timed_out_attempt is not None:
                    # The node ran out of time: end its attempt as timed_out (a durable
                    # boundary) and let the next runner route `$result.outcome`.
                    fail_node_attempt(
                        tx,
                        runner.claim,
                        attempt_id=runner.timed_out_attempt,
                        error="nodeTimedOut: the node exceeded its deadline",
                        timed_out=True,
                    )
                    requeue_run(tx, runner.run_id, reason="nodeTimedOut", claim=runner.claim)
                    return "nodeTimedOut"
                if no_progress:
                    park_run(tx, runner.claim, reason=ParkReason.RUNNER_NO_PROGRESS)
                    return "runnerNoProgress"
                if count_runner_outcomes(tx, runner.run_id, "crashed") >= MAX_RUNNER_CRASHES:
                    # Progress, then a crash, again and again: stop the loop for review.
                    park_run(tx, runner.claim, reason="workerCrashed")
                    return "workerCrashed"
                requeue_run(tx, runner.run_id, reason="workerCrashed", claim=runner.claim)
            except (ClaimLostError, InvalidTransitionError):
                return "claim already gone"  # claim loss is a handoff: no terminal event
        return "workerCrashed"


def launch_state(reader: Tx, run_id: str) -> tuple[dict[str, Any], str | None]:
    """The durable state a runner starts from, and the checkpoint attempt it continues.

    A continuation run continues its whole chain: the finished attempts of every
    ancestor come first, the answered checkpoint's output is its answer, and the run's
    own attempts (if an earlier runner of it crashed) come last.
    """
    chain: list[str] = []
    answers: dict[str, Any] = {}
    parent_attempt: str | None = None
    current: str | None = run_id
    while current is not None:
        chain.append(current)
        row = get_run(reader, current)
        continued = read_continuation(reader, current) if row and row.continuation_of else None
        if continued is not None:
            decision, answer = continued
            answers.setdefault(decision.node_path, answer)
            if current == run_id:
                parent_attempt = decision.attempt_id
        current = row.continuation_of if row is not None else None
    merged: dict[str, Any] = {}
    for ancestor in reversed(chain):
        wire = read_resume_state(reader, ancestor).to_wire()
        if not merged:
            merged = wire
            continue
        merged["outputs"].update(wire["outputs"])
        for path, count in wire["visits"].items():
            merged["visits"][path] = merged["visits"].get(path, 0) + count
        merged["finished"].extend(wire["finished"])
        merged["unfinished"] = wire["unfinished"]
    merged["outputs"].update(answers)
    merged["runId"] = run_id
    return merged, parent_attempt


def _reference(tx: Tx, runner: ActiveRunner, value: Any) -> dict[str, Any]:
    """Store `value` as a canonical JSON blob and return its wire `contentRef`."""
    data = dumps(value)
    digest = put_blob(tx, data)
    runner.offered.add(digest)
    return {"mediaType": CONTENT_MEDIA_TYPE, "byteCount": len(data), "digest": digest}


def _bounded(tx: Tx, runner: ActiveRunner, frame: dict[str, Any]) -> dict[str, Any]:
    """`frame` itself when it fits inline; else its large part replaced by a reference.

    A reply's `result` becomes `resultRef`; a command's `payload.state` becomes
    `payload.stateRef`. Nothing else in a frame grows with run data.
    """
    if len(dumps(frame)) <= INLINE_FRAME_LIMIT:
        return frame
    if frame["kind"] == "reply" and "result" in frame:
        bounded = {key: value for key, value in frame.items() if key != "result"}
        bounded["resultRef"] = _reference(tx, runner, frame["result"])
        return bounded
    payload = frame.get("payload")
    if frame["kind"] == "command" and isinstance(payload, dict) and "state" in payload:
        smaller = {key: value for key, value in payload.items() if key != "state"}
        smaller["stateRef"] = _reference(tx, runner, payload["state"])
        return {**frame, "payload": smaller}
    return frame


def _kill_registered(runner: ActiveRunner) -> None:
    for identity in runner.registered.values():
        signal_group(identity, signal.SIGKILL)
    runner.registered.clear()


# --- message handlers: (tx, runner, message, extra frames) -> (revision, result) ---

Handler = Callable[[Tx, ActiveRunner, dict[str, Any], list[dict[str, Any]]], tuple[int, Any]]


def _on_ready(
    tx: Tx,
    runner: ActiveRunner,
    message: dict[str, Any],
    extra: list[dict[str, Any]],
) -> tuple[int, Any]:
    identity = runner.identity
    result = mark_runner_live(
        tx,
        runner.claim,
        runner_epoch=runner.runner_epoch,
        pid=identity.pid if identity else None,
        process_start_time=identity.start_ticks if identity else None,
    )
    runner.ready = True
    state, parent_attempt = launch_state(tx, runner.run_id)
    payload: dict[str, Any] = {"state": state}
    if runner.command == "continue" and parent_attempt is not None:
        payload["parentAttemptId"] = parent_attempt
    extra.append(
        {
            "schema": LAUNCH_SCHEMA,
            "kind": "command",
            "runId": runner.run_id,
            "generation": runner.claim.generation,
            "runnerEpoch": runner.runner_epoch,
            "expectedRevision": result.revision,
            "messageId": f"command-{runner.runner_epoch}",
            "command": runner.command,
            "payload": payload,
        }
    )
    return result.revision, None


def _on_node_started(
    tx: Tx,
    runner: ActiveRunner,
    message: dict[str, Any],
    extra: list[dict[str, Any]],
) -> tuple[int, Any]:
    payload = message["payload"]
    timeout_ms = payload.get("timeoutMs")
    started = start_node_attempt(
        tx,
        runner.claim,
        attempt_id=message["attemptId"],
        node_path=payload["nodePath"],
        node_type=payload["nodeKind"],
        deadline_at=tx.now + timeout_ms if timeout_ms else None,
    )
    return started.revision, {"visit": started.visit}


def _on_node_finished(
    tx: Tx,
    runner: ActiveRunner,
    message: dict[str, Any],
    extra: list[dict[str, Any]],
) -> tuple[int, Any]:
    payload = message["payload"]
    route = payload.get("route")
    result = finish_node_attempt(
        tx,
        runner.claim,
        attempt_id=message["attemptId"],
        output=payload["output"],
        next_node_path=route,
        payload={"nodePath": payload["nodePath"], **({"route": route} if route else {})},
    )
    return result.revision, None


def _on_node_failed(
    tx: Tx,
    runner: ActiveRunner,
    message: dict[str, Any],
    extra: list[dict[str, Any]],
) -> tuple[int, Any]:
    error = message["payload"]["error"]
    result = fail_node_attempt(
        tx,
        runner.claim,
        attempt_id=message["attemptId"],
        error=f"{error['code']}: {error['message']}"[:4000],
        timed_out=error["code"] == "nodeTimedOut",
    )
    return result.revision, None


def _on_effect_reserve(
    tx: Tx,
    runner: ActiveRunner,
    message: dict[str, Any],
    extra: list[dict[str, Any]],
) -> tuple[int, Any]:
    payload = message["payload"]
    reservation = reserve_effect(
        tx,
        runner.claim,
        attempt_id=message["attemptId"],
        effect_type=payload["effectType"],
        idempotency_key=payload["idempotencyKey"],
        request=payload["request"],
        executor_epoch=runner.runner_epoch,
        idempotent=payload.get("idempotent", False),
    )
    return reservation.revision, reservation.to_wire()


def _on_effect_settle(
    tx: Tx,
    runner: ActiveRunner,
    message: dict[str, Any],
    extra: list[dict[str, Any]],
) -> tuple[int, Any]:
    payload = message["payload"]
    key = payload["idempotencyKey"]
    outcome = payload["outcome"]
    read_back = payload.get("readBack")
    if outcome == "ambiguous":
        record = declare_effect_ambiguous(
            tx, runner.claim, idempotency_key=key, reason="no read-back after an uncertain apply"
        )
    elif read_back == "notApplied":
        retried = retry_effect_after_read_back(
            tx, runner.claim, idempotency_key=key, executor_epoch=runner.runner_epoch
        )
        return retried.revision, retried.to_wire()
    else:
        error = payload.get("error")
        record = settle_effect(
            tx,
            runner.claim,
            idempotency_key=key,
            outcome="applied" if outcome == "succeeded" else "rejected",
            result=payload.get("result"),
            error=f"{error['code']}: {error['message']}" if error else None,
            executor_epoch=runner.runner_epoch,
            proven_by_read_back=read_back == "applied",
        )
    return record.revision, {"state": record.state.value}


def _on_notification(
    tx: Tx,
    runner: ActiveRunner,
    message: dict[str, Any],
    extra: list[dict[str, Any]],
) -> tuple[int, Any]:
    payload = message["payload"]
    written = protected_write(
        tx,
        runner.claim,
        event_type="notification.requested",
        payload={"notificationId": payload["notificationId"], "content": payload["content"]},
    )
    return written.revision, None


def _on_run_parked(
    tx: Tx,
    runner: ActiveRunner,
    message: dict[str, Any],
    extra: list[dict[str, Any]],
) -> tuple[int, Any]:
    reason = message["payload"]["reason"]
    if reason == "checkpoint":
        attempt_id = message.get("attemptId")
        finished = read_resume_state(tx, runner.run_id)
        last = finished.last_finished
        node_path = last.node_path if last is not None else "checkpoint"
        output = finished.outputs.get(node_path)
        request = {"summary": output.get("summary") if isinstance(output, dict) else None}

        def open_decision(tx: Tx) -> None:
            open_checkpoint_decision(
                tx, runner.run_id, attempt_id=attempt_id, node_path=node_path, request=request
            )

        result = wait_run(tx, runner.claim, reason="checkpoint", change=open_decision)
    else:
        result = park_run(tx, runner.claim, reason=reason)
    runner.settled = True
    return result.revision, None


def _on_run_finished(
    tx: Tx,
    runner: ActiveRunner,
    message: dict[str, Any],
    extra: list[dict[str, Any]],
) -> tuple[int, Any]:
    payload = message["payload"]
    status = payload["status"]
    if status == "completed":
        result = complete_run(
            tx, runner.run_id, claim=runner.claim, payload={"output": payload["output"]}
        )
    elif status == "timed_out":
        result = time_out_run(
            tx, runner.run_id, reason=payload["error"]["message"][:4000], claim=runner.claim
        )
    else:
        error = payload.get("error") or {"code": "nodeFailed", "message": status}
        result = fail_run(
            tx,
            runner.run_id,
            failure_class=FailureClass.NODE_FAILED,
            reason=f"{error['code']}: {error['message']}"[:4000],
            claim=runner.claim,
        )
    runner.settled = True
    return result.revision, None


def _on_exiting(
    tx: Tx,
    runner: ActiveRunner,
    message: dict[str, Any],
    extra: list[dict[str, Any]],
) -> tuple[int, Any]:
    # Nothing changes: the exit itself is recorded when the process is reaped.
    run = get_run(tx, runner.run_id)
    return (run.revision if run is not None else 0), None


def _on_progress(
    tx: Tx,
    runner: ActiveRunner,
    message: dict[str, Any],
    extra: list[dict[str, Any]],
) -> tuple[int, Any]:
    payload = message["payload"]
    pid = int(payload["pid"])
    run = get_run(tx, runner.run_id)
    revision = run.revision if run is not None else 0
    if payload["operation"] == "process.unregister":
        runner.registered.pop(pid, None)  # valid even after the claim was released
        forget_recorded_process(tx, runner.runner_epoch, pid)
        return revision, None
    renew_claim(tx, runner.claim)  # registration requires the live run claim
    identity = identity_of(pid)
    runner_pid = runner.identity.pid if runner.identity is not None else None
    if (
        identity is None
        or f"{identity.start_ticks}:{identity.boot_id or 'none'}" != payload["startIdentity"]
        or _parent_of(pid) != runner_pid
    ):
        raise InvalidTransitionError(runner.run_id, "unknown process", "register process")
    # Durable before the runner lets the command start, so a successor server can stop
    # the group after this server's crash.
    record_process(
        tx,
        runner.runner_epoch,
        pid=pid,
        start_ticks=identity.start_ticks,
        boot_id=identity.boot_id,
        role="registered",
    )
    runner.registered[pid] = identity
    return revision, None


def _parent_of(pid: int) -> int | None:
    try:
        return int(psutil.Process(pid).ppid())
    except psutil.Error:
        return None


_HANDLERS: dict[str, Handler] = {
    "runner.progress": _on_progress,
    "runner.ready": _on_ready,
    "node.started": _on_node_started,
    "node.finished": _on_node_finished,
    "node.failed": _on_node_failed,
    "effect.reserve": _on_effect_reserve,
    "effect.settle": _on_effect_settle,
    "notification.requested": _on_notification,
    "run.parked": _on_run_parked,
    "run.finished": _on_run_finished,
    "runner.exiting": _on_exiting,
}
