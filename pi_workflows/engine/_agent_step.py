"""Agent steps, runner side: the request, the step contract, and the turns of one pi child.

Implements workflow-server.md § Headless and § Interactive Pi execution: a headless step
drives one `pi --mode rpc` child (`_pi_child.py`) until the server holds an accepted
submission; an interactive one hands its prompt to the run's origin Pi session."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Final

from pi_workflows._paths import ensure_private_dir
from pi_workflows.engine._channel import NodePlace, RunnerStopped
from pi_workflows.engine._compile import CompiledNode
from pi_workflows.engine._context import EngineContext
from pi_workflows.engine._definition import AgentNode
from pi_workflows.engine._failures import AgentUnproductive
from pi_workflows.engine._pi_child import PiChild, PiLaunch, PiOptions, TurnOutcome
from pi_workflows.engine._shell import register_process, unregister_process
from pi_workflows.engine._values import MAX_ERROR_TEXT
from pi_workflows.supervision import stop_descendants
from pi_workflows.wire.canonical import dumps, sha256_digest
from pi_workflows.wire.client import socket_path_for
from pi_workflows.wire.runner import (
    UNSET,
    InteractionAnswer,
    InteractionRequested,
    TurnEnded,
    TurnVerdict,
)

__all__ = [
    "MAX_REMINDERS",
    "bridge_accepted",
    "reminder_prompt",
    "run_agent_step",
    "step_prompt",
    "turn_ended",
    "visible_step_prompt",
]

MAX_REMINDERS: Final = 2
"""Unproductive turns 1 and 2 get a reminder through the same pi child; the third fails
(the server counts them: `record_unproductive_turn`)."""
AGENT_DEADLINE_GRACE_S: Final = 15.0
"""How long after the node's deadline the runner gives up waiting for pi on its own
(the server's deadline stop comes first: a tick, plus the runner's SIGTERM grace)."""
VALIDATING_POLL_S: Final = 0.25
"""How often a new attempt asks again while its interrupted attempt's output validates."""
PI_READY_TIMEOUT_S: Final = 60.0
"""How long a fresh pi child gets to load the bridge and answer `get_state`."""
TURN_ERROR_CHARS: Final = 2048
"""The bound of a provider error sent for the run view (the server's bound too)."""
ACCEPTED_OUTCOMES: Final = frozenset({"accepted", "adopted"})
STOP_REASONS: Final = frozenset({"stop", "toolUse", "length", "error", "aborted"})
_CONTRACT_SEPARATOR: Final = "\n\n---\n"
RESUMED_NOTE: Final = (
    "This workflow step is being presented again (reason: resumed): its runner restarted, "
    "and nothing of an earlier attempt's work on it was kept. Start it afresh."
)


def bridge_accepted(outcome: TurnOutcome) -> bool:
    """Whether the turn's `workflow` tool reported a submission the server accepted.

    The bridge waits for the server's durable outcome and ends the turn on acceptance
    (`terminate: true`, `details.outcome` accepted or adopted). This only tells the runner
    to read the accepted value back: the server's stored value is the node's output.
    """
    for call in outcome.workflow_calls():
        args, result = call.args, call.result
        if not (isinstance(args, dict) and args.get("action") == "submit") or call.is_error:
            continue
        details = result.get("details") if isinstance(result, dict) else None
        if isinstance(details, dict) and details.get("outcome") in ACCEPTED_OUTCOMES:
            return True
    return False


def turn_ended(request_id: str, outcome: TurnOutcome) -> TurnEnded:
    """The `interaction.turnEnded` progress report of a turn with no accepted submission."""
    reason: Any = outcome.stop_reason if outcome.stop_reason in STOP_REASONS else "unknown"
    error: Any = UNSET
    if outcome.provider_error:
        error = (outcome.error_message or "the model provider failed")[:TURN_ERROR_CHARS]
    return TurnEnded(interaction_id=request_id, stop_reason=reason, error=error)


