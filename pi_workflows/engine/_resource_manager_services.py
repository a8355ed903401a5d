"""The services a reconcile pass uses: `ctx.workflows` (child runs) and `ctx.effects`.

The author-facing objects check each call and hand a checked record to a host; the
resource runner implements the hosts (`WorkflowsHost`, `ManagerEffectHost`) over its
private channel. Without a host, `ensure` raises `ResourceRunnerRequiredError`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pi_workflows.engine._context import EFFECT_TYPE_PATTERN
from pi_workflows.engine._errors import ReconcileResultError, ResourceRunnerRequiredError
from pi_workflows.wire.canonical import CanonicalJSONError, sha256_digest

__all__ = [
    "REQUEST_KEY_PATTERN",
    "ChildRun",
    "ChildRunCall",
    "EffectsService",
    "ManagedEffect",
    "ManagedEffectCall",
    "ManagerEffectHost",
    "WorkflowsHost",
    "WorkflowsService",
]

REQUEST_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$"
"""Child-run request keys and manager effect keys (stable across passes, e.g.
`review/gen-3/abc123`): letters, digits and `._:/-`, at most 200 characters."""

_REQUEST_KEY = re.compile(REQUEST_KEY_PATTERN)
_EFFECT_KIND = re.compile(EFFECT_TYPE_PATTERN)


@dataclass(frozen=True, slots=True)
class ChildRunCall:
    """One checked `ctx.workflows.ensure(...)`, as handed to the runner's host."""

    request_key: str
    workflow: str
    input: Any
    input_fingerprint: str
    """`sha256_digest(input)`: the same key with another fingerprint is an error."""


@dataclass(frozen=True, slots=True)
class ChildRun:
    """A child run's state as `ctx.workflows.ensure` returns it."""

    request_key: str
    run_id: str
    state: str
    """The run's state: `queued`, `starting`, `running`, `parked`, `done`, `failed` or
    `cancelled` (the run list's states)."""
    output: Any = None
    """The run's result when `state == "done"`, else None."""
    error: str | None = None
    """A bounded safe reason when `state` is `failed` or `parked`."""

    @property
    def finished(self) -> bool:
        """True when the run will not change again (`done`, `failed`, `cancelled`)."""
        return self.state in ("done", "failed", "cancelled")


class WorkflowsHost(Protocol):
    """Implemented by the resource runner over its private channel."""

    def ensure_child(self, call: ChildRunCall) -> ChildRun:
        """Find the child run of `call.request_key` for this resource, or reserve a new run
        ID for it in the manager's own transaction (before the scheduler may start it),
        and return its state.

        Raises:
            RequestKeyConflictError: the key is already used with another workflow or input.
        """
        ...


class WorkflowsService:
    """`ctx.workflows`: child workflow runs that a manager starts and observes."""

    __slots__ = ("_host",)

    def __init__(self, host: WorkflowsHost | None) -> None:
        self._host = host

    def ensure(self, *, request_key: str, workflow: str, input: Any) -> ChildRun:
        """Create or find one child run by a stable request key, and return its state.

        **Idempotency:** repeated passes with the same `request_key` find the same run;
        its run ID is reserved and saved before the scheduler starts it, so a crash right
        after finds it too. Never two children for one key. A changed `input` (another
        fingerprint) or workflow under the same key raises `RequestKeyConflictError`:
        put what changes into the key (`f"review/{ctx.resource.generation}/{head}"`).

        **Execution:** the child goes through the normal run queue and runners, headless;
        a child that needs an origin session parks with an unsupported-input reason. Its
        completion enqueues this resource again (a wake-up, not a transition): read the
        returned state, do not wait for it.

        Raises:
            ReconcileResultError: a malformed key, workflow name, or input not plain JSON.
            RequestKeyConflictError: the key was used with another input.
            ResourceRunnerRequiredError: the context is not served by a resource runner.
        """
        if not isinstance(request_key, str) or not _REQUEST_KEY.match(request_key):
            raise ReconcileResultError(
                "ctx.workflows.ensure: request_key must be 1-200 letters, digits or '._:/-', "
                "starting with a letter or digit"
            )
        if not isinstance(workflow, str) or not workflow:
            raise ReconcileResultError("ctx.workflows.ensure: workflow must be a workflow's name")
        try:
            fingerprint = sha256_digest(input)
        except CanonicalJSONError as exc:
            raise ReconcileResultError(
                f"ctx.workflows.ensure: input is not plain JSON: {exc}"
            ) from None
        if self._host is None:
            raise ResourceRunnerRequiredError(
                "ctx.workflows.ensure works only in a pass run by the workflow server's "
                "resource runner; in a test, pass a workflows host to ReconcileContext"
            )
        return self._host.ensure_child(
            ChildRunCall(
                request_key=request_key,
                workflow=workflow,
                input=input,
                input_fingerprint=fingerprint,
            )
        )


