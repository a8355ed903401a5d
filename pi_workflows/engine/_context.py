"""The context every workflow callback receives, and the engine's own implementation.

Implements workflow-model.md § 1.2 and workflow-server.md § Effects and retry safety:
callbacks read `ctx.input`, `ctx.outputs`, `ctx.results`; actions call `ctx.effect(...)`,
which derives the idempotency key (python-port.md decision 6) and hands the call to a host.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Protocol, runtime_checkable

from pi_workflows.engine._errors import EffectKeyConflictError
from pi_workflows.engine._keys import effect_idempotency_key
from pi_workflows.wire.canonical import CanonicalJSONError, sha256_digest

__all__ = [
    "EFFECT_TYPE_PATTERN",
    "NOT_APPLIED",
    "ActionContext",
    "EffectCall",
    "EffectHost",
    "EngineContext",
    "NodeContext",
    "TitleContext",
]

EFFECT_TYPE_PATTERN = r"^[a-z][a-z0-9._-]{0,63}$"
"""Effect types: lowercase, e.g. `payment.charge`; at most 64 characters."""

_EFFECT_TYPE = re.compile(EFFECT_TYPE_PATTERN)


class _NotApplied:
    """The type of NOT_APPLIED (a singleton)."""

    _instance: _NotApplied | None = None

    def __new__(cls) -> _NotApplied:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOT_APPLIED"


NOT_APPLIED: Final = _NotApplied()
"""What `read_back(key, request)` returns when it proves the effect did not apply.

