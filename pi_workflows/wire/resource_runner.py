"""`resource-runner.v1`: the typed frames of a resource runner's private channel.

One pass per child: the child says `resourceRunner.ready`, the server sends one
`resourceRunner.start` (the manager file, its applied digest, the resource as the pass
reads it, the deadline), and the child answers with one `resourceRunner.result` (the
`ReconcileResult` wire form) or `resourceRunner.failed` (an error class only) and exits.

During the pass the child may ask, one request at a time, and wait for each answer:
`resourceRunner.ensureChild` (`ctx.workflows.ensure`) is answered by
`resourceRunner.childRun`; `resourceRunner.effect` (`ctx.effects.ensure`'s reserve,
settle and retry steps) by `resourceRunner.effectState`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pi_workflows.wire.protocol import ProtocolViolation

__all__ = [
    "EFFECT_OPS",
    "MAX_ERROR_CLASS_CHARS",
    "RESOURCE_RUNNER_SCHEMA",
    "ChildRunAnswered",
    "ChildRunRequested",
    "EffectAnswered",
    "EffectRequested",
    "PassFailed",
    "PassProposed",
    "PassStart",
    "RunnerReadyForPass",
    "decode_child_frame",
    "decode_server_answer",
]

RESOURCE_RUNNER_SCHEMA: Final = "resource-runner.v1"
MAX_ERROR_CLASS_CHARS: Final = 200
"""An error class is a name or code, never a message (storage bounds it the same)."""

_READY: Final = "resourceRunner.ready"
_START: Final = "resourceRunner.start"
_RESULT: Final = "resourceRunner.result"
_FAILED: Final = "resourceRunner.failed"
_ENSURE_CHILD: Final = "resourceRunner.ensureChild"
_CHILD_RUN: Final = "resourceRunner.childRun"
_EFFECT: Final = "resourceRunner.effect"
_EFFECT_STATE: Final = "resourceRunner.effectState"
EFFECT_OPS: Final = frozenset({"reserve", "settle", "retry"})
_KEY_CHARS: Final = 200


def _violation(text: str, location: str = "") -> ProtocolViolation:
    return ProtocolViolation(text, schema_name=RESOURCE_RUNNER_SCHEMA, location=location)


@dataclass(frozen=True, slots=True)
class RunnerReadyForPass:
    """Child → server: the channel is up; send the pass."""

    def to_wire(self) -> dict[str, Any]:
        return {"kind": _READY}


@dataclass(frozen=True, slots=True)
class PassStart:
    """Server → child: the one pass this child makes."""

    manager: str
    path: str
    """The manager file (private: never logged)."""
    source_digest: str
    """The digest applied: other bytes never run."""
    reconcile_id: str
    resource: Mapping[str, Any]
    """`Resource.to_wire()` of the resource as the pass reads it."""
    deadline_ms: int
    """How long the pass may run from the moment the child reads this frame."""
    project_path: str | None = None
    """The resource's project: child runs are resolved and run there (private)."""
    agent_dir: str | None = None
    """The server's Pi agent folder, where workflows are discovered too (private)."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": _START,
            "payload": {
                "projectPath": self.project_path,
                "agentDir": self.agent_dir,
                "manager": self.manager,
                "path": self.path,
                "sourceDigest": self.source_digest,
                "reconcileId": self.reconcile_id,
                "resource": dict(self.resource),
                "deadlineMs": self.deadline_ms,
            },
        }

    @classmethod
    def from_wire(cls, frame: Mapping[str, Any]) -> PassStart:
        """Raises: ProtocolViolation: not a well-formed start frame."""
        payload = _payload(frame, _START)
        text = {k: payload.get(k) for k in ("manager", "path", "sourceDigest", "reconcileId")}
        for name, value in text.items():
            if not isinstance(value, str) or not value:
                raise _violation(f"{name} must be non-empty text", f"/payload/{name}")
        resource, deadline = payload.get("resource"), payload.get("deadlineMs")
        if not isinstance(resource, Mapping):
            raise _violation("resource must be an object", "/payload/resource")
        if isinstance(deadline, bool) or not isinstance(deadline, int) or deadline < 1:
            raise _violation("deadlineMs must be a positive integer", "/payload/deadlineMs")
        project, agent_dir = (
            _optional_text(payload, "projectPath"),
            _optional_text(payload, "agentDir"),
        )
        return cls(
            str(text["manager"]),
            str(text["path"]),
            str(text["sourceDigest"]),
            str(text["reconcileId"]),
            resource,
            deadline,
            project,
            agent_dir,
        )


@dataclass(frozen=True, slots=True)
class PassProposed:
    """Child → server: the pass's outcome (`ReconcileResult.to_wire()`), a proposal."""

    result: Mapping[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {"kind": _RESULT, "payload": {"result": dict(self.result)}}


@dataclass(frozen=True, slots=True)
class PassFailed:
    """Child → server: the pass ended without an outcome. `error_class` is the manager
    exception's type name or one of the runner's codes (`sourceChanged`, `loadFailed`,
    `badStart`); never a message, which could carry user data."""

    error_class: str

    def to_wire(self) -> dict[str, Any]:
        return {"kind": _FAILED, "payload": {"errorClass": self.error_class}}


@dataclass(frozen=True, slots=True)
class ChildRunRequested:
    """Child → server: `ctx.workflows.ensure(request_key=, workflow=, input=)`, with the
    input's fingerprint and the resolver's answer for the workflow (`resolve_request`,
    made in the child: the server never loads workflow code). The server uses
    `resolved` only when it queues the run."""

    request_key: str
    workflow: str
    input_fingerprint: str
    resolved: Mapping[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": _ENSURE_CHILD,
            "payload": {
                "requestKey": self.request_key,
                "workflow": self.workflow,
                "inputFingerprint": self.input_fingerprint,
                "resolved": dict(self.resolved),
            },
        }


@dataclass(frozen=True, slots=True)
class ChildRunAnswered:
    """Server → child: the child run (ID, stored status, output once completed, failure
    class), or a refusal (`errorCode`: `requestKeyConflict`, the resolver's code,
    `claimLost`)."""

    run_id: str | None
    state: str | None = None
    output: Any = None
    error_code: str | None = None
    error: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": _CHILD_RUN,
            "payload": {
                "runId": self.run_id,
                "state": self.state,
                "output": self.output,
                "errorCode": self.error_code,
                "error": self.error,
            },
        }


