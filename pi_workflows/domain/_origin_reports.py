"""Active-branch and model-turn reports from an origin session's coordinator.

Implements workflow-server.md § Live client protocol (`workflowMessage.reportBranch`,
`workflowTurn.report`), § Origin-session activity and § Interactive Pi execution.
Only the connection that holds the session's active coordinator epoch may report. Each
report is one database transaction: every message or turn it changes gets an event and
a revision on its run. A report stores no command receipt: it is idempotent by its own
rows (a repeat finds them and adopts), so a polling session creates no durable command.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pi_workflows.domain._epochs import ActiveEpochs
from pi_workflows.domain._operations import OperationError, rejected, response
from pi_workflows.domain._session_view import clear_terminal
from pi_workflows.storage import (
    EVENT_UNPRODUCTIVE_TURN,
    UNPRODUCTIVE_TURN_LIMIT,
    ClaimLostError,
    Database,
    InvalidTransitionError,
    MessageRow,
    TurnRow,
    Tx,
    absent_from_branch,
    cancel_pending_request,
    cancel_step_messages,
    close_attempt,
    end_turn,
    fail_orphaned_captures,
    insert_message,
    insert_step_again,
    insert_turn,
    mark_sent,
    message_turn_ended,
    open_turns,
    pause_run,
    pending_step_message,
    present_next_follow_up,
    read_json_blob,
    read_message,
    read_request,
    read_turn,
    record_interaction_event,
    record_submission,
    requeue_run,
    resume_session_time,
    run_unfinished_unpaused,
    set_unproductive_turn_ends,
    settle_submission,
    start_active_time,
    suspend_request_time,
    unproductive_turn_ends,
)
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.protocol import RequestMessage

__all__ = [
    "MAX_BRANCH_ENTRIES",
    "MAX_REPLY_CHARS",
    "TURN_END_RESULTS",
    "clear_terminal_view",
    "report_branch",
    "report_turn",
    "visible_output",
]

MAX_BRANCH_ENTRIES: Final = 256
"""A report names at most the window's item limit of entries."""
MAX_ID_CHARS: Final = 256
TURN_END_RESULTS: Final = frozenset({"completed", "aborted", "error"})
"""The `stopReason` of an ended turn, derived by the extension from Pi's messages."""
MAX_REPLY_CHARS: Final = 1_000_000
"""The most characters of a visible reply an end report carries (one frame holds them)."""
VISIBLE_KIND: Final = "assistant"
"""The request kind of an assistant-message step: its turn's visible reply is the output."""

EVENT_MESSAGE_SENT: Final = "workflow_message_sent"
EVENT_MESSAGE_CREATED: Final = "workflow_message_created"
EVENT_TURN_STARTED: Final = "workflow_turn_started"
EVENT_TURN_ENDED: Final = "workflow_turn_ended"


def _opaque_id(value: object) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_ID_CHARS
        and not any(ord(char) < 0x20 or ord(char) == 0x7F for char in value)
    )


def _required_id(payload: Mapping[str, Any], name: str) -> str:
    value = payload.get(name)
    if not _opaque_id(value):
        raise OperationError("rejected", f"{name}Invalid", f"{name} must be an opaque ID")
    return str(value)


def _required_bool(payload: Mapping[str, Any], name: str) -> bool:
    value = payload.get(name)
    if not isinstance(value, bool):
        raise OperationError("rejected", f"{name}Invalid", f"{name} must be true or false")
    return value


def _fenced(request: RequestMessage) -> dict[str, Any]:
    return rejected(
        request,
        "claimLost",
        "coordinatorFenced",
        "this connection does not hold the session's active coordinator epoch",
    )


# --- workflowMessage.reportBranch ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Branch:
    session_id: str
    entries: list[tuple[str, str]]
    """(message ID, Pi entry ID) found on the active branch."""
    is_idle: bool
    has_pending: bool


def _branch(request: RequestMessage) -> _Branch:
    payload = request["payload"]
    session = _required_id(payload, "sessionId")
    raw = payload.get("entries", [])
    if not isinstance(raw, list) or len(raw) > MAX_BRANCH_ENTRIES:
        raise OperationError(
            "rejected", "entriesInvalid", f"entries must be a list of at most {MAX_BRANCH_ENTRIES}"
        )
    entries: list[tuple[str, str]] = []
    for entry in raw:
        if not isinstance(entry, Mapping):
            raise OperationError("rejected", "entriesInvalid", "an entry is an object")
        entries.append((_required_id(entry, "messageId"), _required_id(entry, "entryId")))
    return _Branch(
        session,
        entries,
        _required_bool(payload, "isIdle"),
        _required_bool(payload, "hasPendingMessages"),
    )


