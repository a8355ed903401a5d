"""Checkpoint decisions: opened when a run waits, answered once, continued by a new run.

Implements workflow-server.md § Durable protocol records for ordinary checkpoints: one
pending decision per waiting run, one accepted resolution, one continuation run. An
answer must satisfy the checkpoint's `answerSchema` in the run's definition snapshot.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from pi_workflows.storage import _queries as q
from pi_workflows.storage._content import put_json_blob, read_json_blob
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._errors import (
    ContentUnavailableError,
    InvalidTransitionError,
    RunNotFoundError,
    StorageError,
)
from pi_workflows.storage._lifecycle import NewRun, complete_run, enqueue_run
from pi_workflows.storage._phases import ExecutionMode
from pi_workflows.storage._reads import get_run
from pi_workflows.wire.canonical import sha256_digest
from pi_workflows.wire.schema_errors import first_violation

__all__ = [
    "AnswerInvalidError",
    "CheckpointAnswer",
    "PendingDecision",
    "answer_checkpoint",
    "checkpoint_answer_schema",
    "decision_audience",
    "open_checkpoint_decision",
    "pending_decision",
    "read_continuation",
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
    a refused answer writes nothing.

    Raises:
        RunNotFoundError: no such run.
        InvalidTransitionError: the run is not waiting at a checkpoint (or is paused).
        AnswerInvalidError: the answer does not satisfy the schema, or the snapshot
            is not stored.
    """
    parent = get_run(tx, run_id)
    if parent is None:
        raise RunNotFoundError(run_id)
    decision = pending_decision(tx, run_id)
    if decision is None or parent.status != "waiting":
        raise InvalidTransitionError(run_id, parent.status, "answer checkpoint")
    if parent.paused:
        raise InvalidTransitionError(run_id, "waiting (paused)", "answer checkpoint")
    _check_answer(checkpoint_answer_schema(tx, run_id, decision.node_path), answer)
    response_hash = put_json_blob(tx, answer)
    answer_digest = sha256_digest(answer)
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
        "decision_id": decision.decision_id,
        "response_hash": response_hash,
        "answer_digest": answer_digest,
        "idempotency_key": idempotency_key,
        "source": source,
        "continuation_run_id": continuation_id,
        "now": tx.now,
    }
    tx.execute(q.INSERT_DECISION_RESOLUTION_ACCEPTED, params)
    tx.execute(q.INSERT_DECISION_ANSWER_ACCEPTED, params)
    tx.execute(q.UPDATE_DECISION_ACCEPTED, params)
    complete_run(
        tx, run_id, payload={"continuedBy": continuation_id, "decisionId": decision.decision_id}
    )
    return CheckpointAnswer(decision.decision_id, run_id, continuation_id, started.revision)


def checkpoint_answer_schema(reader: Reader, run_id: str, node_path: str) -> Any | None:
    """The `answerSchema` of checkpoint `node_path` in the run's definition snapshot.

    Returns None when the checkpoint declares no schema (any JSON answer is accepted).

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
    return node.get("answerSchema")


def _check_answer(schema: Any | None, answer: Any) -> None:
    if schema is None:
        return
    try:
        violation = first_violation(Draft202012Validator(schema).iter_errors(answer))
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
