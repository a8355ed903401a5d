"""Decisions: opened when a run waits, answered once, continued by a new run.

Implements workflow-server.md § Durable protocol records for ordinary checkpoints and
protected human decisions: one pending decision per waiting run, one accepted resolution
(the single fence), one continuation run; an answer must fit the snapshot's node.
"""

# A protected decision (`human_decision(...)`, audience other than `checkpoint`) has an
# operator presentation (summary and choices, a blob; never a structured subject), and,
# with `on_timeout`, an `expires_at` and a validated default answer. It is answered only
# by `answer_protected_decision` (a person through `decision.answer`, Pi, or a channel)
# or, at the deadline, by `time_out_protected_decision` (provenance `timeout`): the same
# fence, the same continuation, so exactly one answer wins.

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Final

from jsonschema.exceptions import SchemaError

from pi_workflows.storage import _queries as q
from pi_workflows.storage._claims import Claim, OwnerType, acquire_claim
from pi_workflows.storage._content import put_json_blob, read_json_blob
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._errors import (
    ContentUnavailableError,
    InvalidTransitionError,
    RunNotFoundError,
    StorageError,
)
from pi_workflows.storage._lifecycle import NewRun, complete_run, enqueue_run, fail_run
from pi_workflows.storage._messages import insert_message
from pi_workflows.storage._phases import ExecutionMode, FailureClass
from pi_workflows.storage._reads import get_run
from pi_workflows.storage._rows import RunRow
from pi_workflows.wire.canonical import dumps, sha256_digest
from pi_workflows.wire.decisions import (
    PRESENTATION_SCHEMA,
    answer_problem,
    choices_from_wire,
    presentation_text,
)
from pi_workflows.wire.schema_check import check_schema

__all__ = [
    "ANSWER_OUTCOMES",
    "CHECKPOINT_AUDIENCE",
    "CONFLICT_REASONS",
    "DECISION_LIST_LIMIT",
    "REJECTION_REASONS",
    "AnswerInvalidError",
    "CheckpointAnswer",
    "DecisionOutcome",
    "DueDecision",
    "PendingDecision",
    "PendingProtectedDecision",
    "ProtectedAnswer",
    "ProtectedDecisionRow",
    "answer_checkpoint",
    "answer_protected_decision",
    "checkpoint_answer_schema",
    "decision_audience",
    "decision_message",
    "decision_node",
    "decision_outcome",
    "due_decisions",
    "next_decision_due",
    "open_checkpoint_decision",
    "open_protected_decision",
    "open_waiting_decision",
    "pending_decision",
    "pending_protected_decisions",
    "protected_decision_row",
    "read_continuation",
    "read_protected_decision",
    "run_protected_decision",
    "time_out_protected_decision",
]


class AnswerInvalidError(StorageError):
    """A checkpoint answer was refused before anything was written.

    `code` is `answerInvalid` (the answer does not satisfy the checkpoint's
    `answerSchema`; `path` is the JSON Pointer of the failing value, `""` for the whole
    answer) or `definitionUnavailable` (the run's definition snapshot is not stored, so
    the answer cannot be checked).
    """

    def __init__(self, code: str, message: str, path: str | None = None) -> None:
        self.code = code
        self.path = path
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class PendingDecision:
    """The open checkpoint of a waiting run."""

    decision_id: str
    run_id: str
    attempt_id: str | None
    node_path: str
    request_hash: str | None = None
    """The blob of what is asked: `{"summary"}` for a checkpoint, the operator
    presentation (summary and choices) for a protected decision."""


@dataclass(frozen=True, slots=True)
class CheckpointAnswer:
    """What an accepted answer committed."""

    decision_id: str
    parent_run_id: str
    continuation_run_id: str
    revision: int
    """The continuation run's revision (1: it is queued)."""


@dataclass(frozen=True, slots=True)
class _Binding:
    execution_mode: str
    origin_session_id: str | None


@dataclass(frozen=True, slots=True)
class _Continuation:
    decision_id: str
    run_id: str
    attempt_id: str | None
    node_path: str
    response_hash: str


