"""The resource-manager authoring API: definitions, conditions, outcomes and the pass context.

Implements the reference's resource model for manager code: `define_resource_manager`,
`condition_*`, and `ReconcileContext`, whose `settled` / `requeue` / `requeue_after` build
the one outcome of a pass, each condition stamped with the generation the pass read.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeAlias

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from pi_workflows.engine._errors import ReconcileResultError, ResourceManagerDefinitionError
from pi_workflows.engine._resource_manager_services import (
    EffectsService,
    ManagerEffectHost,
    WorkflowsHost,
    WorkflowsService,
)
from pi_workflows.wire.canonical import CanonicalJSONError, dumps, loads
from pi_workflows.wire.schema_check import SchemaCheck, check_schema_json, known_valid_schema

__all__ = [
    "CONDITION_REASON_PATTERN",
    "CONDITION_TYPE_PATTERN",
    "FINALIZER_PATTERN",
    "MANAGER_NAME_PATTERN",
    "MAX_CONDITIONS",
    "MAX_CONDITION_MESSAGE_CHARS",
    "MAX_FINALIZERS",
    "MAX_REQUEUE_AFTER_SECONDS",
    "MAX_SPEC_BYTES",
    "MAX_STATUS_BYTES",
    "Condition",
    "ConditionStatus",
    "Outcome",
    "ReconcileContext",
    "ReconcileResult",
    "Resource",
    "ResourceManagerDefinition",
    "condition_false",
    "condition_true",
    "condition_unknown",
    "define_resource_manager",
    "finish_pass",
]

MANAGER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
"""Manager names: a letter or digit, then letters, digits, `_` and `-` (at most 128).

The name is also the file stem (`NAME.resource_manager.py`), so it is both a workflow
name and a command name: no `.` (it would be part of the suffix).
"""

CONDITION_TYPE_PATTERN = r"^[A-Za-z][A-Za-z0-9._-]{0,63}$"
"""Condition types, for example `Ready`, `Reviewed`, `checks.green`."""

CONDITION_REASON_PATTERN = r"^[A-Za-z][A-Za-z0-9._-]{0,127}$"
"""Condition reasons: a short machine-readable word, for example `ChecksPending`."""

FINALIZER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$"
"""Finalizer names, for example `worktree` or `example.org/remote-session`."""

MAX_SPEC_BYTES = 1024 * 1024
"""A spec's canonical JSON is at most 1 MiB."""
MAX_STATUS_BYTES = 1024 * 1024
"""A status value's canonical JSON is at most 1 MiB."""
MAX_CONDITIONS = 32
"""Conditions one pass may report."""
MAX_CONDITION_MESSAGE_CHARS = 1000
"""Longest condition message."""
MAX_FINALIZERS = 16
"""Finalizers one resource may hold."""
MAX_REQUEUE_AFTER_SECONDS = 30 * 24 * 3600.0
"""The longest `requeue_after` (30 days); a longer wait is a settled resource plus an event."""

_NAME = re.compile(MANAGER_NAME_PATTERN)
_CONDITION_TYPE = re.compile(CONDITION_TYPE_PATTERN)
_CONDITION_REASON = re.compile(CONDITION_REASON_PATTERN)
_FINALIZER = re.compile(FINALIZER_PATTERN)

ConditionStatus: TypeAlias = Literal["True", "False", "Unknown"]
Outcome: TypeAlias = Literal["settled", "requeue", "requeueAfter"]


# ---------------------------------------------------------------------------
# The definition