def _last_rejection(outcome: TurnOutcome) -> str | None:
    """Why the turn's last submit was refused, for the model's reminder only."""
    for call in reversed(outcome.workflow_calls()):
        if isinstance(call.args, dict) and call.args.get("action") == "submit" and call.is_error:
            content = call.result.get("content") if isinstance(call.result, dict) else None
            texts = [c.get("text", "") for c in content or [] if isinstance(c, dict)]
            return " ".join(texts)[:MAX_ERROR_TEXT] or None
    return None


def step_prompt(
    prompt: str, workflow: str, step: str, attempt: str, spec: AgentNode, *, resumed: bool = False
) -> str:
    """The step's prompt with the step contract appended (workflow-model.md § 8.1); a
    resumed step says that it is presented again."""
    schema = spec.output_schema
    expected = (
        dumps(schema).decode("utf-8") if schema is not None else "a JSON object with your result"
    )
    note = f"{RESUMED_NOTE}\n" if resumed else ""
    return (
        f"{prompt}{_CONTRACT_SEPARATOR}{note}"
        f"Workflow step contract (workflow: {workflow}, step: {step}, attempt: {attempt})\n"
        "You may report progress with the `workflow` tool: "
        f'{{"action":"update","step":"{step}","attempt":"{attempt}",'
        '"update":{"type":...,"key":...,"data":{...}}}.\n'
        "Complete this step by calling the `workflow` tool exactly once with "
        f'{{"action":"submit","step":"{step}","attempt":"{attempt}","output":<your result>}}.\n'
        f"Expected output (JSON Schema): {expected}\n"
        "The step is complete only after the tool accepts. If it reports a validation "
        "error, correct the output and call it again."
    )


def visible_step_prompt(
    prompt: str, workflow: str, step: str, attempt: str, *, resumed: bool = False
) -> str:
    """An assistant-message step's prompt: the task and the visible-reply contract (no
    `workflow` tool call: the final visible reply of the turn is the output)."""
    note = f"{RESUMED_NOTE}\n" if resumed else ""
    return (
        f"{prompt}{_CONTRACT_SEPARATOR}{note}"
        f"Workflow step (workflow: {workflow}, step: {step}, attempt: {attempt})\n"
        "Answer with a normal visible reply in this conversation: your final reply of "
        "this turn is the step's output. Do not call the `workflow` tool for this step."
    )


def reminder_prompt(step: str, attempt: str, reason: str | None) -> str:
    """The prompt for a turn that ended without an accepted submission (same attempt)."""
    why = f" The last submission was not accepted: {reason}." if reason else ""
    return (
        f"Workflow step {step} (attempt {attempt}) is still waiting for its output "
        f"(reason: reminder).{why} "
        "Call the `workflow` tool with "
        f'{{"action":"submit","step":"{step}","attempt":"{attempt}","output":<your result>}}.'
    )


def _left(deadline: float | None, cap: float | None) -> float:
    """Seconds until `deadline`, at most `cap` (no deadline and no cap: a day)."""
    left = cap if cap is not None else 86_400.0
    if deadline is not None:
        left = min(left, deadline - time.monotonic())
    if left <= 0:
        raise TimeoutError("the agent step's timeout passed")
    return left


def _contract(node: CompiledNode, spec: AgentNode, attempt_id: str) -> dict[str, Any]:
    if spec.visible:
        # The server bounds the reply's text by `maxChars` when it settles the step.
        return {
            "step": node.path,
            "attempt": attempt_id,
            "visible": True,
            "maxChars": spec.max_chars,
        }
    return {
        "step": node.path,
        "attempt": attempt_id,
        "outputSchema": spec.output_schema,
        "validate": spec.validate is not None,
    }