def open_checkpoint_decision(
    tx: Tx, run_id: str, *, attempt_id: str | None, node_path: str, request: Any
) -> str:
    """Record the pending decision of a run that waits at a checkpoint; return its ID.

    Call it in the `change` of the `wait_run` transition, so the run never waits
    without its decision.
    """
    decision_id = f"decision-{uuid.uuid4().hex}"
    tx.execute(
        q.INSERT_CHECKPOINT_DECISION,
        {
            "decision_id": decision_id,
            "run_id": run_id,
            "attempt_id": attempt_id,
            "node_path": node_path,
            "request_digest": sha256_digest(request),
            "request_hash": put_json_blob(tx, request),
            "now": tx.now,
        },
    )
    return decision_id


def decision_audience(reader: Reader, run_id: str) -> str | None:
    """The audience of the run's latest decision (`checkpoint` for an ordinary one)."""
    value = reader.fetch_value(
        "SELECT audience FROM human_decisions WHERE run_id = :r "
        "ORDER BY created_at DESC, rowid DESC LIMIT 1",
        {"r": run_id},
    )
    return None if value is None else str(value)


def pending_decision(reader: Reader, run_id: str) -> PendingDecision | None:
    """The run's pending checkpoint decision, if any."""
    return reader.fetch_one(q.SELECT_PENDING_DECISION, {"run_id": run_id}, PendingDecision)


def answer_checkpoint(
    tx: Tx, run_id: str, *, answer: Any, idempotency_key: str, source: str = "cli"
) -> CheckpointAnswer:
    """Accept the one answer of a waiting run's checkpoint and start its continuation.

    In one transaction: the resolution (exactly one per decision), the answer record,
    the continuation run (queued, `continuation_of` the parent, same source and input),
    and the parent's completion, settled by its continuation.

    The answer is checked first against the checkpoint node's `answerSchema` in the
    run's definition snapshot (stored as the blob named by its definition digest);
    a refused answer writes nothing. A protected decision is refused
    (`protectedDecision`): a person answers it with `decision.answer`.

    Raises:
        RunNotFoundError: no such run.
        InvalidTransitionError: the run is not waiting at a checkpoint (or is paused).
        AnswerInvalidError: the answer does not satisfy the schema, the snapshot
            is not stored, or the decision is protected.
    """
    parent = get_run(tx, run_id)
    if parent is None:
        raise RunNotFoundError(run_id)
    decision = pending_decision(tx, run_id)
    if decision is None or parent.status != "waiting":
        raise InvalidTransitionError(run_id, parent.status, "answer checkpoint")
    if decision_audience(tx, run_id) != CHECKPOINT_AUDIENCE:
        raise AnswerInvalidError(
            "protectedDecision",
            "the run waits at a protected human decision; answer it with "
            "`pi-workflows decision answer` or /workflow answer",
        )
    if parent.paused:
        raise InvalidTransitionError(run_id, "waiting (paused)", "answer checkpoint")
    _check_answer(checkpoint_answer_schema(tx, run_id, decision.node_path), answer)
    continuation_id, revision = _continue(
        tx,
        parent,
        decision.decision_id,
        answer,
        provenance="human",
        source=source,
        idempotency_key=idempotency_key,
    )
    return CheckpointAnswer(decision.decision_id, run_id, continuation_id, revision)


def _continue(
    tx: Tx,
    parent: RunRow,
    decision_id: str,
    answer: Any,
    *,
    provenance: str,
    source: str | None,
    idempotency_key: str | None,
    claim: Claim | None = None,
    protected: bool = False,
) -> tuple[str, int]:
    """The accepted answer's one transaction: the resolution (the fence), the answer
    record (a person's), the continuation run (queued), and the parent's completion
    (under `claim` when one is given: the timeout's control claim, released by it).
    Returns the continuation's run ID and revision."""
    run_id = parent.run_id
    continuation_id = f"run-{uuid.uuid4().hex}"
    binding = tx.fetch_one(
        "SELECT execution_mode, origin_session_id FROM run_bindings WHERE run_id = :r",
        {"r": run_id},
        _Binding,
    )
    interactive = binding is not None and binding.execution_mode == ExecutionMode.INTERACTIVE
    if interactive:
        # The continuation stays in the origin session: the parent hands its session
        # reservation over in this transaction (its completion would release it anyway).
        tx.execute(q.UPDATE_BINDING_RELEASE, {"run_id": run_id, "now": tx.now})
    started = enqueue_run(
        tx,
        NewRun(
            run_id=continuation_id,
            workflow_name=parent.workflow_name,
            project_path=parent.project_path,
            source_identity=read_source(parent.source_identity),
            definition_digest=parent.definition_digest,
            input_hash=parent.input_hash,
            input=read_source(parent.input),
            title=parent.title,
            continuation_of=run_id,
            execution_mode=ExecutionMode.INTERACTIVE if interactive else ExecutionMode.HEADLESS,
            origin_session_id=binding.origin_session_id if interactive and binding else None,
        ),
    )
    params = {
        "decision_id": decision_id,
        "provenance": provenance,
        "response_hash": put_json_blob(tx, answer),
        "answer_digest": sha256_digest(answer),
        "idempotency_key": idempotency_key,
        "source": source,
        "continuation_run_id": continuation_id,
        "now": tx.now,
    }
    tx.execute(q.INSERT_DECISION_RESOLUTION_ACCEPTED, params)
    if idempotency_key is not None and source is not None:
        tx.execute(q.INSERT_DECISION_ANSWER_ACCEPTED, params)
    tx.execute(q.UPDATE_DECISION_ACCEPTED, params)
    payload: dict[str, Any] = {"continuedBy": continuation_id, "decisionId": decision_id}
    if protected:  # who answered (never the answer): the run's event says it
        payload["provenance"] = provenance
        if source is not None:
            payload["sourceChannel"] = source
    complete_run(tx, run_id, claim=claim, payload=payload)
    return continuation_id, started.revision