`read_back` returns the effect's result when it proves the effect applied, NOT_APPLIED
when it proves it did not (so `apply` may run), and raises when it cannot tell (the
effect stays `ambiguous` and is never retried automatically).
"""


@runtime_checkable
class NodeContext(Protocol):
    """What every node callback receives (compute, shell argv, checkpoint summary, notify)."""

    @property
    def input(self) -> Any:
        """The run input (inside an include: the child's mapped, validated input)."""

    @property
    def outputs(self) -> Mapping[str, Any]:
        """Node id → output of its latest completed attempt (local names inside an include)."""

    @property
    def results(self) -> Mapping[str, Any]:
        """Node id → result record of its latest attempt (`outcome`, `output`, `error`, …)."""

    @property
    def run_id(self) -> str:
        """The run's ID."""

    @property
    def node_path(self) -> str:
        """The compiled path of the running node (`mount/child/node`)."""

    @property
    def visit(self) -> int:
        """1 + finished attempts of this node in the run (a crash rerun keeps its visit)."""


@runtime_checkable
class ActionContext(NodeContext, Protocol):
    """What an action callback receives: the node context plus managed effects."""

    def effect(
        self,
        effect_type: str,
        request: Any,
        *,
        apply: Callable[[str, Any], Any],
        read_back: Callable[[str, Any], Any] | None = None,
        idempotent: bool = False,
    ) -> Any:
        """Run one managed effect and return its result.

        **Idempotency:** `apply(key, request)` runs at most once per key; the key is derived
        from (run, effect type, node path, visit), so a crash rerun reuses it and a loop
        revisit gets a new one. A stored receipt is returned without calling `apply`.
        Pass the key to the external system when it accepts one.

        **Interrupted applies:** when a crash, pause or stop interrupts `apply`, the next
        runner cannot know whether it happened. `idempotent=True` declares that the
        external system deduplicates by the key, so `apply` is called again with the
        same key (a new effect attempt). Otherwise `read_back(key, request)` proves the
        outcome (its result, or NOT_APPLIED), and without it the effect becomes
        `ambiguous` and the run parks for the operator (`pi-workflows run recover`).
        Give `idempotent` or `read_back`, not both.
        """


@dataclass(frozen=True, slots=True)
class EffectCall:
    """One managed effect, as the engine hands it to the runner's effect host."""

    key: str
    """The engine-derived idempotency key (`sha256:…`)."""
    effect_type: str
    request: Any
    """The JSON request; its canonical fingerprint blocks reuse of the key with another payload."""
    request_fingerprint: str
    apply: Callable[[str, Any], Any]
    read_back: Callable[[str, Any], Any] | None
    run_id: str
    node_path: str
    visit: int
    idempotent: bool = False
    """The external system deduplicates by `key`: an interrupted apply runs again."""


class EffectHost(Protocol):
    """Implemented by the runner: reserve with the server, apply, settle.

    Contract of `run_effect(call)`:

    1. reserve `call.key` with `call.request_fingerprint` (a terminal receipt for the key
       is returned as is: `applied` → its result; `rejected`/`cancelled` → raise);
    2. an earlier `applying` reservation: `call.idempotent` → the server opens a new
       attempt and the host applies again with the same key; otherwise call `read_back`
       if given (result → settle applied; NOT_APPLIED → apply now; raise → ambiguous,
       raise); without `read_back` → ambiguous, raise;
    3. otherwise mark applying, call `call.apply(call.key, call.request)`, settle with the
       result (must be JSON) or the error, and return the result or raise.
    """

    def run_effect(self, call: EffectCall) -> Any:
        """Run `call` under the rules above and return its result."""


class EngineContext:
    """The engine's context: read-only views of the state a runner rebuilt for one attempt.

    Build one per node attempt. Actions need `effects`; other nodes may leave it `None`.
    `outputs` and `results` should already be projected to the node's include scope.
    """

    __slots__ = (
        "_effect_types",
        "_effects",
        "_input",
        "_node_path",
        "_outputs",
        "_results",
        "_run_id",
        "_visit",
    )

    def __init__(
        self,
        *,
        input: Any,
        outputs: Mapping[str, Any] | None = None,
        results: Mapping[str, Any] | None = None,
        run_id: str = "",
        node_path: str = "",
        visit: int = 1,
        effects: EffectHost | None = None,
    ) -> None:
        self._input = input
        self._outputs = MappingProxyType(dict(outputs or {}))
        self._results = MappingProxyType(dict(results or {}))
        self._run_id = run_id
        self._node_path = node_path
        self._visit = visit
        self._effects = effects
        self._effect_types: set[str] = set()

    @property
    def input(self) -> Any:
        """The run input (inside an include: the child's input)."""
        return self._input

    @property
    def outputs(self) -> Mapping[str, Any]:
        """Node id → output of its latest completed attempt."""
        return self._outputs

    @property
    def results(self) -> Mapping[str, Any]:
        """Node id → result record of its latest attempt."""
        return self._results

    @property
    def run_id(self) -> str:
        """The run's ID."""
        return self._run_id

    @property
    def node_path(self) -> str:
        """The compiled path of the running node."""
        return self._node_path

    @property
    def visit(self) -> int:
        """1 + finished attempts of this node in the run."""
        return self._visit

    def effect(
        self,
        effect_type: str,
        request: Any,
        *,
        apply: Callable[[str, Any], Any],
        read_back: Callable[[str, Any], Any] | None = None,
        idempotent: bool = False,
    ) -> Any:
        """Run one managed effect through the host; see `ActionContext.effect`.

        Raises:
            ValueError: a bad effect type, a request that is not JSON, both `idempotent`
                and `read_back`, or no effect host (effects are for action nodes).
            TypeError: `idempotent` is not a bool.
            EffectKeyConflictError: a second effect of the same type in this visit.
        """
        if not isinstance(effect_type, str) or not _EFFECT_TYPE.match(effect_type):
            raise ValueError(
                f"effect type {effect_type!r} must match {EFFECT_TYPE_PATTERN} "
                "(e.g. 'payment.charge')"
            )
        if not callable(apply) or (read_back is not None and not callable(read_back)):
            raise ValueError("ctx.effect: apply and read_back must be functions (key, request)")
        if not isinstance(idempotent, bool):
            raise TypeError(f"ctx.effect: idempotent must be True or False, not {idempotent!r}")
        if idempotent and read_back is not None:
            raise ValueError(
                f"effect {effect_type!r}: give idempotent=True (an interrupted apply runs again "
                "with the same key) or read_back (prove the outcome), not both"
            )
        try:
            fingerprint = sha256_digest(request)
        except CanonicalJSONError as exc:
            raise ValueError(
                f"effect {effect_type!r}: the request is not plain JSON: {exc}"
            ) from None
        if self._effects is None:
            raise ValueError(
                f"node {self._node_path!r} cannot run effect {effect_type!r}: managed effects "
                "are available to action nodes only"
            )
        if effect_type in self._effect_types:
            raise EffectKeyConflictError(
                f"node {self._node_path!r} already ran an effect of type {effect_type!r} in this "
                "visit; give each effect of one node its own effect type"
            )
        self._effect_types.add(effect_type)
        call = EffectCall(
            key=effect_idempotency_key(self._run_id, effect_type, self._node_path, self._visit),
            effect_type=effect_type,
            request=request,
            request_fingerprint=fingerprint,
            apply=apply,
            read_back=read_back,
            run_id=self._run_id,
            node_path=self._node_path,
            visit=self._visit,
            idempotent=idempotent,
        )
        return self._effects.run_effect(call)


@dataclass(frozen=True, slots=True)
class TitleContext:
    """What a `title(ctx)` callback receives in the source resolver."""

    input: Any
    workflow_name: str