def report_branch(
    db: Database, request: RequestMessage, *, connection_id: str, epochs: ActiveEpochs
) -> dict[str, Any]:
    """Adopt the branch's entries; when Pi is idle with nothing pending, close the
    session's proved-lost turns and present again each pending step that is absent."""
    try:
        branch = _branch(request)
    except OperationError as exc:
        return rejected(request, exc.outcome, exc.code, str(exc))
    if not epochs.holds(branch.session_id, connection_id):
        return _fenced(request)
    try:
        with db.write() as tx:
            adopted = _adopt(tx, branch)
            closed: list[str] = []
            created: list[str] = []
            # Absence proves something only on an idle Pi with no queued input. The
            # branch's re-presentation comes first: a turn lost with the old branch (a
            # fork) then counts against the step, and the pending `resumed` message
            # (full content) stands instead of a reminder.
            if branch.is_idle and not branch.has_pending:
                created = _present_again(tx, branch)
                for turn in open_turns(tx, branch.session_id):
                    _end(tx, turn, "lost", None)
                    closed.append(turn.turn_id)
                # No turn of this Pi runs: a capture still recording lost its Pi.
                fail_orphaned_captures(tx, branch.session_id)
            # The active epoch reported: a step turn still open runs its timer again.
            resume_session_time(tx, branch.session_id)
    except OperationError as exc:
        return rejected(request, exc.outcome, exc.code, str(exc))
    return response(
        request,
        "accepted",
        receipt={"adopted": adopted, "created": created, "closedTurns": closed},
    )


def _adopt(tx: Tx, branch: _Branch) -> list[str]:
    adopted: list[str] = []
    for message_id, entry_id in branch.entries:
        message = read_message(tx, message_id)
        if message is None or message.target_session_id != branch.session_id:
            # Rolls the whole report back: it may name only this session's messages.
            raise OperationError(
                "rejected", "messageNotInWindow", "an entry names no message of this session"
            )
        if message.state == "sent":
            continue  # already confirmed: the first entry evidence stays
        mark_sent(tx, message, entry_id)
        record_interaction_event(
            tx,
            message.run_id,
            EVENT_MESSAGE_SENT,
            {"messageId": message.message_id, "kind": message.kind},
        )
        adopted.append(message.message_id)
    return adopted


def _present_again(tx: Tx, branch: _Branch) -> list[str]:
    """A branch change: one `resumed` step for each pending request none of whose sent
    step messages is on this branch (a repeat finds the pending one and adds none)."""
    present = dumps([message_id for message_id, _ in branch.entries]).decode()
    created: list[str] = []
    for source in absent_from_branch(tx, branch.session_id, present):
        message_id = insert_step_again(tx, source, branch.session_id, "resumed")
        record_interaction_event(
            tx,
            source.run_id,
            EVENT_MESSAGE_CREATED,
            {"messageId": message_id, "kind": "step", "reason": "resumed"},
        )
        created.append(message_id)
    return created


# --- workflowTurn.report -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _TurnReport:
    phase: str
    session_id: str
    message_id: str
    turn_id: str
    run_id: str
    stop_reason: str | None
    response_entry_id: str | None
    reply: str | None = None
    """The turn's final visible assistant text (sent for an assistant-message step)."""
    reply_cut: bool = False
    """The extension cut the reply to fit one frame."""