def checkpoint_answer_schema(reader: Reader, run_id: str, node_path: str) -> Any | None:
    """The `answerSchema` of checkpoint `node_path` in the run's definition snapshot.

    Returns None when the checkpoint declares no schema (any JSON answer is accepted).

    Raises:
        RunNotFoundError: no such run.
        AnswerInvalidError: `definitionUnavailable`: the snapshot blob is missing or
            corrupt, or does not name the node.
    """
    return decision_node(reader, run_id, node_path).get("answerSchema")


def _check_answer(schema: Any | None, answer: Any) -> None:
    if schema is None:
        return
    try:
        violation = check_schema(schema).first_violation(answer)
    except SchemaError as exc:  # the resolver checked it; a snapshot is never edited
        raise AnswerInvalidError(  # the schema's own text (the author's), not the answer
            "definitionUnavailable", f"the checkpoint's answerSchema is invalid: {exc.message}"
        ) from None
    if violation is None:
        return
    # The place and the rule only: the answer may be private, and this message is
    # stored in the receipt and printed by the CLI.
    raise AnswerInvalidError(
        "answerInvalid",
        "the answer does not match the checkpoint's answerSchema "
        + violation.describe("the whole answer")[:900],
        violation.pointer,
    )


def read_continuation(
    reader: Reader, continuation_run_id: str
) -> tuple[PendingDecision, Any] | None:
    """The decision a continuation run continues, with its accepted answer; None if none."""
    row = reader.fetch_one(
        q.SELECT_CONTINUATION_DECISION, {"continuation_run_id": continuation_run_id}, _Continuation
    )
    if row is None:
        return None
    decision = PendingDecision(row.decision_id, row.run_id, row.attempt_id, row.node_path)
    return decision, read_json_blob(reader, row.response_hash)


def read_source(text: str) -> Any:
    """Decode a JSON column of `runs` (source identity or input)."""
    return json.loads(text)


# --- Protected human decisions ---------------------------------------------------------

CHECKPOINT_AUDIENCE: Final = "checkpoint"
"""The audience of an ordinary checkpoint; every other audience is a protected decision."""
DECISION_LIST_LIMIT: Final = 500
"""Pending protected decisions one list returns at most (oldest first)."""

ANSWER_OUTCOMES: Final = ("accepted", "adopted", "conflict", "rejected")
REJECTION_REASONS: Final = ("notFound", "expired", "paused", "invalid", "settled")
CONFLICT_REASONS: Final = ("answeredDifferently", "keyReused")


