"""Routing: which node runs after a node finished with an outcome and an output.

Implements workflow-model.md § 5.1–5.2 and python-port.md decision 7: one outgoing edge
per node, `switch` on `$.path` (the output) or `$result.outcome`, values stringified the
way JavaScript's `String(value)` does, an unmatched switch without `default` an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol

from pi_workflows.engine._definition import Edge, js_string
from pi_workflows.engine._errors import RoutingError

__all__ = ["COMPLETED", "OUTCOMES", "next_node"]

COMPLETED: Final = "completed"
"""The outcome of a node attempt that finished normally."""

OUTCOMES: Final = ("completed", "failed", "timed_out", "cancelled")
"""Node attempt outcomes (`node_attempts.status` of a finished attempt)."""

_MISSING = object()


class _Routable(Protocol):
    @property
    def outgoing(self) -> Mapping[str, Edge]: ...


def next_node(definition: _Routable, node_id: str, output: Any, result_outcome: str) -> str | None:
    """Return the node to run after `node_id`, or `None` when the run ends here.

    Args:
        definition: a `WorkflowDefinition` (authored ids) or a `CompiledWorkflow`
            (compiled paths; what runners use).
        node_id: the node that finished.
        output: its output (ignored unless the outcome is `completed`).
        result_outcome: `completed`, `failed`, `timed_out` or `cancelled`.

    Returns:
        The next node. `None` means: after `completed`, the run completes; after any
        other outcome, the run ends with that outcome (only a `$result.outcome` switch
        routes a failure or timeout; `cancelled` is never routed).

    Raises:
        RoutingError: a switch has no case for the value and no `default`, or a `$.`
            path reaches a list or object instead of a scalar.
    """
    if result_outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {result_outcome!r}; expected one of {OUTCOMES}")
    edge = definition.outgoing.get(node_id)
    if edge is None or result_outcome == "cancelled":
        return None
    switch = edge.switch
    if switch is None:
        return edge.target if result_outcome == COMPLETED else None
    if switch.selector == "result":
        key: str | None = result_outcome
    elif result_outcome != COMPLETED:
        return None
    else:
        value = _walk(output, switch.path)
        if value is _MISSING:
            key = None
        else:
            key = js_string(value)
            if key is None:
                raise RoutingError(
                    node_id,
                    f"switch on {switch.on!r} found a {type(value).__name__}, not a string, "
                    "number, bool or null",
                )
    if key is not None and key in switch.cases:
        return switch.cases[key]
    if switch.default is not None:
        return switch.default
    shown = "nothing (the field is missing)" if key is None else repr(key)
    raise RoutingError(
        node_id,
        f"switch on {switch.on!r} found {shown}, which matches none of the cases "
        f"{sorted(switch.cases)} and there is no default",
    )


def _walk(value: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if isinstance(value, Mapping):
            if part not in value:
                return _MISSING
            value = value[part]
        elif isinstance(value, list) and part.isdigit():
            index = int(part)
            if index >= len(value):
                return _MISSING
            value = value[index]
        else:
            return _MISSING
    return value
