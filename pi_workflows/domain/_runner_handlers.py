"""The server side of runner messages: one protected write per accepted message.

Implements workflow-server.md § Runner protocol and § Pause and cancellation. Runners
propose; this module disposes. `apply_message` is a unit of database work: it takes the
runner host's view of one runner (data) and a typed message, and returns the frames to
send and a `Delta` the runner-host actor applies to its own state afterwards. Nothing
here touches actor state, signals a process or sends a frame.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import psutil
from msgspec import UNSET, UnsetType

from pi_workflows.domain._runner_content import (
    CONTENT_MEDIA_TYPE,
    UploadRejectedError,
    bounded,
    read_part,
    resolve_upload,
    write_part,
)
from pi_workflows.domain._runner_exits import STOPPING_REASON
from pi_workflows.domain._runner_launch import LaunchPlan, launch_state
from pi_workflows.storage import (
    VIEW_JSON_MEDIA_TYPE,
    Claim,
    ClaimHeldError,
    ClaimLostError,
    Database,
    EffectConflictError,
    FailureClass,
    InvalidTransitionError,
    RevisionConflictError,
    RunNotFoundError,
    Tx,
    WriteResult,
    adoptable_submission,
    cancel_superseded_step_messages,
    carry_turn_count,
    complete_run,
    count_runner_replies,
    declare_effect_ambiguous,
    earlier_submission_validating,
    fail_node_attempt,
    fail_run,
    finish_node_attempt,
    forget_recorded_process,
    get_run,
    insert_message,
    interactive_origin_session,
    interrupted_request_turns,
    lookup_runner_reply,
    mark_runner_live,
    open_waiting_decision,
    park_run,
    present_notification,
    protected_write,
    put_blob,
    put_json_blob,
    put_traceback,
    read_head,
    read_request,
    read_request_for_attempt,
    read_resume_state,
    read_submission,
    record_process,
    record_runner_reply,
    record_unproductive_turn,
    renew_claim,
    request_interaction,
    requeue_run,
    reserve_effect,
    retry_effect_after_read_back,
    settle_effect,
    start_node_attempt,
    store_view_blob,
    store_view_text,
    submission_validating,
    submission_value,
    supersede_earlier_requests,
    time_out_run,
    wait_run,
)
from pi_workflows.supervision import (
    RUNNER_MESSAGE_POINTS,
    ProcessIdentity,
    crash_point,
    identity_of,
)
from pi_workflows.wire.canonical import dumps, sha256_digest
from pi_workflows.wire.protocol import ProtocolViolation
from pi_workflows.wire.runner import (
    PIPELINED_KINDS,
    ContentRead,
    ContentWrite,
    ContentWritten,
    EffectReserve,
    EffectSettle,
    EffectSettled,
    InteractionAnswer,
    InteractionRequested,
    JsonObject,
    LastNode,
    NodeFailed,
    NodeFinished,
    NodeStarted,
    NotificationRequested,
    ProcessRegister,
    ProcessUnregister,
    RunFinished,
    RunnerAddress,
    RunnerCommand,
    RunnerError,
    RunnerMessage,
    RunnerReply,
    RunParked,
    StartedVisit,
    TurnEnded,
    TurnVerdict,
    UploadRef,
    whole_error,
)

__all__ = ["Delta", "Handled", "RunnerView", "apply_message", "reply_to"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunnerView:
    """What a unit of database work may know about one live runner (a snapshot)."""

    run_id: str
    runner_epoch: str
    claim: Claim = field(repr=False)
    command: str
    identity: ProcessIdentity | None
    """The runner's exact identity once the supervisor reported its spawn."""
    offered: frozenset[str]
    """Digests this runner was sent by reference: all it may `content.read`."""
    draining: bool = False
    """The server is stopping: hand the run back at the next durable boundary."""

    @classmethod
    def launched(cls, plan: LaunchPlan, identity: ProcessIdentity | None = None) -> RunnerView:
        """The view of a runner just launched from `plan` (nothing offered yet)."""
        return cls(plan.run_id, plan.runner_epoch, plan.claim, plan.command, identity, frozenset())