def _turn_report(request: RequestMessage) -> _TurnReport:
    payload = request["payload"]
    phase = payload.get("phase")
    if phase not in ("started", "ended"):
        raise OperationError("rejected", "phaseInvalid", "phase must be started or ended")
    run_id = request.get("runId")
    if not _opaque_id(run_id):
        raise OperationError("rejected", "runIdRequired", "a turn report names its runId")
    stop_reason: str | None = None
    entry: str | None = None
    if phase == "ended":
        stop_reason = payload.get("stopReason")
        if stop_reason not in TURN_END_RESULTS:
            raise OperationError(
                "rejected", "stopReasonInvalid", "stopReason must be completed, aborted or error"
            )
        raw_entry = payload.get("responseEntryId")
        if raw_entry is not None and not _opaque_id(raw_entry):
            raise OperationError(
                "rejected", "responseEntryIdInvalid", "responseEntryId is an ID or null"
            )
        entry = raw_entry
    reply, cut = _reply(payload) if phase == "ended" else (None, False)
    return _TurnReport(
        str(phase),
        _required_id(payload, "sessionId"),
        _required_id(payload, "messageId"),
        _required_id(payload, "turnId"),
        str(run_id),
        stop_reason,
        entry,
        reply,
        cut,
    )


def _reply(payload: Mapping[str, Any]) -> tuple[str | None, bool]:
    """An end report's `assistantText` (optional) and `assistantTextCut` (optional)."""
    text = payload.get("assistantText")
    if text is not None and (not isinstance(text, str) or len(text) > MAX_REPLY_CHARS):
        raise OperationError(
            "rejected",
            "assistantTextInvalid",
            f"assistantText is text of at most {MAX_REPLY_CHARS} characters, or absent",
        )
    cut = payload.get("assistantTextCut", False)
    if not isinstance(cut, bool):
        raise OperationError("rejected", "assistantTextCutInvalid", "assistantTextCut is a bool")
    return text, cut


def _receipt(
    ownership: str, turn: TurnRow | None, *, visible_reply: bool = False
) -> dict[str, Any]:
    receipt: dict[str, Any] = {"version": 1, "ownership": ownership}
    if visible_reply:
        # The turn answers an assistant-message step: its end report carries the reply.
        receipt["visibleReply"] = True
    if turn is not None:
        receipt["turn"] = {
            "turnId": turn.turn_id,
            "messageId": turn.message_id,
            "runId": turn.run_id,
            "sessionId": turn.session_id,
            "status": turn.status,
            "responseEntryId": turn.response_entry_id,
            "startedAt": turn.started_at,
            "endedAt": turn.ended_at,
        }
    return receipt


def report_turn(
    db: Database, request: RequestMessage, *, connection_id: str, epochs: ActiveEpochs
) -> dict[str, Any]:
    """Record the exact start or end of a model turn; the receipt says whether the turn
    is workflow work (`active`), has ended (`settled`), or is not (`absent`)."""
    try:
        report = _turn_report(request)
    except OperationError as exc:
        return rejected(request, exc.outcome, exc.code, str(exc))
    if not epochs.holds(report.session_id, connection_id):
        return _fenced(request)
    try:
        with db.write() as tx:
            apply = _start if report.phase == "started" else _finish
            receipt = apply(tx, report)
    except OperationError as exc:
        return rejected(request, exc.outcome, exc.code, str(exc))
    return response(request, "accepted", receipt=receipt)


def _same_turn(turn: TurnRow, report: _TurnReport) -> None:
    if (turn.message_id, turn.run_id, turn.session_id) != (
        report.message_id,
        report.run_id,
        report.session_id,
    ):
        raise OperationError(
            "conflict", "turnConflict", "this turn ID was reported for another message"
        )


def _start(tx: Tx, report: _TurnReport) -> dict[str, Any]:
    existing = read_turn(tx, report.turn_id)
    if existing is not None:
        _same_turn(existing, report)  # a repeat adopts the saved turn
        if existing.status != "open":
            return _receipt("settled", existing)
        return _receipt("active", existing, visible_reply=_visible_step(tx, existing.message_id))
    message = read_message(tx, report.message_id)
    if (
        message is None
        or message.target_session_id != report.session_id
        or message.run_id != report.run_id
        or not _message_open(tx, message)
    ):
        return _receipt("absent", None)
    # Pi runs one turn at a time: a newer start proves an older open turn is over.
    for older in open_turns(tx, report.session_id):
        _end(tx, older, "lost", None)
    insert_turn(tx, turn_id=report.turn_id, message=message)
    if message.kind == "step":
        start_active_time(tx, message.source_id)  # the node timeout runs in this turn
    record_interaction_event(
        tx,
        message.run_id,
        EVENT_TURN_STARTED,
        {"turnId": report.turn_id, "messageId": message.message_id},
    )
    turn = read_turn(tx, report.turn_id)
    return _receipt("active", turn, visible_reply=_visible_step(tx, message.message_id))