@dataclass(frozen=True, slots=True, eq=False)
class ResourceManagerDefinition:
    """A frozen `define_resource_manager(...)` result; a manager file exports it as
    `resource_manager`."""

    name: str
    initial_status: Callable[[Any], Any]
    """`initial_status(spec)` → the status value of a new resource (plain JSON)."""
    reconcile: Callable[[ReconcileContext], ReconcileResult]
    """`reconcile(ctx)` → one bounded pass; returns `ctx.settled(...)`, `ctx.requeue()` or
    `ctx.requeue_after(seconds)`."""
    spec_schema: Mapping[str, Any] | bool | None
    """JSON Schema (Draft 2020-12) every spec must satisfy, or None."""
    spec_schema_json: bytes | None
    """Canonical JSON of `spec_schema`."""
    source_path: str | None = None
    """The file that called `define_resource_manager` (None when unknown)."""
    _validator: SchemaCheck | None = field(default=None, repr=False)
    """The check of `spec_schema` (`wire.schema_check`; None: no schema)."""

    @property
    def spec_validator(self) -> SchemaCheck | None:
        """The check of `spec_schema`, or None."""
        return self._validator


def define_resource_manager(
    *,
    name: str,
    initial_status: Callable[[Any], Any],
    reconcile: Callable[[ReconcileContext], ReconcileResult],
    spec_schema: Mapping[str, Any] | bool | None = None,
) -> ResourceManagerDefinition:
    """Define a resource manager; every rule is checked here.

    Args:
        name: the manager's name (MANAGER_NAME_PATTERN); it must equal the file's stem.
        initial_status: `initial_status(spec)` returns the status value of a newly applied
            resource (plain JSON, at most 1 MiB). It runs in the source resolver at
            `apply`, never in the server.
        reconcile: `reconcile(ctx)` makes one bounded pass over `ctx.resource` and returns
            `ctx.settled(...)`, `ctx.requeue()` or `ctx.requeue_after(seconds)`.
        spec_schema: JSON Schema (Draft 2020-12) of the spec, checked at every `apply`.

    Raises:
        ResourceManagerDefinitionError: naming the manager and the fix.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ResourceManagerDefinitionError(
            f"name {name!r} is not a valid resource manager name; use letters, digits, '_' "
            "and '-', starting with a letter or digit (at most 128 characters)"
        )
    what = f"resource manager {name!r}"
    for param, value in (("initial_status", initial_status), ("reconcile", reconcile)):
        if not callable(value):
            raise ResourceManagerDefinitionError(
                f"{what}: {param} must be a function, got {type(value).__name__}"
            )
    schema_json, validator = _spec_schema(spec_schema, what)
    caller = sys._getframe(1).f_globals.get("__file__")
    return ResourceManagerDefinition(
        name=name,
        initial_status=initial_status,
        reconcile=reconcile,
        spec_schema=loads(schema_json) if schema_json is not None else None,
        spec_schema_json=schema_json,
        source_path=caller if isinstance(caller, str) else None,
        _validator=validator,
    )


def _spec_schema(schema: object, what: str) -> tuple[bytes | None, SchemaCheck | None]:
    if schema is None:
        return None, None
    if not isinstance(schema, Mapping | bool):
        raise ResourceManagerDefinitionError(
            f"{what}: spec_schema must be a JSON Schema (a dict), got {type(schema).__name__}"
        )
    plain = dict(schema) if isinstance(schema, Mapping) else schema
    try:
        if not known_valid_schema(plain):  # the common schema skips jsonschema's walk
            Draft202012Validator.check_schema(plain)
    except SchemaError as exc:
        raise ResourceManagerDefinitionError(
            f"{what}: spec_schema is not a valid Draft 2020-12 JSON Schema: {exc.message}"
        ) from None
    try:
        schema_json = dumps(plain)
    except CanonicalJSONError as exc:
        raise ResourceManagerDefinitionError(
            f"{what}: spec_schema is not plain JSON: {exc}"
        ) from None
    return schema_json, check_schema_json(schema_json)


# ---------------------------------------------------------------------------
# Conditions


@dataclass(frozen=True, slots=True)
class Condition:
    """One observation about a resource: `Ready` is `True` because `ChecksPassed`.

    Build it with `condition_true/false/unknown`; `observed_generation` is filled in by
    the context (`ctx.settled`) with the generation the pass read, never by the author,
    so a pass on an older generation cannot report the newer spec ready. The server adds
    `lastTransitionTime` when it commits (the time `status` last changed for this type).
    """

    type: str
    status: ConditionStatus
    reason: str
    message: str | None = None
    observed_generation: int | None = None

    def to_wire(self) -> dict[str, Any]:
        """`{"type", "status", "reason", "message"?, "observedGeneration"?}`."""
        out: dict[str, Any] = {"type": self.type, "status": self.status, "reason": self.reason}
        if self.message is not None:
            out["message"] = self.message
        if self.observed_generation is not None:
            out["observedGeneration"] = self.observed_generation
        return out

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Condition:
        """Parse the JSON form (as stored; extra keys such as `lastTransitionTime` ignored).

        Raises:
            ReconcileResultError: a field breaks a rule.
        """
        status = data.get("status")
        if status not in ("True", "False", "Unknown"):
            raise ReconcileResultError("a condition's status must be 'True', 'False' or 'Unknown'")
        condition = _condition(data.get("type"), status, data.get("reason"), data.get("message"))
        generation = data.get("observedGeneration")
        if generation is not None and not _is_generation(generation):
            raise ReconcileResultError(
                "a condition's observedGeneration must be a positive integer"
            )
        return replace(condition, observed_generation=generation)


def _condition(
    type_: object, status: ConditionStatus, reason: object, message: object
) -> Condition:
    if not isinstance(type_, str) or not _CONDITION_TYPE.match(type_):
        raise ReconcileResultError(
            f"condition type {type_!r} is not valid; use a letter, then letters, digits, "
            "'.', '_' or '-' (at most 64 characters), e.g. 'Ready'"
        )
    if not isinstance(reason, str) or not _CONDITION_REASON.match(reason):
        raise ReconcileResultError(
            f"condition {type_!r}: reason must be a short word (a letter, then letters, "
            "digits, '.', '_' or '-'; at most 128 characters), e.g. 'ChecksPending'"
        )
    if message is not None and (
        not isinstance(message, str) or len(message) > MAX_CONDITION_MESSAGE_CHARS
    ):
        raise ReconcileResultError(
            f"condition {type_!r}: message must be text of at most "
            f"{MAX_CONDITION_MESSAGE_CHARS} characters, or None"
        )
    return Condition(type=type_, status=status, reason=reason, message=message)


def condition_true(type: str, reason: str, message: str | None = None) -> Condition:
    """A condition whose status is `"True"` (e.g. `condition_true("Ready", "Merged")`).

    Raises:
        ReconcileResultError: a malformed type, reason or message.
    """
    return _condition(type, "True", reason, message)


def condition_false(type: str, reason: str, message: str | None = None) -> Condition:
    """A condition whose status is `"False"` (e.g. `condition_false("Ready", "ChecksFailed")`)."""
    return _condition(type, "False", reason, message)


def condition_unknown(type: str, reason: str, message: str | None = None) -> Condition:
    """A condition whose status is `"Unknown"` (the manager cannot tell yet)."""
    return _condition(type, "Unknown", reason, message)


# ---------------------------------------------------------------------------
# The resource a pass reads


def _is_generation(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True, slots=True)
class Resource:
    """The resource as the pass read it (one resource version). Treat `spec` and
    `status` as read-only: a pass changes the resource only through its outcome."""

    manager: str
    key: str
    uid: str
    """Stable for the resource's life, never reused (a deleted and re-applied key gets a
    new one)."""
    generation: int
    """Raised by the server on every spec change; conditions are stamped with it."""
    resource_version: int
    """Changes on every write: the compare-and-swap token the server checks at commit."""
    spec: Any
    status: Any
    """The manager's own status value (its last settled `status`, or `initial_status`)."""
    conditions: tuple[Condition, ...] = ()
    """The conditions of the last settled pass."""
    deletion_requested: bool = False
    """Deletion was asked for: clean up, then `ctx.remove_finalizer(...)`."""
    finalizers: tuple[str, ...] = ()

    def condition(self, type_: str) -> Condition | None:
        """The stored condition of this type, or None."""
        return next((c for c in self.conditions if c.type == type_), None)

    def to_wire(self) -> dict[str, Any]:
        """The JSON form a resource runner receives for its pass."""
        return {
            "manager": self.manager,
            "key": self.key,
            "uid": self.uid,
            "generation": self.generation,
            "resourceVersion": self.resource_version,
            "spec": self.spec,
            "status": self.status,
            "conditions": [c.to_wire() for c in self.conditions],
            "deletionRequested": self.deletion_requested,
            "finalizers": list(self.finalizers),
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Resource:
        """Parse the JSON form (`to_wire`'s; stored conditions may carry more keys).

        Raises:
            ValueError: a missing or malformed field.
        """
        try:
            manager, key, uid = data["manager"], data["key"], data["uid"]
            generation, version = data["generation"], data["resourceVersion"]
            spec, status = data["spec"], data["status"]
            conditions = tuple(Condition.from_wire(c) for c in data["conditions"])
            deletion, finalizers = data["deletionRequested"], tuple(data["finalizers"])
        except (KeyError, TypeError, ReconcileResultError) as exc:
            raise ValueError(f"malformed resource: {exc}") from None
        if not all(isinstance(v, str) and v for v in (manager, key, uid)):
            raise ValueError("malformed resource: manager, key and uid must be non-empty text")
        if not _is_generation(generation) or not _is_generation(version):
            raise ValueError("malformed resource: generation and resourceVersion must be ≥ 1")
        if not isinstance(deletion, bool) or not all(isinstance(f, str) for f in finalizers):
            raise ValueError("malformed resource: deletionRequested or finalizers")
        return cls(
            manager=manager,
            key=key,
            uid=uid,
            generation=generation,
            resource_version=version,
            spec=spec,
            status=status,
            conditions=conditions,
            deletion_requested=deletion,
            finalizers=finalizers,
        )


# ---------------------------------------------------------------------------
# The outcome of a pass


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """The one outcome of a pass, as the resource runner proposes it to the server.

    The server commits it only under the pass's claim and if the resource version the
    pass read is still current; otherwise the key is reconciled again.
    """

    outcome: Outcome
    generation: int
    """The generation the pass read (every condition carries it)."""
    resource_version: int
    """The resource version the pass read (the compare-and-swap token)."""
    finalizers: tuple[str, ...] | None = None
    """The finalizer list after this pass's `add_finalizer` / `remove_finalizer`, or
    None when the pass left them as they were."""
    status: Any = None
    """`settled` only: the new status value (plain JSON, at most 1 MiB)."""
    conditions: tuple[Condition, ...] = ()
    """`settled` only: the conditions, each stamped with `generation`."""
    requeue_after_ms: int | None = None
    """`requeueAfter` only: milliseconds until the next pass (at least 1)."""

    def to_wire(self) -> dict[str, Any]:
        """The JSON form the resource runner sends (camelCase keys; absent fields left out)."""
        out: dict[str, Any] = {
            "outcome": self.outcome,
            "generation": self.generation,
            "resourceVersion": self.resource_version,
        }
        if self.finalizers is not None:
            out["finalizers"] = list(self.finalizers)
        if self.outcome == "settled":
            out["status"] = self.status
            out["conditions"] = [c.to_wire() for c in self.conditions]
        if self.requeue_after_ms is not None:
            out["requeueAfterMs"] = self.requeue_after_ms
        return out


# ---------------------------------------------------------------------------
# The context


class ReconcileContext:
    """What `reconcile(ctx)` receives: the resource read, the deadline, finalizers,
    the services, and the three outcomes (call exactly one, and return it)."""

    __slots__ = ("_deadline", "_finalizers", "_outcome", "_resource", "effects", "workflows")

    def __init__(
        self,
        resource: Resource,
        *,
        deadline: float,
        workflows: WorkflowsHost | None = None,
        effects: ManagerEffectHost | None = None,
    ) -> None:
        """Made by the resource runner (or a test).

        Args:
            resource: the resource as read for this pass.
            deadline: `time.monotonic()` value at which the pass is stopped.
            workflows, effects: the runner's hosts; None makes their `ensure` raise
                `ResourceRunnerRequiredError`.
        """
        self._resource = resource
        self._deadline = float(deadline)
        self._finalizers: list[str] = list(resource.finalizers)
        self._outcome: ReconcileResult | None = None
        self.workflows = WorkflowsService(workflows)
        """Child workflow runs (`ctx.workflows.ensure`)."""
        self.effects = EffectsService(effects)
        """Managed external effects (`ctx.effects.ensure`)."""

    @property
    def resource(self) -> Resource:
        """The resource as this pass read it."""
        return self._resource

    @property
    def deadline(self) -> float:
        """The `time.monotonic()` value at which the server stops this pass and requeues
        the key, whether or not the code looks at it."""
        return self._deadline

    def time_left(self) -> float:
        """Seconds until `deadline` (0 when it has passed): stop starting new work when low."""
        return max(0.0, self._deadline - time.monotonic())

    @property
    def finalizers(self) -> tuple[str, ...]:
        """The finalizers as this pass has left them so far."""
        return tuple(self._finalizers)

    def add_finalizer(self, name: str) -> None:
        """Hold the resource after deletion is requested until this pass's manager removes
        `name`. Add one only for something that needs cleanup (a worktree, a session).
        Adding one already held does nothing.

        Raises:
            ReconcileResultError: a malformed name, too many finalizers, deletion already
                requested, or the pass already has its outcome.
        """
        self._check_open("add_finalizer")
        _check_finalizer(name)
        if name in self._finalizers:
            return
        if self._resource.deletion_requested:
            raise ReconcileResultError(
                "add_finalizer: deletion of this resource was requested; no finalizer may be added"
            )
        if len(self._finalizers) >= MAX_FINALIZERS:
            raise ReconcileResultError(f"add_finalizer: a resource holds at most {MAX_FINALIZERS}")
        self._finalizers.append(name)

    def remove_finalizer(self, name: str) -> None:
        """Release `name` once its cleanup is done; removing one not held does nothing.
        When deletion was requested and no finalizer is left, the server deletes the
        resource as it commits the pass.

        Raises:
            ReconcileResultError: a malformed name, or the pass already has its outcome.
        """
        self._check_open("remove_finalizer")
        _check_finalizer(name)
        if name in self._finalizers:
            self._finalizers.remove(name)

    def settled(
        self, *, status: Any, conditions: list[Condition] | tuple[Condition, ...] = ()
    ) -> ReconcileResult:
        """Done until another event arrives: store `status` and `conditions`, drop the
        queue row. A problem that needs new input is a condition plus `settled`, not an
        endless retry.

        Every condition is stamped with the generation this pass read, whatever it says.

        Raises:
            ReconcileResultError: a second outcome, status not plain JSON or over 1 MiB,
                too many conditions, two of one type, or one not made by `condition_*`.
        """
        self._check_open("settled")
        try:
            data = dumps(status)
        except CanonicalJSONError as exc:
            raise ReconcileResultError(f"settled: status is not plain JSON: {exc}") from None
        if len(data) > MAX_STATUS_BYTES:
            raise ReconcileResultError(
                f"settled: status is {len(data)} bytes of JSON; at most {MAX_STATUS_BYTES}"
            )
        stamped = self._stamp(conditions)
        return self._finish(
            ReconcileResult(
                outcome="settled",
                generation=self._resource.generation,
                resource_version=self._resource.resource_version,
                finalizers=self._changed_finalizers(),
                status=loads(data),
                conditions=stamped,
            )
        )

    def requeue(self) -> ReconcileResult:
        """Another pass as soon as capacity allows (status and conditions unchanged).

        Raises:
            ReconcileResultError: a second outcome.
        """
        self._check_open("requeue")
        return self._finish(self._plain("requeue", None))

    def requeue_after(self, seconds: float) -> ReconcileResult:
        """Another pass after `seconds` (0 < seconds ≤ MAX_REQUEUE_AFTER_SECONDS), e.g. to
        poll an external system; status and conditions unchanged.

        Raises:
            ReconcileResultError: a second outcome, or `seconds` out of bounds.
        """
        self._check_open("requeue_after")
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
            or not 0 < seconds <= MAX_REQUEUE_AFTER_SECONDS
        ):
            raise ReconcileResultError(
                f"requeue_after: seconds must be a number in (0, {MAX_REQUEUE_AFTER_SECONDS:g}], "
                f"got {seconds!r}"
            )
        return self._finish(self._plain("requeueAfter", max(1, round(seconds * 1000))))

    def _plain(self, outcome: Outcome, after_ms: int | None) -> ReconcileResult:
        return ReconcileResult(
            outcome=outcome,
            generation=self._resource.generation,
            resource_version=self._resource.resource_version,
            finalizers=self._changed_finalizers(),
            requeue_after_ms=after_ms,
        )

    def _changed_finalizers(self) -> tuple[str, ...] | None:
        after = tuple(self._finalizers)
        return None if after == self._resource.finalizers else after

    def _stamp(self, conditions: object) -> tuple[Condition, ...]:
        if not isinstance(conditions, list | tuple):
            raise ReconcileResultError("settled: conditions must be a list of condition_*(...)")
        if len(conditions) > MAX_CONDITIONS:
            raise ReconcileResultError(f"settled: at most {MAX_CONDITIONS} conditions")
        seen: set[str] = set()
        stamped: list[Condition] = []
        for condition in conditions:
            if not isinstance(condition, Condition):
                raise ReconcileResultError(
                    "settled: each condition must come from condition_true/false/unknown, "
                    f"got {type(condition).__name__}"
                )
            if condition.type in seen:
                raise ReconcileResultError(f"settled: two conditions of type {condition.type!r}")
            seen.add(condition.type)
            stamped.append(replace(condition, observed_generation=self._resource.generation))
        return tuple(stamped)

    def _check_open(self, method: str) -> None:
        if self._outcome is not None:
            raise ReconcileResultError(
                f"{method}: this pass already has its outcome; a pass makes exactly one of "
                "ctx.settled(...), ctx.requeue() or ctx.requeue_after(...)"
            )

    def _finish(self, result: ReconcileResult) -> ReconcileResult:
        self._outcome = result
        return result


def _check_finalizer(name: object) -> None:
    if not isinstance(name, str) or not _FINALIZER.match(name):
        raise ReconcileResultError(
            f"finalizer {name!r} is not valid; use a letter or digit, then letters, digits "
            "or '._/-' (at most 128 characters)"
        )


def finish_pass(ctx: ReconcileContext, returned: object) -> ReconcileResult:
    """What the resource runner does with `reconcile(ctx)`'s return value: accept only
    the outcome this context made (the one outcome of the pass).

    Raises:
        ReconcileResultError: the pass returned something else (None, another context's
            outcome, a plain value) or made no outcome.
    """
    outcome = ctx._outcome
    if outcome is None:
        raise ReconcileResultError(
            "reconcile must return ctx.settled(...), ctx.requeue() or ctx.requeue_after(...), "
            f"got {type(returned).__name__}"
        )
    if returned is not outcome:
        raise ReconcileResultError(
            "reconcile must return the outcome it made (return ctx.settled(...) etc.), "
            f"got {type(returned).__name__}"
        )
    return outcome