@dataclass
class Delta:
    """What one applied message changes in the runner host's view of its runner."""

    ready: bool = False
    settled: bool = False
    """The run left `running` through this runner, or its claim is gone."""
    claim_lost: bool = False
    handed_back: bool = False
    """Requeued at a durable boundary because the server is draining."""
    registered: ProcessIdentity | None = None
    unregistered: int | None = None
    offered: set[str] = field(default_factory=set)
    started: tuple[str, str, int | None] | None = None
    """(attempt ID, node kind, deadline_at) of an attempt that just started."""
    attempt_ended: bool = False
    effect_open: bool | None = None
    """True once an effect is reserved for applying, False once it settles."""


WireFrame: TypeAlias = dict[str, Any]
"""A reply or command in its wire form (`RunnerReply.to_wire()`), ready to send."""


@dataclass(frozen=True, slots=True)
class Handled:
    """The frames to send back (reply first) and the change to the runner's view."""

    frames: list[WireFrame]
    delta: Delta


def reply_to(
    message: RunnerMessage,
    outcome: Any,
    *,
    revision: int | None = None,
    result: Any = None,
    error: tuple[str, str] | None = None,
) -> WireFrame:
    """The wire reply to `message`."""
    reply = RunnerReply.to(message, outcome, revision=revision, result=result, error=error)
    return reply.to_wire()


def apply_message(db: Database, view: RunnerView, message: RunnerMessage) -> Handled:
    """Apply one runner message whose epoch and generation the runner host checked."""
    delta = Delta()
    if isinstance(message.body, ContentRead):
        return Handled([_read_content(db, view, message, message.body)], delta)  # no receipt
    if isinstance(message.body, ContentWrite):
        return Handled([_write_content(db, message, message.body, delta)], delta)  # no receipt
    fingerprint = sha256_digest(message.to_wire())  # the frame as it came, re-encoded
    stored = lookup_runner_reply(db, view.runner_epoch, message.message_id, fingerprint)
    if stored is not None:
        ref = stored.get("resultRef")
        if ref is not None:  # a retry gets the same reference, still readable
            delta.offered.add(ref["digest"])
        return Handled([stored], delta)
    try:
        if view.draining and isinstance(message.body, NodeStarted):
            return Handled([_hand_back(db, view, message, delta)], delta)
        frames = _apply(db, view, message, fingerprint, delta)
    except ClaimLostError as exc:
        delta.settled = delta.claim_lost = True
        log.info(
            "runner lost its claim",
            extra={
                "action": "runner.claim_lost",
                "run_id": view.run_id,
                "generation": view.claim.generation,
                "reason": exc.reason,
            },
        )
        return Handled([reply_to(message, "claimLost", error=("claimLost", exc.reason))], delta)
    except RevisionConflictError:
        error = ("revisionConflict", "stale revision")
        return Handled([reply_to(message, "conflict", error=error)], delta)
    except EffectConflictError as exc:
        return Handled([reply_to(message, "conflict", error=("effectConflict", str(exc)))], delta)
    except (InvalidTransitionError, RunNotFoundError, ClaimHeldError) as exc:
        error = ("protocolRejected", str(exc))
        return Handled([reply_to(message, "rejected", error=error)], Delta())
    except UploadRejectedError as exc:
        error = ("contentRejected", str(exc))
        return Handled([reply_to(message, "rejected", error=error)], Delta())
    if message.kind in RUNNER_MESSAGE_POINTS:  # a kind without a declared point has none
        point = f"server.runner_message.{message.kind.replace('.', '_')}.after_commit"
        db.after_commit(functools.partial(crash_point, point))  # durable first, then the point
    return Handled(frames, delta)