@dataclass(frozen=True, slots=True)
class EffectRequested:
    """Child → server: one step of `ctx.effects.ensure`. `reserve` records the effect
    (key, kind, request) before `apply`; `settle` records `outcome` (`applied` with
    `result`, or `rejected` with `error`; `observed` when `observe` proved it);
    `retry` says `observe` proved nothing applied."""

    op: str
    key: str
    kind: str = ""
    request: Any = None
    outcome: str | None = None
    result: Any = None
    error: str | None = None
    observed: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": _EFFECT,
            "payload": {
                "op": self.op,
                "key": self.key,
                "effectKind": self.kind,
                "request": self.request,
                "outcome": self.outcome,
                "result": self.result,
                "error": self.error,
                "observed": self.observed,
            },
        }


@dataclass(frozen=True, slots=True)
class EffectAnswered:
    """Server → child: `decision` (`apply`, `observe` or `adopt`) with the effect's
    state and stored result, or a refusal (`errorCode`: `requestMismatch`, ...)."""

    decision: str | None
    state: str | None = None
    result: Any = None
    error: str | None = None
    error_code: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": _EFFECT_STATE,
            "payload": {
                "decision": self.decision,
                "state": self.state,
                "result": self.result,
                "error": self.error,
                "errorCode": self.error_code,
            },
        }


ChildMessage = RunnerReadyForPass | PassProposed | PassFailed | ChildRunRequested | EffectRequested


def _text(payload: Mapping[str, Any], name: str, limit: int = _KEY_CHARS) -> str:
    value = payload.get(name)
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        raise _violation(f"{name} must be short non-empty text", f"/payload/{name}")
    return value