@dataclass(frozen=True, slots=True)
class ProtectedAnswer:
    """What `answer_protected_decision` did (nothing was written unless `accepted`).

    `outcome`:
    - `accepted`: this answer won; `continuation_run_id` is the queued continuation.
    - `adopted`: the same answer already won (a repeat of this idempotency key, or the
      same answer under another key); nothing changed.
    - `conflict`: another answer won (`reason` `answeredDifferently`), or this key was
      used with a different answer (`keyReused`); nothing changed.
    - `rejected`: `reason` is `notFound` (no such protected decision), `expired` (its
      deadline passed: the default answer wins or has won), `paused` (the run is
      paused; answer after resume), `invalid` (the answer does not fit the decision;
      `pointer` names where) or `settled` (cancelled with its run, or otherwise closed).
    """

    outcome: str
    decision_id: str
    run_id: str | None = None
    reason: str | None = None
    message: str | None = None
    pointer: str | None = None
    continuation_run_id: str | None = None
    revision: int | None = None
    """The decision's answer revision after this answer (1 while pending)."""
    provenance: str | None = None
    """Of the winning answer (`human` or `timeout`), when one won."""


@dataclass(frozen=True, slots=True)
class PendingProtectedDecision:
    """A pending protected decision as the operator (and a channel) sees it: no subject,
    no answers, only the presentation."""

    decision_id: str
    run_id: str
    workflow_name: str
    node_path: str
    audience: str
    revision: int
    created_at: int
    expires_at: int | None
    has_default: bool
    paused: bool
    presentation: dict[str, Any]
    """`{"schema": PRESENTATION_SCHEMA, "summary": text, "choices": [{"id", "label",
    "input"?: {"name", "prompt", "minLength", "maxLength"}}], "answerSchema"?: schema}`."""

    def to_wire(self) -> dict[str, Any]:
        """The `decision.list` item."""
        return {
            "decisionId": self.decision_id,
            "runId": self.run_id,
            "workflow": self.workflow_name,
            "node": self.node_path,
            "audience": self.audience,
            "revision": self.revision,
            "createdAt": self.created_at,
            "expiresAt": self.expires_at,
            "hasDefault": self.has_default,
            "paused": self.paused,
            "summary": self.presentation.get("summary"),
            "choices": self.presentation.get("choices") or [],
            **(
                {"answerSchema": self.presentation["answerSchema"]}
                if "answerSchema" in self.presentation
                else {}
            ),
        }


@dataclass(frozen=True, slots=True)
class DecisionOutcome:
    """How a protected decision ended, for a settlement text (no answer content beyond
    the chosen choice's ID and label)."""

    decision_id: str
    run_id: str
    status: str
    """`pending`, `accepted` or `cancelled`."""
    provenance: str | None
    source_channel: str | None
    choice: str | None
    label: str | None
    resolved_at: int | None
    cancel_reason: str | None


@dataclass(frozen=True, slots=True)
class DueDecision:
    """A pending protected decision of a waiting, unpaused run with a timeout default."""

    decision_id: str
    run_id: str
    expires_at: int


@dataclass(frozen=True, slots=True)
class _DecisionRow:
    decision_id: str
    run_id: str
    node_path: str
    audience: str
    status: str
    revision: int
    request_hash: str
    expires_at: int | None
    default_response_hash: str | None
    continuation_run_id: str | None


@dataclass(frozen=True, slots=True)
class _Resolution:
    outcome: str
    provenance: str | None
    answer_digest: str | None
    response_hash: str | None
    source_channel: str | None
    cancel_reason: str | None
    resolved_at: int


@dataclass(frozen=True, slots=True)
class _PendingRow:
    decision_id: str
    run_id: str
    workflow_name: str
    node_path: str
    audience: str
    revision: int
    created_at: int
    expires_at: int | None
    has_default: int
    paused: int
    request_hash: str