def _apply(
    db: Database, view: RunnerView, message: RunnerMessage, fingerprint: str, delta: Delta
) -> list[WireFrame]:
    handler = _HANDLERS.get(message.kind)
    if handler is None:
        return [reply_to(message, "rejected", error=("protocolRejected", message.kind))]
    extra: list[RunnerCommand] = []
    offered = set(view.offered)
    with db.write() as tx:
        revision, result = handler(tx, view, message, delta, extra)
        accepted = RunnerReply.to(message, "accepted", revision=revision, result=result)
        # Measure every frame before it is stored or sent: an oversized result is
        # stored as a blob in this transaction, and the frame carries its reference.
        reply = bounded(tx, offered, accepted)
        frames = [bounded(tx, offered, frame) for frame in extra]
        record_runner_reply(
            tx, view.runner_epoch, message.message_id, message.kind, fingerprint, reply
        )
    delta.offered |= offered - view.offered
    return [reply, *frames]


def _hand_back(db: Database, view: RunnerView, message: RunnerMessage, delta: Delta) -> Any:
    """Draining: the last node is durable, so give the run back before the next starts."""
    with db.write() as tx:
        requeue_run(tx, view.run_id, reason=STOPPING_REASON, claim=view.claim)
    db.after_commit(functools.partial(crash_point, "server.drain.after_hand_back"))
    delta.settled = delta.handed_back = True
    return reply_to(message, "claimLost", error=("claimLost", STOPPING_REASON))


def _read_content(
    db: Database, view: RunnerView, message: RunnerMessage, read: ContentRead
) -> WireFrame:
    outcome, result, error = read_part(db, view.offered, read.digest, read.offset, read.length)
    return reply_to(message, outcome, result=result, error=error)


def _write_content(
    db: Database, message: RunnerMessage, write: ContentWrite, delta: Delta
) -> WireFrame:
    """Store one part of a value the runner sends by reference; it may name it later."""
    try:
        with db.write() as tx:
            digest = write_part(tx, write.data)
    except UploadRejectedError as exc:
        return reply_to(message, "rejected", error=("contentRejected", str(exc)))
    delta.offered.add(digest)  # this runner's own part: it may name it (and read it)
    return reply_to(message, "accepted", result=ContentWritten(digest=digest))


def _uploaded(tx: Tx, view: RunnerView, inline: Any, ref: UploadRef | Any) -> Any:
    """The value a runner sent inline, or by the reference of its `content.write` parts.

    Raises:
        UploadRejectedError: the reference does not check out (see `resolve_upload`).
    """
    if not isinstance(ref, UploadRef):
        return inline
    value, _data = resolve_upload(tx, view.offered, ref)
    return value


def _object(value: Any, what: str) -> JsonObject:
    """A value the protocol requires to be a JSON object (checked inline by the record)."""
    if not isinstance(value, dict):
        raise UploadRejectedError(f"the {what} by reference is not a JSON object")
    return value


def _error(tx: Tx, view: RunnerView, error: RunnerError | Any, ref: UploadRef | Any) -> Any:
    """A runner's error, inline or whole by reference (None when it sent neither)."""
    if isinstance(ref, UploadRef):
        value, _data = resolve_upload(tx, view.offered, ref)
        try:
            return whole_error(value)
        except ProtocolViolation:
            raise UploadRejectedError("the error by reference is not a runner error") from None
    return error if isinstance(error, RunnerError) else None


# --- handlers: (tx, view, message, delta, extra frames) -> (revision, result) ------------

Handler = Callable[[Tx, RunnerView, RunnerMessage, Delta, list[RunnerCommand]], tuple[int, Any]]