def _visible_step(tx: Tx, message_id: str) -> bool:
    """Whether the message is a step of an assistant-message request."""
    message = read_message(tx, message_id)
    if message is None or message.kind != "step":
        return False
    request = read_request(tx, message.source_id)
    return request is not None and request.kind == VISIBLE_KIND


def _message_open(tx: Tx, message: MessageRow) -> bool:
    """A sent step is open while its request is pending in the message's session (an
    adopted run's request moved on) and its run is not paused; a sent terminal or
    follow-up message until its first turn ends; others never."""
    if message.state != "sent":
        return False
    if message.kind == "step":
        request = read_request(tx, message.source_id)
        return (
            request is not None
            and request.status == "pending"
            and request.target_session_id == message.target_session_id
            and run_unfinished_unpaused(tx, message.run_id)
        )
    if message.kind in ("terminal", "follow_up"):
        return not message_turn_ended(tx, message.message_id)
    return False


def _finish(tx: Tx, report: _TurnReport) -> dict[str, Any]:
    turn = read_turn(tx, report.turn_id)
    if turn is None:
        return _receipt("absent", None)
    _same_turn(turn, report)
    if turn.status != "open":
        return _receipt("settled", turn)  # a repeat, or a turn closed as lost meanwhile
    assert report.stop_reason is not None
    _end(tx, turn, report.stop_reason, report.response_entry_id, report)
    return _receipt("settled", read_turn(tx, report.turn_id))


def _end(
    tx: Tx, turn: TurnRow, status: str, entry: str | None, report: _TurnReport | None = None
) -> None:
    """End one open turn with its consequences, in the caller's transaction: an aborted
    step turn pauses its run (which cancels its pending step messages); a completed turn
    of an assistant-message step with a visible reply settles the step with it."""
    end_turn(tx, turn, status, entry)
    record_interaction_event(
        tx, turn.run_id, EVENT_TURN_ENDED, {"turnId": turn.turn_id, "status": status}
    )
    message = read_message(tx, turn.message_id)
    if message is not None and message.kind in ("terminal", "follow_up"):
        _present_follow_up(tx, message.run_id)
    if message is None or message.kind != "step":
        return
    suspend_request_time(tx, message.source_id)  # the time used in this turn is kept
    if status == "completed" and report is not None and report.reply:
        _settle_visible_step(tx, turn, message, report)
    if status != "aborted":
        _count_unproductive(tx, message)  # nothing to count once the reply settled it
        return
    if run_unfinished_unpaused(tx, turn.run_id):
        try:
            pause_run(tx, turn.run_id)
        except (InvalidTransitionError, ClaimLostError):  # a live claim holds it: no pause
            return


def _present_follow_up(tx: Tx, run_id: str) -> None:
    """A terminal or follow-up turn ended: the chain's next follow-up may now be due."""
    created = present_next_follow_up(tx, run_id)
    if created is not None:
        record_interaction_event(
            tx, run_id, EVENT_MESSAGE_CREATED, {"messageId": created, "kind": "follow_up"}
        )


# --- assistant-message steps ---------------------------------------------------------


def visible_output(text: str, max_chars: int | None, *, cut: bool = False) -> dict[str, Any]:
    """The output of an assistant-message step: `{"text": ...}` bounded by `max_chars`; a
    longer reply keeps its rest as `overflow` (`truncated: true`). `cut`: the extension
    already cut the reply to fit a frame (`truncated: true`, nothing more is known)."""
    output: dict[str, Any] = {"text": text}
    if max_chars is not None and len(text) > max_chars:
        output = {"text": text[:max_chars], "truncated": True, "overflow": text[max_chars:]}
    if cut:
        output["truncated"] = True
    return output