def run_agent_step(
    place: NodePlace, node: CompiledNode, spec: AgentNode, ctx: EngineContext
) -> Any:
    """A headless agent step: find pi, propose the attempt's request, drive one pi child.

    pi is resolved first, so a missing binary fails the step (`piUnavailable`) before
    any request exists. A resumed runner whose request already has an accepted
    submission adopts that output and never asks again. Otherwise one `pi --mode
    rpc` child, registered with the server before its first prompt, runs the step's
    turns; it and everything it started are stopped before the step ends. A run bound
    to an origin Pi session runs the step there instead (`_in_origin_session`).
    """
    if place.origin_session_id is not None:
        return _in_origin_session(place, node, spec, ctx, place.origin_session_id)
    if spec.visible:
        # `run.start` and `run.resumeHeadless` refuse such a run; this is a backstop.
        raise RuntimeError(
            "headlessVisibleStep: an assistant_message step needs the run's origin Pi session"
        )
    # `tools=None` on the node means no built-in tool beside `workflow`.
    options = PiOptions(
        spec.provider, spec.model, spec.thinking, spec.tools if spec.tools is not None else ()
    )
    from pi_workflows.pi import (  # noqa: PLC0415 - agent steps only
        BridgeConfig,
        bridge_extension_path,
        write_bridge_config,
    )

    attempt_id = place.attempt_id
    request_id = f"request-{attempt_id}"
    folder = _agent_folder(place)
    config = BridgeConfig(
        run_id=place.run_id,
        interaction_id=request_id,
        step=node.path,
        attempt=attempt_id,
        client_id=f"bridge-{attempt_id}",
        output_schema=spec.output_schema,
        # The bridge submits to the server itself, over its client socket.
        socket_path=None if place.state_dir is None else str(socket_path_for(place.state_dir)),
    )
    launch = PiLaunch.build(
        environ=os.environ,
        bridge=bridge_extension_path(),
        cwd=Path.cwd(),
        options=options,
        agent_dir=place.pi_agent_dir,
        tmpdir=folder / "tmp",
        extra_env=write_bridge_config(folder / "bridge.json", config),
        stderr_path=folder / "pi.stderr.log",
    )
    prompt = spec.prompt(ctx) if callable(spec.prompt) else spec.prompt
    contract = _contract(node, spec, attempt_id)
    requested = InteractionRequested(
        interaction_id=request_id,
        interaction_kind="agent",
        contract_hash=sha256_digest(contract),
        request=contract,
    )
    deadline = None if spec.timeout_ms is None else time.monotonic() + spec.timeout_ms / 1000
    answer = _request(place, requested, deadline)
    if answer.accepted:
        return answer.value
    # Presented again: the request existed already, or the server found the request
    # of this visit's interrupted attempt (a runner died mid-step).
    resumed = answer.existing is True or answer.resumed is True
    message = step_prompt(str(prompt), place.workflow, node.path, attempt_id, spec, resumed=resumed)
    return _drive_pi(place, node.path, launch, message, requested=requested, deadline=deadline)


def _in_origin_session(
    place: NodePlace, node: CompiledNode, spec: AgentNode, ctx: EngineContext, session_id: str
) -> Any:
    """An interactive agent or assistant-message step: propose the request with its step
    prompt; no pi here.

    The node's deadline was committed with `node.started`. The server commits the
    request and the origin session's `step` message, parks the run (waiting) and
    releases the claim: this runner then stops. A resumed runner whose request already
    has an accepted submission adopts that output instead
    (workflow-server.md § Interactive Pi execution).
    """
    prompt = spec.prompt(ctx) if callable(spec.prompt) else spec.prompt
    contract = _contract(node, spec, place.attempt_id)
    if spec.visible:
        text = visible_step_prompt(str(prompt), place.workflow, node.path, place.attempt_id)
    else:
        text = step_prompt(str(prompt), place.workflow, node.path, place.attempt_id, spec)
    requested = InteractionRequested(
        interaction_id=f"request-{place.attempt_id}",
        interaction_kind="visibleResponse" if spec.visible else "agent",
        contract_hash=sha256_digest(contract),
        # The server keeps the prompt as the step message's content, not the contract;
        # a long prompt goes by reference (`requestRef`).
        request={**contract, "prompt": text},
        target_session_id=session_id,
    )
    deadline = None if spec.timeout_ms is None else time.monotonic() + spec.timeout_ms / 1000
    answer = _request(place, requested, deadline)
    if answer.accepted:
        return answer.value
    raise RunnerStopped("the step waits for its origin Pi session")