def _on_ready(
    tx: Tx, view: RunnerView, message: RunnerMessage, delta: Delta, extra: list[RunnerCommand]
) -> tuple[int, Any]:
    identity = view.identity
    result = mark_runner_live(
        tx,
        view.claim,
        runner_epoch=view.runner_epoch,
        pid=identity.pid if identity else None,
        process_start_time=identity.start_ticks if identity else None,
    )
    delta.ready = True
    state, parent_attempt = launch_state(tx, view.run_id)
    command = RunnerCommand.build(
        RunnerAddress(view.run_id, view.claim.generation, view.runner_epoch),
        result.revision,
        view.command,  # type: ignore[arg-type]  # the plan's command is one of the four
        state,
        parent_attempt if view.command == "continue" else None,
    )
    extra.append(command)
    return result.revision, None


def _on_node_started(
    tx: Tx, view: RunnerView, message: RunnerMessage, delta: Delta, extra: list[RunnerCommand]
) -> tuple[int, Any]:
    body = message.body
    assert isinstance(body, NodeStarted) and message.attempt_id is not None
    deadline_at = tx.now + body.timeout_ms if isinstance(body.timeout_ms, int) else None
    started = start_node_attempt(
        tx,
        view.claim,
        attempt_id=message.attempt_id,
        node_path=body.node_path,
        node_type=body.node_kind,
        deadline_at=deadline_at,
    )
    if body.node_kind in PIPELINED_KINDS and started.visit != body.visit:
        # The runner routes on the visit it assumed (a pipelined start is not waited
        # for): a different count is refused, and with it the run's end behind it.
        raise InvalidTransitionError(view.run_id, f"visit {started.visit}", "node.started")
    delta.started = (message.attempt_id, body.node_kind, deadline_at)
    return started.revision, StartedVisit(visit=started.visit)


def _on_node_finished(
    tx: Tx, view: RunnerView, message: RunnerMessage, delta: Delta, extra: list[RunnerCommand]
) -> tuple[int, Any]:
    body = message.body
    assert isinstance(body, NodeFinished) and message.attempt_id is not None
    route = body.route if isinstance(body.route, str) else None
    output, digest = _stored_output(tx, view, body.output, body.output_ref)
    revision = _finish_node(
        tx,
        view,
        message.attempt_id,
        node_path=body.node_path,
        route=route,
        output=output,
        digest=digest,
    )
    delta.attempt_ended = True
    return revision, None


def _stored_output(
    tx: Tx, view: RunnerView, inline: Any, ref: UploadRef | UnsetType
) -> tuple[Any, str]:
    """A node's output (sent inline, or by the reference of its uploaded parts) and the
    digest of its stored blob."""
    if isinstance(ref, UploadRef):
        output, data = resolve_upload(tx, view.offered, ref)
        return output, put_blob(tx, data)  # its own canonical bytes: not encoded again
    return inline, put_json_blob(tx, inline)


def _finish_node(
    tx: Tx,
    view: RunnerView,
    attempt_id: str,
    *,
    node_path: str,
    route: str | None,
    output: Any,
    digest: str,
) -> int:
    """Finish a node's attempt with its stored output; the run's new revision."""
    result = finish_node_attempt(
        tx,
        view.claim,
        attempt_id=attempt_id,
        output_hash=digest,
        next_node_path=route,
        payload={"nodePath": node_path, **({"route": route} if route else {})},
    )
    # A notify node of an interactive run: its passive message, with its node result.
    present_notification(tx, view.run_id, attempt_id, output)
    return result.revision


def _on_node_failed(
    tx: Tx, view: RunnerView, message: RunnerMessage, delta: Delta, extra: list[RunnerCommand]
) -> tuple[int, Any]:
    body = message.body
    assert isinstance(body, NodeFailed) and message.attempt_id is not None
    error = _error(tx, view, body.error, body.error_ref)
    assert error is not None  # the record holds one of the two
    payload: dict[str, Any] = {}
    if error.traceback:
        # Durable content of the run, named by the failure event in the same commit.
        payload["traceback"] = put_traceback(tx, view.run_id, error.traceback)
    result = fail_node_attempt(
        tx,
        view.claim,
        attempt_id=message.attempt_id,
        error=error.text(),  # whole: the attempt row and the run view keep all of it
        timed_out=error.code == "nodeTimedOut",
        payload=payload,
    )
    delta.attempt_ended = True
    return result.revision, None