_SELECT_DECISION = """
SELECT decision_id, run_id, node_path, audience, status, revision, request_hash, expires_at,
       default_response_hash, continuation_run_id
FROM human_decisions WHERE decision_id = :d
"""
_SELECT_RESOLUTION = """
SELECT outcome, provenance, answer_digest, response_hash, source_channel, cancel_reason,
       resolved_at
FROM human_decision_resolutions WHERE decision_id = :d
"""
_SELECT_KEY_ANSWER = """
SELECT answer_digest FROM human_decision_answers WHERE decision_id = :d AND idempotency_key = :k
"""
_INSERT_PROTECTED_DECISION = """
INSERT INTO human_decisions (
    decision_id, run_id, attempt_id, node_path, audience, request_digest, request_hash,
    status, expires_at, default_response_hash, created_at, updated_at
) VALUES (
    :decision_id, :run_id, :attempt_id, :node_path, :audience, :request_digest,
    :request_hash, 'pending', :expires_at, :default_hash, :now, :now
)
"""
# Pending protected decisions, oldest first (`:run` and `:audience` narrow it when set).
_SELECT_PENDING_PROTECTED = """
SELECT d.decision_id, d.run_id, r.workflow_name, d.node_path, d.audience, d.revision,
       d.created_at, d.expires_at, d.default_response_hash IS NOT NULL AS has_default,
       r.paused, d.request_hash
FROM human_decisions d JOIN runs r ON r.run_id = d.run_id
WHERE d.status = 'pending' AND d.audience != 'checkpoint'
  AND (:run IS NULL OR d.run_id = :run) AND (:audience IS NULL OR d.audience = :audience)
ORDER BY d.created_at, d.decision_id LIMIT :limit
"""
# Decisions whose default can win: pending, with a deadline, the run waiting, unpaused
# (a paused run's default waits for its resume; no answer can win meanwhile).
_SELECT_DUE = """
SELECT d.decision_id, d.run_id, d.expires_at
FROM human_decisions d JOIN runs r ON r.run_id = d.run_id
WHERE d.status = 'pending' AND d.expires_at IS NOT NULL
  AND d.default_response_hash IS NOT NULL
  AND r.status = 'waiting' AND r.paused = 0
ORDER BY d.expires_at, d.decision_id
"""


def decision_node(reader: Reader, run_id: str, node_path: str) -> dict[str, Any]:
    """Node `node_path` of the run's definition snapshot.

    Raises:
        RunNotFoundError: no such run.
        AnswerInvalidError: `definitionUnavailable`: the snapshot blob is missing or
            corrupt, or does not name the node.
    """
    run = get_run(reader, run_id)
    if run is None:
        raise RunNotFoundError(run_id)
    try:
        snapshot = read_json_blob(reader, run.definition_digest)
    except ContentUnavailableError as exc:
        raise AnswerInvalidError(
            "definitionUnavailable",
            f"the definition snapshot of run {run_id} is not stored ({exc.reason}); "
            "the answer cannot be checked",
        ) from None
    nodes = snapshot.get("nodes") if isinstance(snapshot, dict) else None
    node = nodes.get(node_path) if isinstance(nodes, dict) else None
    if not isinstance(node, dict):
        raise AnswerInvalidError(
            "definitionUnavailable",
            f"the definition snapshot of run {run_id} has no node {node_path!r}",
        )
    return node


def open_waiting_decision(
    tx: Tx, run_id: str, *, attempt_id: str | None, node_path: str, output: Any
) -> str:
    """The decision of a run that waits at a checkpoint node: protected when the
    snapshot marks the node so (`human_decision`), else ordinary. Returns its ID. Call
    it in the `change` of the `wait_run` transition."""
    summary = output.get("summary") if isinstance(output, dict) else None
    try:
        node = decision_node(tx, run_id, node_path)
    except AnswerInvalidError:
        node = {}
    if node.get("protected") is True:
        return open_protected_decision(
            tx, run_id, attempt_id=attempt_id, node_path=node_path, node=node, summary=summary
        )
    return open_checkpoint_decision(
        tx, run_id, attempt_id=attempt_id, node_path=node_path, request={"summary": summary}
    )


def open_protected_decision(
    tx: Tx,
    run_id: str,
    *,
    attempt_id: str | None,
    node_path: str,
    node: dict[str, Any],
    summary: Any,
) -> str:
    """Record a pending protected decision (its presentation a blob, its deadline and
    default when the node has `onTimeout`); an interactive run's origin session gets one
    passive `decision` workflow message in the same transaction. Returns its ID."""
    presentation: dict[str, Any] = {
        "schema": PRESENTATION_SCHEMA,
        "summary": str(summary if summary is not None else node.get("summary") or ""),
        "choices": node.get("choices") or [],
    }
    if node.get("answerSchema") is not None:
        presentation["answerSchema"] = node["answerSchema"]
    timeout = node.get("onTimeout")
    expires_at: int | None = None
    default_hash: str | None = None
    if isinstance(timeout, dict) and isinstance(timeout.get("afterMs"), int):
        expires_at = tx.now + int(timeout["afterMs"])
        default_hash = put_json_blob(tx, timeout.get("defaultAnswer"))
    decision_id = f"decision-{uuid.uuid4().hex}"
    tx.execute(
        _INSERT_PROTECTED_DECISION,
        {
            "decision_id": decision_id,
            "run_id": run_id,
            "attempt_id": attempt_id,
            "node_path": node_path,
            "audience": str(node.get("audience") or "operator"),
            "request_digest": sha256_digest(presentation),
            "request_hash": put_json_blob(tx, presentation),
            "expires_at": expires_at,
            "default_hash": default_hash,
            "now": tx.now,
        },
    )
    session = tx.fetch_value(
        "SELECT origin_session_id FROM run_bindings WHERE run_id = :r "
        "AND execution_mode = 'interactive'",
        {"r": run_id},
    )
    if session is not None:
        workflow = tx.fetch_value("SELECT workflow_name FROM runs WHERE run_id = :r", {"r": run_id})
        content = decision_message(
            decision_id,
            run_id,
            str(workflow),
            presentation=presentation,
            expires_at=expires_at,
            has_default=default_hash is not None,
        )
        insert_message(
            tx,
            run_id=run_id,
            session_id=str(session),
            kind="decision",
            source_id=decision_id,
            content=content,
        )
    return decision_id