@dataclass(frozen=True, slots=True)
class ManagedEffectCall:
    """One checked `ctx.effects.ensure(...)`, as handed to the runner's host."""

    key: str
    kind: str
    request: Any
    request_fingerprint: str
    """`sha256_digest(request)`: the same key with another fingerprint is an error."""
    observe: Callable[[str, Any], Any]
    apply: Callable[[str, Any], Any]


@dataclass(frozen=True, slots=True)
class ManagedEffect:
    """A manager effect's settled state, as `ctx.effects.ensure` returns it."""

    key: str
    kind: str
    state: Literal["applied", "rejected"]
    """`applied` (result below) or `rejected` (the external system refused for certain)."""
    result: Any = None
    """What `apply` (or `observe`) returned when applied."""
    error: str | None = None
    """The rejection's message when rejected."""


class ManagerEffectHost(Protocol):
    """Implemented by the resource runner over its private channel."""

    def ensure_effect(self, call: ManagedEffectCall) -> ManagedEffect:
        """Reserve, observe or apply, and settle one manager effect (see
        `EffectsService.ensure` for the states and rules).

        Raises:
            RequestKeyConflictError: the key is already used with another request.
            ResourceManagerError: the effect is indeterminate (observe could not tell).
        """
        ...


class EffectsService:
    """`ctx.effects`: external side effects recorded before they are applied."""

    __slots__ = ("_host",)

    def __init__(self, host: ManagerEffectHost | None) -> None:
        self._host = host

    def ensure(
        self,
        *,
        key: str,
        kind: str,
        request: Any,
        observe: Callable[[str, Any], Any],
        apply: Callable[[str, Any], Any],
    ) -> ManagedEffect:
        """Apply one external effect at most once per `key` (as far as `observe` can tell).

        **Recorded first:** the effect is saved as `pending` (key, kind, request
        fingerprint) before `apply(key, request)` runs. `apply` returning settles it
        `applied` with its result; raising `EffectRejectedError` settles it `rejected`
        (certainly not applied); any other raise, a crash or a deadline leaves it
        `indeterminate`.

        **Observe before retry:** on a later pass a `pending` or `indeterminate` effect is
        first **observed**: `observe(key, request)` returns the result if the effect
        applied, `NOT_APPLIED` if it certainly did not (then `apply` runs), and raises if
        it cannot tell (the effect stays indeterminate and the pass fails with backoff).
        An effect already `applied` or `rejected` returns its stored state without
        calling either function. Nothing is re-applied blindly after a crash; there is
        no generic exactly-once promise beyond what `observe` proves.

        **Keys:** `key` (REQUEST_KEY_PATTERN) is scoped to the resource; reusing it with
        another `request` (another fingerprint) raises `RequestKeyConflictError`.

        Raises:
            ReconcileResultError: a malformed key or kind, a request not plain JSON, or
                `observe` / `apply` not callable.
            RequestKeyConflictError: the key was used with another request.
            ResourceRunnerRequiredError: the context is not served by a resource runner.
        """
        if not isinstance(key, str) or not _REQUEST_KEY.match(key):
            raise ReconcileResultError(
                "ctx.effects.ensure: key must be 1-200 letters, digits or '._:/-', starting "
                "with a letter or digit"
            )
        if not isinstance(kind, str) or not _EFFECT_KIND.match(kind):
            raise ReconcileResultError(
                f"ctx.effects.ensure: kind {kind!r} must be lowercase like 'github.merge' "
                "(at most 64 characters)"
            )
        if not callable(observe) or not callable(apply):
            raise ReconcileResultError("ctx.effects.ensure: observe and apply must be functions")
        try:
            fingerprint = sha256_digest(request)
        except CanonicalJSONError as exc:
            raise ReconcileResultError(
                f"ctx.effects.ensure: request is not plain JSON: {exc}"
            ) from None
        if self._host is None:
            raise ResourceRunnerRequiredError(
                "ctx.effects.ensure works only in a pass run by the workflow server's "
                "resource runner; in a test, pass an effects host to ReconcileContext"
            )
        return self._host.ensure_effect(
            ManagedEffectCall(
                key=key,
                kind=kind,
                request=request,
                request_fingerprint=fingerprint,
                observe=observe,
                apply=apply,
            )
        )