def _on_effect_reserve(
    tx: Tx, view: RunnerView, message: RunnerMessage, delta: Delta, extra: list[RunnerCommand]
) -> tuple[int, Any]:
    body = message.body
    assert isinstance(body, EffectReserve) and message.attempt_id is not None
    reservation = reserve_effect(
        tx,
        view.claim,
        attempt_id=message.attempt_id,
        effect_type=body.effect_type,
        idempotency_key=body.idempotency_key,
        request=_uploaded(tx, view, body.request, body.request_ref),
        executor_epoch=view.runner_epoch,
        idempotent=body.idempotent is True,
    )
    delta.effect_open = True
    return reservation.revision, reservation.to_wire()


def _on_effect_settle(
    tx: Tx, view: RunnerView, message: RunnerMessage, delta: Delta, extra: list[RunnerCommand]
) -> tuple[int, Any]:
    body = message.body
    assert isinstance(body, EffectSettle)
    key = body.idempotency_key
    delta.effect_open = False
    if body.outcome == "ambiguous":
        record = declare_effect_ambiguous(
            tx, view.claim, idempotency_key=key, reason="no read-back after an uncertain apply"
        )
    elif body.read_back == "notApplied":
        retried = retry_effect_after_read_back(
            tx, view.claim, idempotency_key=key, executor_epoch=view.runner_epoch
        )
        delta.effect_open = True  # a new attempt applies next
        return retried.revision, retried.to_wire()
    else:
        error = _error(tx, view, body.error, body.error_ref)
        record = settle_effect(
            tx,
            view.claim,
            idempotency_key=key,
            outcome="applied" if body.outcome == "succeeded" else "rejected",
            result=_uploaded(tx, view, body.result, body.result_ref),
            error=error.text() if error is not None else None,
            executor_epoch=view.runner_epoch,
            proven_by_read_back=body.read_back == "applied",
        )
    return record.revision, EffectSettled(state=record.state.value)


def _on_notification(
    tx: Tx, view: RunnerView, message: RunnerMessage, delta: Delta, extra: list[RunnerCommand]
) -> tuple[int, Any]:
    body = message.body
    assert isinstance(body, NotificationRequested)
    event: dict[str, Any] = {"notificationId": body.notification_id}
    if isinstance(body.content_ref, UploadRef):
        # Too large for an event row: the event names its stored blob.
        content, data = resolve_upload(tx, view.offered, body.content_ref)
        _object(content, "notification content")
        ref = body.content_ref
        event["contentRef"] = {
            "mediaType": CONTENT_MEDIA_TYPE,
            "byteCount": ref.byte_count,
            "digest": put_blob(tx, data),
        }
    else:
        event["content"] = body.content
    written = protected_write(tx, view.claim, event_type="notification.requested", payload=event)
    return written.revision, None


_REQUEST_KINDS: Final = {"agent": "agent", "visibleResponse": "assistant"}
"""The runner's interaction kind → the stored request kind (an assistant-message step's
request is `assistant`: it completes through no tool, workflow-server.md § Live run view)."""