def _request(
    place: NodePlace, requested: InteractionRequested, deadline: float | None
) -> InteractionAnswer:
    """Propose the attempt's request. While an output of this step's interrupted
    attempt is still validating, the server writes nothing and says so: ask again
    until that outcome is stored (adopted if accepted), within the step's deadline
    (the server's `timed_out` ends the wait first)."""
    while True:
        answer = place.channel.ask(requested, InteractionAnswer, place.attempt_id)
        if answer.status != "validating":
            return answer
        time.sleep(min(VALIDATING_POLL_S, _left(deadline, None)))


def _agent_folder(place: NodePlace) -> Path:
    """A private (0700) folder for this attempt's bridge config, pi's TMPDIR and log."""
    root = place.state_dir / "pi" if place.state_dir is not None else Path.cwd() / ".piw-pi"
    folder = root / place.run_id / place.attempt_id
    ensure_private_dir(folder / "tmp")
    return folder


def _drive_pi(
    place: NodePlace,
    step: str,
    launch: PiLaunch,
    message: str,
    *,
    requested: InteractionRequested,
    deadline: float | None,
) -> Any:
    """Spawn pi, register it, run turns until an accepted submission; always stop its
    tree.

    The server enforces the node's deadline (it stops the runner and pi's group and
    records `timed_out`); the runner's own wait ends `AGENT_DEADLINE_GRACE_S` later,
    a backstop that never races the server's decision.
    """
    if deadline is not None:
        deadline += AGENT_DEADLINE_GRACE_S
    child = PiChild.spawn(launch)
    registration = None
    try:
        # Registered before the first prompt: pi runs no model turn until then, and
        # exits on stdin EOF if this runner dies first.
        registration = register_process(place.channel, child.pid)
        child.wait_ready(_left(deadline, PI_READY_TIMEOUT_S))
        return _turns(place, child, message, requested=requested, deadline=deadline, step=step)
    finally:
        # abort if busy, stdin EOF, SIGTERM, SIGKILL (pi-rpc.md § 7); pi's keeper ends
        # whatever its tools daemonised as pi exits.
        child.stop()
        # Backstop: anything still below this runner (a child subreaper) is stopped
        # and reaped before the group is unregistered.
        stop_descendants()
        unregister_process(place.channel, registration)


def _turns(
    place: NodePlace,
    child: PiChild,
    message: str,
    *,
    requested: InteractionRequested,
    deadline: float | None,
    step: str,
) -> Any:
    """Run turns through one child until the server holds an accepted submission.

    The bridge submits to the server and waits for its durable outcome; the runner
    never validates. A turn whose submit was accepted ends the step with the value
    the server stored (read back with a repeat of `interaction.requested`). Any
    other turn is reported to the server, which counts it durably (a resumed
    runner goes on counting) and answers: remind (1 and 2, the same child gets a
    reminder), or fail (above 2: `agentUnproductive`).
    """
    while True:
        outcome = child.run_turn(message, _left(deadline, None))
        if bridge_accepted(outcome):
            answer = _accepted(place, requested)
            if answer.accepted:
                return answer.value
        report = turn_ended(requested.interaction_id, outcome)
        verdict = place.channel.ask(report, TurnVerdict)
        if verdict.action == "accepted":  # settled meanwhile: the server's value is the truth
            answer = _accepted(place, requested)
            if not answer.accepted:
                raise RuntimeError("the step's request settled without an accepted output")
            return answer.value
        if verdict.action == "fail":
            last = "provider error" if outcome.provider_error else "no accepted submit"
            count = verdict.count if isinstance(verdict.count, int) else "its"
            raise AgentUnproductive(
                f"the agent ended {count} turns without an accepted "
                f"workflow submission (last: {last})"
            )
        reason = "the model provider failed" if outcome.provider_error else _last_rejection(outcome)
        message = reminder_prompt(step, place.attempt_id, reason)


def _accepted(place: NodePlace, requested: InteractionRequested) -> InteractionAnswer:
    """The request's answer, with the accepted output the server stored for this attempt
    if there is one (a repeat of `interaction.requested` is idempotent)."""
    return place.channel.ask(requested, InteractionAnswer, place.attempt_id)