def decision_message(
    decision_id: str,
    run_id: str,
    workflow: str,
    *,
    presentation: dict[str, Any],
    expires_at: int | None,
    has_default: bool,
) -> dict[str, Any]:
    """The content of a `decision` workflow message: passive (it never opens a model
    turn); its `text` is what Pi shows, with how a person answers."""
    shown = {**presentation, "expiresAt": expires_at, "hasDefault": has_default}
    choices = choices_from_wire(presentation.get("choices"))
    example = dumps({"choice": choices[0].choice_id}).decode("utf-8") if choices else "JSON"
    text = (
        f"Workflow {workflow} ({run_id}) needs a person's decision.\n\n"
        f"{presentation_text(shown)}\n\n"
        f"Answer with /workflow answer {example} (the model cannot answer it)."
    )
    return {
        "runId": run_id,
        "decisionId": decision_id,
        "workflow": workflow,
        "summary": presentation.get("summary"),
        "choices": presentation.get("choices") or [],
        "expiresAt": expires_at,
        "text": text,
    }


def answer_protected_decision(
    tx: Tx,
    decision_id: str,
    answer: Any,
    *,
    source_channel: str,
    idempotency_key: str,
    now: int | None = None,
) -> ProtectedAnswer:
    """A person's answer to a protected decision, in the caller's transaction.

    Checks, in order: the decision exists and is protected; a repeat of this key adopts
    (same answer) or conflicts; a resolved decision adopts the same answer, conflicts
    with another, or rejects (`expired` after a timeout default, `settled` after a
    cancellation); the deadline (`now >= expires_at` is `expired`, even before the
    timeout has run); the pause; the answer itself. Only then does it accept: the one
    resolution (provenance `human`, `source_channel`), the answer record under
    `idempotency_key`, the queued continuation and the parent's completion (its events;
    pending decision messages are cancelled with it). Any other outcome writes nothing.

    `now` defaults to the transaction's clock.
    """
    instant = tx.now if now is None else now
    row = tx.fetch_one(_SELECT_DECISION, {"d": decision_id}, _DecisionRow)
    if row is None or row.audience == CHECKPOINT_AUDIENCE:
        return ProtectedAnswer(
            "rejected", decision_id, reason="notFound", message="no such protected decision"
        )
    try:
        digest = sha256_digest(answer)
    except Exception:  # noqa: BLE001 - not canonical JSON: the answer's own fault
        return _refused(row, "invalid", "the answer is not plain JSON", "")
    earlier = tx.fetch_value(_SELECT_KEY_ANSWER, {"d": decision_id, "k": idempotency_key})
    resolution = tx.fetch_one(_SELECT_RESOLUTION, {"d": decision_id}, _Resolution)
    if earlier is not None:
        if earlier == digest:
            return _won(row, "adopted", resolution)
        return ProtectedAnswer(
            "conflict",
            decision_id,
            row.run_id,
            reason="keyReused",
            message="this idempotency key already answered the decision differently",
            revision=row.revision,
        )
    if resolution is not None:
        return _after_resolution(row, resolution, digest)
    if row.status != "pending":
        return _refused(row, "settled", "the decision is closed")
    if row.expires_at is not None and instant >= row.expires_at:
        return _refused(
            row, "expired", "the decision's deadline has passed; its default answer wins"
        )
    parent = get_run(tx, row.run_id)
    if parent is None or parent.status != "waiting":
        return _refused(row, "settled", "the run no longer waits at this decision")
    if parent.paused:
        return _refused(row, "paused", "the run is paused; resume it, then answer")
    node = decision_node(tx, row.run_id, row.node_path)
    problem = answer_problem(
        answer,
        choices=choices_from_wire(node.get("choices")),
        answer_schema=node.get("answerSchema"),
    )
    if problem is not None:
        return _refused(row, "invalid", problem[1], problem[0])
    continuation_id, _ = _continue(
        tx,
        parent,
        decision_id,
        answer,
        provenance="human",
        source=source_channel,
        idempotency_key=idempotency_key,
        protected=True,
    )
    return ProtectedAnswer(
        "accepted",
        decision_id,
        row.run_id,
        continuation_run_id=continuation_id,
        revision=row.revision + 1,
        provenance="human",
    )