def _on_interaction_requested(
    tx: Tx, view: RunnerView, message: RunnerMessage, delta: Delta, extra: list[RunnerCommand]
) -> tuple[int, Any]:
    """Commit the attempt's request (headless: the attempt stays running); a repeat, or a
    resumed runner, gets the stored request and any accepted output to adopt."""
    body = message.body
    assert isinstance(body, InteractionRequested) and message.attempt_id is not None
    contract = _object(_uploaded(tx, view, body.request, body.request_ref), "request")
    kind = _REQUEST_KINDS.get(body.interaction_kind)
    if kind is None:
        raise InvalidTransitionError(view.run_id, body.interaction_kind, "request interaction")
    origin = interactive_origin_session(tx, view.run_id)
    names_session = (body.target_session_id or None) is not None
    if names_session != (origin is not None) or (kind == "assistant" and origin is None):
        # A runner names an origin session exactly when its run is interactive (none for
        # a headless run). The binding names which one: a run adopted by another Pi
        # session while this runner ran is presented there (`run.adopt`). A visible
        # assistant-message step has no headless form at all.
        raise InvalidTransitionError(view.run_id, "another execution mode", "request interaction")
    if read_request_for_attempt(tx, message.attempt_id) is None:
        # A runner died after the step's output was accepted: adopt it, ask nothing.
        earlier = adoptable_submission(tx, message.attempt_id)
        if earlier is not None:
            return read_head(tx, view.run_id).revision, InteractionAnswer(
                request_id=earlier.request_id,
                status="settled",
                accepted_submission_id=earlier.submission_id,
                value=submission_value(tx, earlier),
            )
        if earlier_submission_validating(tx, message.attempt_id):
            # Nothing is written: the runner asks again once that outcome is stored.
            return read_head(tx, view.run_id).revision, InteractionAnswer(status="validating")
    if origin is not None:
        return _request_in_origin_session(
            tx, view, message.attempt_id, body, contract, session_id=origin, delta=delta, kind=kind
        )
    written = request_interaction(
        tx,
        view.claim,
        attempt_id=message.attempt_id,
        request_id=body.interaction_id,
        kind="agent",
        contract=contract,
    )
    if isinstance(written, WriteResult):
        resumed = _carry_over(tx, view.run_id, message.attempt_id, body.interaction_id)
        supersede_earlier_requests(tx, message.attempt_id)
        return written.revision, InteractionAnswer(
            request_id=body.interaction_id, status="pending", resumed=True if resumed else UNSET
        )
    # `existing`: the request was there before this message (a repeat, or a resumed
    # runner), so the step is presented again (reason `resumed`).
    return read_head(tx, view.run_id).revision, _answer(
        tx, written.request_id, written.status, written.accepted_submission_id, existing=True
    )


def _answer(
    tx: Tx, request_id: str, status: str, accepted_id: str | None, *, existing: bool = False
) -> InteractionAnswer:
    """A stored request's answer, with its accepted output when there is one."""
    accepted = read_submission(tx, accepted_id) if accepted_id is not None else None
    return InteractionAnswer(
        request_id=request_id,
        status=status,
        existing=True if existing else UNSET,
        accepted_submission_id=UNSET if accepted is None else accepted.submission_id,
        value=UNSET if accepted is None else submission_value(tx, accepted),
    )


def _request_in_origin_session(
    tx: Tx,
    view: RunnerView,
    attempt_id: str,
    body: InteractionRequested,
    request: JsonObject,
    *,
    session_id: str,
    delta: Delta,
    kind: str = "agent",
) -> tuple[int, Any]:
    """An interactive agent or assistant-message step (workflow-server.md § Interactive
    Pi execution).

    In one transaction: the request, one pending `step` message (reason `initial`) whose
    content is the step prompt and its tool contract, the attempt `waiting`, the queue
    parked and the claim released. The runner then stops; the origin session's
    coordinator presents the message. A repeat for the same attempt writes nothing.
    """
    prompt = request.get("prompt")
    contract = {key: value for key, value in request.items() if key != "prompt"}
    existing = read_request_for_attempt(tx, attempt_id)
    if existing is not None:
        answer = _answer(tx, existing.request_id, existing.status, existing.accepted_submission_id)
        return read_head(tx, view.run_id).revision, answer
    request_interaction(
        tx,
        view.claim,
        attempt_id=attempt_id,
        request_id=body.interaction_id,
        kind=kind,
        contract=contract,
        target_session_id=session_id,
    )
    if supersede_earlier_requests(tx, attempt_id):
        # A superseded request's pending step message can never be answered.
        cancel_superseded_step_messages(tx, view.run_id)

    def present(tx: Tx) -> None:
        insert_message(
            tx,
            run_id=view.run_id,
            session_id=session_id,
            kind="step",
            reason="initial",
            source_id=body.interaction_id,
            content={"prompt": prompt, "contract": contract},
        )

    waited = wait_run(tx, view.claim, reason="interaction", attempt_id=attempt_id, change=present)
    delta.settled = True
    return waited.revision, InteractionAnswer(request_id=body.interaction_id, status="waiting")