def _settle_visible_step(tx: Tx, turn: TurnRow, message: MessageRow, report: _TurnReport) -> None:
    """The turn's visible reply is the output of its assistant-message step: recorded and
    accepted under the submission checks (binding, pending, attempt unfinished, not
    paused), idempotent by the turn ID. A refusal settles nothing: the turn then counts
    as unproductive, as any turn without an output does."""
    request = read_request(tx, message.source_id)
    if request is None or request.kind != VISIBLE_KIND or report.reply is None:
        return
    contract = read_json_blob(tx, request.contract_hash)
    bound = contract.get("maxChars") if isinstance(contract, Mapping) else None
    max_chars = bound if isinstance(bound, int) and not isinstance(bound, bool) else None
    result = record_submission(
        tx,
        request_id=request.request_id,
        submission_id=f"submission-{turn.turn_id}",
        idempotency_key=turn.turn_id,
        value=visible_output(report.reply, max_chars, cut=report.reply_cut),
        kind=VISIBLE_KIND,
        origin_session_id=turn.session_id,
    )
    if result.status == "new" and result.submission is not None:
        # Nothing to validate (no schema, no `validate`): accepted in this transaction,
        # which also puts the waiting run back in the admission line.
        settle_submission(tx, submission_id=result.submission.submission_id, accepted=True)


# --- reminders and unproductive turns ------------------------------------------------

REMINDER_NOTE: Final = (
    "This workflow step is still waiting for its output (reason: reminder). Complete it "
    "by calling the `workflow` tool with action submit, as the step contract says."
)
VISIBLE_REMINDER_NOTE: Final = (
    "This workflow step is still waiting for its output (reason: reminder). Answer with a "
    "normal visible reply: your final reply of this turn is the step's output."
)


def _count_unproductive(tx: Tx, message: MessageRow) -> None:
    """A completed, failed or lost turn of an open step with no accepted or validating
    submission: values 1 and 2 of the durable counter present one `reminder` step (at
    most one pending), a value above 2 fails the attempt (`agentUnproductive`)."""
    counted = unproductive_turn_ends(tx, message.source_id)
    if counted is None:
        return  # the turn does not count: settled, validating, paused or finished
    count = counted + 1
    set_unproductive_turn_ends(tx, message.source_id, count)
    record_interaction_event(
        tx,
        message.run_id,
        EVENT_UNPRODUCTIVE_TURN,
        {"requestId": message.source_id, "count": count},
    )
    if count > UNPRODUCTIVE_TURN_LIMIT:
        _fail_unproductive(tx, message, count)
        return
    if pending_step_message(tx, message.source_id):
        return  # a pending step (a reminder or a re-presentation) is already there
    first = read_json_blob(tx, message.content_digest)
    contract = first.get("contract") if isinstance(first, Mapping) else None
    visible = isinstance(contract, Mapping) and contract.get("visible") is True
    reminder = insert_message(
        tx,
        run_id=message.run_id,
        session_id=message.target_session_id,
        kind="step",
        reason="reminder",
        source_id=message.source_id,
        content={
            "prompt": VISIBLE_REMINDER_NOTE if visible else REMINDER_NOTE,
            "contract": contract,
            "reminder": count,
        },
    )
    record_interaction_event(
        tx,
        message.run_id,
        EVENT_MESSAGE_CREATED,
        {"messageId": reminder, "kind": "step", "reason": "reminder"},
    )


def _fail_unproductive(tx: Tx, message: MessageRow, count: int) -> None:
    """Above the limit: the attempt fails and its request closes, and the run goes back
    to the admission line, so a new runner routes the failure (or fails the run)."""
    request = read_request(tx, message.source_id)
    assert request is not None
    missing = (
        "a visible reply" if request.kind == VISIBLE_KIND else "an accepted workflow submission"
    )
    error = f"agentUnproductive: the agent ended {count} turns without {missing}"

    def fail(tx: Tx) -> None:
        close_attempt(tx, request.attempt_id, status="failed", error=error)
        cancel_pending_request(tx, request.request_id)
        cancel_step_messages(tx, request.request_id)

    requeue_run(tx, message.run_id, reason="agentUnproductive", change=fail)


# --- sessionView.clearTerminal -------------------------------------------------------


def clear_terminal_view(
    db: Database, request: RequestMessage, *, connection_id: str, epochs: ActiveEpochs
) -> dict[str, Any]:
    """`/workflow clear`: the session view drops its retained terminal run. A user
    control, not a coordinator report: any connection of the user may send it."""
    del connection_id, epochs
    try:
        session = _required_id(request["payload"], "sessionId")
    except OperationError as exc:
        return rejected(request, exc.outcome, exc.code, str(exc))
    return response(request, "accepted", receipt={"clearedRunId": clear_terminal(db, session)})
