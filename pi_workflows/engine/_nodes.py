"""Node kinds, runner side: what each kind of node does when its attempt runs.

Implements workflow-model.md's node kinds for the runner: compute and action call the
workflow's function, shell runs a managed command, notify asks for a notification,
checkpoint and human_decision produce what a person answers, agent drives a Pi step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pi_workflows.engine._agent_step import run_agent_step
from pi_workflows.engine._channel import NodePlace
from pi_workflows.engine._compile import CompiledNode
from pi_workflows.engine._context import EngineContext
from pi_workflows.engine._definition import (
    ActionNode,
    AgentNode,
    CheckpointNode,
    ComputeNode,
    HumanDecisionNode,
    NotifyNode,
    ShellNode,
)
from pi_workflows.engine._shell import SHELL_EFFECT_TYPE, run_shell
from pi_workflows.wire.decisions import MAX_SUMMARY_CHARS, label_problem
from pi_workflows.wire.runner import NotificationRequested

__all__ = ["run_node_kind"]


def run_node_kind(place: NodePlace, node: CompiledNode, ctx: EngineContext) -> Any:
    """Run the node's own work and return its output (JSON).

    Raises:
        TypeError: the node has no kind this runner knows.
        Exception: whatever the node's work raised (the node fails).
    """
    spec = node.node
    handler = _HANDLERS.get(type(spec))
    if handler is None:
        raise TypeError(f"node kind {node.kind} cannot run")
    return handler(place, node, spec, ctx)


def _function(place: NodePlace, node: CompiledNode, spec: Any, ctx: EngineContext) -> Any:
    """compute and action: the workflow's function (an action's effects go through
    `ctx.effect`, the node's `RunnerEffects`)."""
    return spec.fn(ctx)


def _shell(place: NodePlace, node: CompiledNode, spec: ShellNode, ctx: EngineContext) -> Any:
    """A managed effect whose apply runs the command (`run_shell`)."""
    argv = [str(part) for part in spec.argv_fn(ctx)]
    timeout_ms, cap = spec.timeout_ms, spec.max_output_bytes
    return ctx.effect(
        SHELL_EFFECT_TYPE,
        {"argv": argv},
        apply=lambda key, request: run_shell(
            request["argv"],
            timeout_ms,
            cap,
            place.channel,
            effect_key=key,
            run_id=place.run_id,
        ),
        read_back=spec.read_back,
        idempotent=spec.idempotent,
    )


def _notify(place: NodePlace, node: CompiledNode, spec: NotifyNode, ctx: EngineContext) -> Any:
    text = str(spec.message_fn(ctx) if callable(spec.message_fn) else spec.message_fn)
    place.channel.send(
        NotificationRequested(
            notification_id=f"{place.run_id}:{node.path}:{ctx.visit}",
            content={"text": text, "kind": spec.notify_kind},
        )
    )
    return {"text": text}


def _checkpoint(
    place: NodePlace, node: CompiledNode, spec: CheckpointNode, ctx: EngineContext
) -> Any:
    summary = spec.summary(ctx) if callable(spec.summary) else spec.summary
    return {"summary": summary}


def _decision(
    place: NodePlace, node: CompiledNode, spec: HumanDecisionNode, ctx: EngineContext
) -> Any:
    """The summary a person decides on; a bad one fails the node (before any decision)."""
    text = spec.summary(ctx) if callable(spec.summary) else spec.summary
    problem = (
        label_problem(text, limit=MAX_SUMMARY_CHARS, multiline=True)
        if isinstance(text, str)
        else "is no text"
    )
    if problem is not None:
        raise ValueError(f"the human_decision summary {problem}")
    return {"summary": text}


_HANDLERS: dict[type, Callable[[NodePlace, CompiledNode, Any, EngineContext], Any]] = {
    ComputeNode: _function,
    ActionNode: _function,
    ShellNode: _shell,
    NotifyNode: _notify,
    CheckpointNode: _checkpoint,
    HumanDecisionNode: _decision,
    AgentNode: run_agent_step,
}
"""One handler per node kind (by definition type)."""