def _carry_over(tx: Tx, run_id: str, attempt_id: str, request_id: str) -> bool:
    """A new request for the same node visit as an interrupted attempt's (a runner died
    mid-step): it continues that request's unproductive-turn count (durable, so a resumed
    runner goes on counting). True: the step is presented again (reason `resumed`)."""
    earlier = interrupted_request_turns(tx, run_id, attempt_id)
    if earlier is None:
        return False
    carry_turn_count(tx, request_id, earlier)
    return True


def _on_run_parked(
    tx: Tx, view: RunnerView, message: RunnerMessage, delta: Delta, extra: list[RunnerCommand]
) -> tuple[int, Any]:
    body = message.body
    assert isinstance(body, RunParked)
    if body.reason == "checkpoint":
        attempt_id = message.attempt_id
        finished = read_resume_state(tx, view.run_id)
        last = finished.last_finished
        node_path = last.node_path if last is not None else "checkpoint"
        output = finished.outputs.get(node_path)

        def open_decision(tx: Tx) -> None:
            # A protected decision (the snapshot says) gets its presentation, deadline
            # and, in an origin session, its one decision message here.
            open_waiting_decision(
                tx, view.run_id, attempt_id=attempt_id, node_path=node_path, output=output
            )

        result = wait_run(tx, view.claim, reason="checkpoint", change=open_decision)
    else:
        result = park_run(tx, view.claim, reason=body.reason)
    delta.settled = True
    return result.revision, None


def _on_run_finished(
    tx: Tx, view: RunnerView, message: RunnerMessage, delta: Delta, extra: list[RunnerCommand]
) -> tuple[int, Any]:
    body = message.body
    assert isinstance(body, RunFinished)
    if isinstance(body.receipts, int) and count_runner_replies(tx, view.runner_epoch) != (
        body.receipts
    ):
        # Sent behind posted messages without their answers: one of them was refused,
        # so the run's end the runner decided on does not stand.
        raise InvalidTransitionError(view.run_id, "an earlier message refused", "run.finished")
    error = _error(tx, view, body.error, body.error_ref)
    if isinstance(body.last_node, LastNode):
        # The run's last pure node and the run end in one claim-checked unit: after a
        # crash, either both are durable or neither (the node then runs again).
        last = body.last_node
        output, digest = _stored_output(tx, view, body.output, body.output_ref)
        _finish_node(
            tx,
            view,
            last.attempt_id,
            node_path=last.node_path,
            route=None,
            output=output,
            digest=digest,
        )
        delta.attempt_ended = True
    if body.status == "completed":
        payload = _run_output(tx, view, body)
        result = complete_run(tx, view.run_id, claim=view.claim, payload=payload)
    elif body.status == "timed_out":
        reason = error.message if error else "timed out"
        result = time_out_run(tx, view.run_id, reason=reason, claim=view.claim)
    else:
        reason = error.text() if error else f"nodeFailed: {body.status}"
        over_limit = error is not None and error.code == FailureClass.RESOURCE_LIMIT
        result = fail_run(
            tx,
            view.run_id,
            failure_class=FailureClass.RESOURCE_LIMIT if over_limit else FailureClass.NODE_FAILED,
            reason=reason,
            claim=view.claim,
        )
    delta.settled = True
    return result.revision, None