def _refused(
    row: _DecisionRow, reason: str, message: str, pointer: str | None = None
) -> ProtectedAnswer:
    return ProtectedAnswer(
        "rejected",
        row.decision_id,
        row.run_id,
        reason=reason,
        message=message,
        pointer=pointer,
        revision=row.revision,
    )


def _won(row: _DecisionRow, outcome: str, resolution: _Resolution | None) -> ProtectedAnswer:
    return ProtectedAnswer(
        outcome,
        row.decision_id,
        row.run_id,
        continuation_run_id=row.continuation_run_id,
        revision=row.revision,
        provenance=resolution.provenance if resolution is not None else None,
    )


def _after_resolution(row: _DecisionRow, resolution: _Resolution, digest: str) -> ProtectedAnswer:
    if resolution.outcome == "cancelled":
        return _refused(row, "settled", "the decision was cancelled with its run")
    if resolution.provenance == "timeout":
        return _refused(row, "expired", "the decision's deadline passed and its default answer won")
    if resolution.answer_digest == digest:
        return _won(row, "adopted", resolution)
    return ProtectedAnswer(
        "conflict",
        row.decision_id,
        row.run_id,
        reason="answeredDifferently",
        message="the decision was already answered differently",
        revision=row.revision,
        provenance=resolution.provenance,
    )


def time_out_protected_decision(
    tx: Tx, decision_id: str, *, owner_id: str, ttl_ms: int
) -> str | None:
    """The deadline of a protected decision, in one transaction: take a control claim on
    the waiting parent (a new generation), record the validated default as the one
    resolution (provenance `timeout`), close the decision and its pending message,
    queue the continuation and complete the parent, which releases the claim. Returns
    the continuation's run ID, or None when nothing is due any more (answered, paused,
    cancelled or not yet expired: re-checked here, inside the transaction).

    A default that no longer fits the decision (a corrupt snapshot) fails the run
    instead (`decisionDefaultInvalid`), so a bad row cannot be retried forever.

    Raises:
        ClaimHeldError: a live claim is held on the run (it is not waiting at rest).
    """
    row = tx.fetch_one(_SELECT_DECISION, {"d": decision_id}, _DecisionRow)
    if (
        row is None
        or row.status != "pending"
        or row.expires_at is None
        or row.default_response_hash is None
        or tx.now < row.expires_at
    ):
        return None
    parent = get_run(tx, row.run_id)
    if parent is None or parent.status != "waiting" or parent.paused:
        return None
    claim = acquire_claim(
        tx, row.run_id, owner_type=OwnerType.CONTROL, owner_id=owner_id, ttl_ms=ttl_ms
    )
    try:
        default = read_json_blob(tx, row.default_response_hash)
        node = decision_node(tx, row.run_id, row.node_path)
        problem = answer_problem(
            default,
            choices=choices_from_wire(node.get("choices")),
            answer_schema=node.get("answerSchema"),
        )
    except (ContentUnavailableError, AnswerInvalidError) as exc:
        problem = ("", str(exc))
    if problem is not None:
        fail_run(
            tx,
            row.run_id,
            claim=claim,
            failure_class=FailureClass.NODE_FAILED,
            reason="decisionDefaultInvalid: the timeout default answer cannot answer it",
        )
        return None
    continuation_id, _ = _continue(
        tx,
        parent,
        decision_id,
        default,
        provenance="timeout",
        source=None,
        idempotency_key=None,
        claim=claim,
        protected=True,
    )
    return continuation_id


