"""`resource-runner.v1`: the typed frames of a resource runner's private channel.

One pass per child: the child says `resourceRunner.ready`, the server sends one
`resourceRunner.start` (the manager file, its applied digest, the resource as the pass
reads it, the deadline), and the child answers with one `resourceRunner.result` (the
`ReconcileResult` wire form) or `resourceRunner.failed` (an error class only) and exits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pi_workflows.wire.protocol import ProtocolViolation

__all__ = [
    "MAX_ERROR_CLASS_CHARS",
    "RESOURCE_RUNNER_SCHEMA",
    "PassFailed",
    "PassProposed",
    "PassStart",
    "RunnerReadyForPass",
    "decode_child_frame",
]

RESOURCE_RUNNER_SCHEMA: Final = "resource-runner.v1"
MAX_ERROR_CLASS_CHARS: Final = 200
"""An error class is a name or code, never a message (storage bounds it the same)."""

_READY: Final = "resourceRunner.ready"
_START: Final = "resourceRunner.start"
_RESULT: Final = "resourceRunner.result"
_FAILED: Final = "resourceRunner.failed"


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

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": _START,
            "payload": {
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
        return cls(
            str(text["manager"]),
            str(text["path"]),
            str(text["sourceDigest"]),
            str(text["reconcileId"]),
            resource,
            deadline,
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


ChildMessage = RunnerReadyForPass | PassProposed | PassFailed


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
    raise _violation("unknown kind", "/kind")