def _run_output(tx: Tx, view: RunnerView, body: RunFinished) -> dict[str, Any]:
    """The `run_completed` event's payload: the output inline, or (too large for one
    frame, so too large for an event row) a reference to its blob."""
    # A large output is stored as the run view's content in this same commit.
    if not isinstance(body.output_ref, UploadRef):
        output = None if body.output is UNSET else body.output
        store_view_text(tx, view.run_id, dumps(output).decode(), VIEW_JSON_MEDIA_TYPE)
        return {"output": output}
    _value, data = resolve_upload(tx, view.offered, body.output_ref)
    digest = put_blob(tx, data)
    store_view_blob(tx, view.run_id, digest)
    return {
        "outputRef": {"mediaType": CONTENT_MEDIA_TYPE, "byteCount": len(data), "digest": digest}
    }


def _on_exiting(
    tx: Tx, view: RunnerView, message: RunnerMessage, delta: Delta, extra: list[RunnerCommand]
) -> tuple[int, Any]:
    # Nothing changes: the exit itself is recorded when the process is reaped.
    run = get_run(tx, view.run_id)
    return (run.revision if run is not None else 0), None


def _on_progress(
    tx: Tx, view: RunnerView, message: RunnerMessage, delta: Delta, extra: list[RunnerCommand]
) -> tuple[int, Any]:
    body = message.body
    if isinstance(body, TurnEnded):
        return _on_turn_ended(tx, view, body)
    assert isinstance(body, ProcessRegister | ProcessUnregister)
    run = get_run(tx, view.run_id)
    revision = run.revision if run is not None else 0
    if isinstance(body, ProcessUnregister):
        delta.unregistered = body.pid  # valid even after the claim was released
        forget_recorded_process(tx, view.runner_epoch, body.pid)
        return revision, None
    renew_claim(tx, view.claim)  # registration requires the live run claim
    identity = identity_of(body.pid)
    if (
        identity is None
        or f"{identity.start_ticks}:{identity.boot_id or 'none'}" != body.start_identity
        or view.identity is None
        or _parent_of(body.pid) != view.identity.pid
    ):
        raise InvalidTransitionError(view.run_id, "unknown process", "register process")
    # Durable before the runner lets the command start, so a successor server can stop
    # the group after this server's crash.
    record_process(
        tx,
        view.runner_epoch,
        pid=body.pid,
        start_ticks=identity.start_ticks,
        boot_id=identity.boot_id,
        role="registered",
    )
    delta.registered = identity
    return revision, None


def _on_turn_ended(tx: Tx, view: RunnerView, body: TurnEnded) -> tuple[int, Any]:
    """Count an agent turn that ended without an accepted submission, under the live
    claim: `remind` at 1 and 2, `fail` above (the runner fails the attempt). A settled
    request is not counted (`accepted`: the runner reads the value back), nor is an
    aborted turn or one that ended while a submission still validates (`remind`)."""
    renew_claim(tx, view.claim)
    request = read_request(tx, body.interaction_id)
    if request is None or request.run_id != view.run_id:
        raise InvalidTransitionError(view.run_id, "unknown request", "count unproductive turn")
    head = read_head(tx, view.run_id).revision
    if request.accepted_submission_id is not None:
        return head, TurnVerdict(action="accepted")
    if request.status != "pending":
        raise InvalidTransitionError(view.run_id, f"request {request.status}", "end turn")
    if submission_validating(tx, request.request_id) or body.stop_reason == "aborted":
        # Not unproductive: a submission is still being validated, or the turn was
        # aborted (the design counts no aborted turn); the runner prompts again.
        return head, TurnVerdict(action="remind", count=request.unproductive_turn_ends)
    error = body.error if body.stop_reason == "error" and isinstance(body.error, str) else None
    counted = record_unproductive_turn(
        tx, view.claim, request_id=request.request_id, error=error or None
    )
    verdict = TurnVerdict(action="fail" if counted.fail else "remind", count=counted.count)
    return read_head(tx, view.run_id).revision, verdict


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
    "interaction.requested": _on_interaction_requested,
    "run.parked": _on_run_parked,
    "run.finished": _on_run_finished,
    "runner.exiting": _on_exiting,
}