def _optional_text(payload: Mapping[str, Any], name: str) -> str | None:
    value = payload.get(name)
    if value is not None and not isinstance(value, str):
        raise _violation(f"{name} must be text or null", f"/payload/{name}")
    return value


def _child_run_requested(payload: Mapping[str, Any]) -> ChildRunRequested:
    resolved = payload.get("resolved")
    if not isinstance(resolved, Mapping):
        raise _violation("resolved must be an object", "/payload/resolved")
    return ChildRunRequested(
        _text(payload, "requestKey"),
        _text(payload, "workflow"),
        _text(payload, "inputFingerprint"),
        resolved,
    )


def _effect_requested(payload: Mapping[str, Any]) -> EffectRequested:
    op = payload.get("op")
    if op not in EFFECT_OPS:
        raise _violation("op must be reserve, settle or retry", "/payload/op")
    outcome = payload.get("outcome")
    if op == "settle" and outcome not in ("applied", "rejected"):
        raise _violation("a settle names applied or rejected", "/payload/outcome")
    kind = payload.get("effectKind")
    if op == "reserve" and (not isinstance(kind, str) or not kind):
        raise _violation("a reserve names the effect's kind", "/payload/effectKind")
    return EffectRequested(
        op=str(op),
        key=_text(payload, "key"),
        kind=kind if isinstance(kind, str) else "",
        request=payload.get("request"),
        outcome=outcome if isinstance(outcome, str) else None,
        result=payload.get("result"),
        error=_optional_text(payload, "error"),
        observed=payload.get("observed") is True,
    )


def _payload(frame: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    if frame.get("kind") != kind:
        raise _violation(f"expected {kind}", "/kind")
    payload = frame.get("payload")
    if not isinstance(payload, Mapping):
        raise _violation("payload must be an object", "/payload")
    return payload


def decode_child_frame(frame: Mapping[str, Any]) -> ChildMessage:
    """The server's decoder of a resource runner's frames (`ChildChannels(decode=...)`).

    Raises:
        ProtocolViolation: an unknown kind or a malformed payload.
    """
    kind = frame.get("kind")
    if kind == _READY:
        return RunnerReadyForPass()
    if kind == _RESULT:
        result = _payload(frame, _RESULT).get("result")
        if not isinstance(result, Mapping):
            raise _violation("result must be an object", "/payload/result")
        return PassProposed(result)
    if kind == _FAILED:
        error_class = _payload(frame, _FAILED).get("errorClass")
        if not isinstance(error_class, str) or not 0 < len(error_class) <= MAX_ERROR_CLASS_CHARS:
            raise _violation("errorClass must be short text", "/payload/errorClass")
        return PassFailed(error_class)
    if kind == _ENSURE_CHILD:
        return _child_run_requested(_payload(frame, _ENSURE_CHILD))
    if kind == _EFFECT:
        return _effect_requested(_payload(frame, _EFFECT))
    raise _violation("unknown kind", "/kind")


def decode_server_answer(frame: Mapping[str, Any]) -> ChildRunAnswered | EffectAnswered:
    """The child's decoder of the server's answers to its requests.

    Raises:
        ProtocolViolation: an unknown kind or a malformed payload.
    """
    kind = frame.get("kind")
    if kind == _CHILD_RUN:
        payload = _payload(frame, _CHILD_RUN)
        return ChildRunAnswered(
            run_id=_optional_text(payload, "runId"),
            state=_optional_text(payload, "state"),
            output=payload.get("output"),
            error_code=_optional_text(payload, "errorCode"),
            error=_optional_text(payload, "error"),
        )
    if kind == _EFFECT_STATE:
        payload = _payload(frame, _EFFECT_STATE)
        return EffectAnswered(
            decision=_optional_text(payload, "decision"),
            state=_optional_text(payload, "state"),
            result=payload.get("result"),
            error=_optional_text(payload, "error"),
            error_code=_optional_text(payload, "errorCode"),
        )
    raise _violation("unknown kind", "/kind")