def due_decisions(reader: Reader) -> list[DueDecision]:
    """Every protected decision whose default can win, earliest deadline first."""
    return reader.fetch_all(_SELECT_DUE, {}, DueDecision)


def next_decision_due(reader: Reader) -> int | None:
    """The earliest deadline of a protected decision whose default can win, or None."""
    return min((due.expires_at for due in due_decisions(reader)), default=None)


def pending_protected_decisions(
    reader: Reader,
    *,
    run_id: str | None = None,
    audience: str | None = None,
    limit: int = DECISION_LIST_LIMIT,
) -> list[PendingProtectedDecision]:
    """Pending protected decisions, oldest first, with their operator presentation (never
    a subject or an answer); `run_id` / `audience` narrow the list."""
    rows = reader.fetch_all(
        _SELECT_PENDING_PROTECTED,
        {"run": run_id, "audience": audience, "limit": max(1, min(limit, DECISION_LIST_LIMIT))},
        _PendingRow,
    )
    found: list[PendingProtectedDecision] = []
    for row in rows:
        try:
            presentation = read_json_blob(reader, row.request_hash)
        except ContentUnavailableError:
            presentation = {"schema": PRESENTATION_SCHEMA, "summary": "", "choices": []}
        found.append(
            PendingProtectedDecision(
                row.decision_id,
                row.run_id,
                row.workflow_name,
                row.node_path,
                row.audience,
                row.revision,
                row.created_at,
                row.expires_at,
                bool(row.has_default),
                bool(row.paused),
                presentation if isinstance(presentation, dict) else {},
            )
        )
    return found


@dataclass(frozen=True, slots=True)
class ProtectedDecisionRow:
    """A protected decision in any state: what it is about and its answer revision."""

    decision_id: str
    run_id: str
    node_path: str
    workflow_name: str
    revision: int
    request_hash: str
    """The presentation blob."""


def protected_decision_row(reader: Reader, decision_id: str) -> ProtectedDecisionRow | None:
    """One protected decision in any state (a late answer still finds it); None for an
    unknown decision or a checkpoint's."""
    return reader.fetch_one(
        q.SELECT_PROTECTED_DECISION, {"decision_id": decision_id}, ProtectedDecisionRow
    )


def run_protected_decision(reader: Reader, run_id: str) -> str | None:
    """The run's protected decision a client's answer means when it names none: its
    pending one, else its latest; None if the run has none."""
    value = reader.fetch_value(q.SELECT_RUN_PROTECTED_DECISION, {"run_id": run_id})
    return None if value is None else str(value)


def read_protected_decision(reader: Reader, decision_id: str) -> PendingProtectedDecision | None:
    """One protected decision's operator view if it is still pending, else None."""
    run_id = reader.fetch_value(
        "SELECT run_id FROM human_decisions WHERE decision_id = :d AND status = 'pending' "
        "AND audience != 'checkpoint'",
        {"d": decision_id},
    )
    if run_id is None:
        return None
    found = pending_protected_decisions(reader, run_id=str(run_id))
    return next((d for d in found if d.decision_id == decision_id), None)


def decision_outcome(reader: Reader, decision_id: str) -> DecisionOutcome | None:
    """How a protected decision ended (or that it is pending); None if there is none.
    The chosen choice and its label are given for a choice decision; a schema answer's
    content never is."""
    row = reader.fetch_one(_SELECT_DECISION, {"d": decision_id}, _DecisionRow)
    if row is None or row.audience == CHECKPOINT_AUDIENCE:
        return None
    resolution = reader.fetch_one(_SELECT_RESOLUTION, {"d": decision_id}, _Resolution)
    choice_id: str | None = None
    label: str | None = None
    if resolution is not None and resolution.response_hash is not None:
        try:
            response = read_json_blob(reader, resolution.response_hash)
            presentation = read_json_blob(reader, row.request_hash)
        except ContentUnavailableError:
            response, presentation = None, {}
        picked = response.get("choice") if isinstance(response, dict) else None
        for item in choices_from_wire(presentation.get("choices")):
            if item.choice_id == picked:
                choice_id, label = item.choice_id, item.label
    return DecisionOutcome(
        decision_id,
        row.run_id,
        row.status,
        resolution.provenance if resolution else None,
        resolution.source_channel if resolution else None,
        choice_id,
        label,
        resolution.resolved_at if resolution else None,
        resolution.cancel_reason if resolution else None,
    )
