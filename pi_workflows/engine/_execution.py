"""The runner's execution loop: the workflow from where the durable state says to continue.

Implements workflow-server.md § Runner lifecycle and § Recovery, runner side: a new
runner replays the committed attempts into each node's scope, then runs node after node,
proposing each start, finish and failure to the server and routing on what it accepted.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any, Final

from pi_workflows.engine._channel import Channel, ClaimLost, NodePlace, Refused
from pi_workflows.engine._compile import CompiledNode, CompiledWorkflow, ScopedState
from pi_workflows.engine._context import EngineContext
from pi_workflows.engine._definition import HumanDecisionNode
from pi_workflows.engine._effects import EffectAmbiguous, RunnerEffects
from pi_workflows.engine._errors import RoutingError
from pi_workflows.engine._failures import node_error, run_failure, short_text
from pi_workflows.engine._limits import Limits, NodeGuard, NodeWatch
from pi_workflows.engine._nodes import run_node_kind
from pi_workflows.engine._routing import next_node
from pi_workflows.engine._values import MAX_ERROR_TEXT, checked_output
from pi_workflows.wire.runner import (
    PIPELINED_KINDS,
    UNSET,
    LastNode,
    NodeFailed,
    NodeFinished,
    NodeStarted,
    RunFinished,
    RunnerError,
    RunParked,
    RunState,
    StartedVisit,
    UnfinishedStep,
)

__all__ = ["PIPELINED_KINDS", "Execution"]

EFFECT_KINDS: Final = frozenset({"action", "shell"})


class Execution:
    """Runs the compiled workflow from where the durable state says to continue."""

    def __init__(
        self,
        channel: Channel,
        compiled: CompiledWorkflow,
        run_id: str,
        state: RunState,
        *,
        answered_checkpoint: str | None = None,
        guard: NodeGuard | None = None,
        state_dir: Path | None = None,
        pi_agent_dir: Path | None = None,
    ) -> None:
        """`answered_checkpoint`: the checkpoint attempt a `continue` command goes on after
        (its output in `state` is the answer); any other completed checkpoint that is the
        last step has no answer yet, so the run waits there again. `guard` applies each
        node's limits and stops what the node left running (none: in-process tests)."""
        self.channel = channel
        self.guard = guard
        self.state_dir = state_dir
        self.pi_agent_dir = pi_agent_dir
        self.compiled = compiled
        self.run_id = run_id
        self.origin_session_id = state.origin_session_id
        # Outputs and results by full compiled path; each node's context sees them
        # projected to its include scope. A resumed runner rebuilds the scopes by replaying
        # the committed attempts in order (outputs are the latest completed per path).
        self.scopes = ScopedState(compiled, state.input)
        self.visits: dict[str, int] = dict(state.visits)
        self.state_finished = state.finished
        self.steps = 0
        self.current: str | None = compiled.start_at
        self.last_output: Any = None
        self.ended: str | None = None
        self.attempt_id = ""
        self._replay(state)
        unfinished = state.unfinished
        if unfinished is not None:
            self.current = unfinished.node_path
        # A waiting attempt (an origin-session step whose output was accepted, or whose
        # run was requeued) continues in place: same attempt, visit and deadline.
        self.waiting: UnfinishedStep | None = (
            unfinished if unfinished is not None and unfinished.status == "waiting" else None
        )
        # A runner that died after its checkpoint completed and before the run waited
        # there: the answer does not exist yet, so wait again instead of going on.
        self.unanswered_checkpoint: str | None = None
        self.route_error: str | None = None
        self.last_node: LastNode | None = None
        """The pure node the run ended with: its finish goes in `run.finished`."""
        if unfinished is None and state.finished and self.ended is None:
            self._after_last(state, answered_checkpoint)

    def _replay(self, state: RunState) -> None:
        committed = state.outputs
        for attempt in state.finished:
            status, path = attempt.status, attempt.node_path
            known = self.compiled.nodes.get(path)
            if known is None or known.node is not None:  # entries and exits are no steps
                self.steps += 1
            self.ended = None
            if status == "completed":
                self.scopes.record(path, status, committed.get(path))
                self.current = attempt.next_node_path
                self.last_output = committed.get(path)
            elif status in ("failed", "timed_out"):
                # The server may have ended the attempt (a deadline); route it here.
                self.scopes.record(path, status)
                self.current = attempt.next_node_path or self._route_after(path, status)
                if self.current is None:
                    self.ended = status
            else:  # interrupted or cancelled: that node runs again
                self.current = path

    def _after_last(self, state: RunState, answered_checkpoint: str | None) -> None:
        last = state.finished[-1]
        known = self.compiled.nodes.get(last.node_path)
        if last.status != "completed" or known is None:
            return
        if known.kind == "checkpoint" and last.attempt_id != answered_checkpoint:
            self.unanswered_checkpoint = last.attempt_id
        elif isinstance(known.node, HumanDecisionNode):
            # A protected decision routes on its answer (`$.choice`), which the parent
            # run could not know: the continuation routes here.
            self._route_answer(last.node_path, state.outputs.get(last.node_path))

    def _route_answer(self, path: str, answer: Any) -> None:
        try:
            self.current = next_node(self.compiled, path, answer, "completed")
        except RoutingError as exc:
            self.current, self.route_error = None, short_text(exc)

    def _route_after(self, path: str, outcome: str) -> str | None:
        try:
            return next_node(self.compiled, path, None, outcome)
        except RoutingError:
            return None

    def run(self) -> None:
        if self.unanswered_checkpoint is not None:
            self.channel.send(RunParked(reason="checkpoint"), self.unanswered_checkpoint)
            return
        if self.route_error is not None:
            self._fail("routingFailed", self.route_error)
            return
        if self.current is None and self.ended is not None:
            code = "nodeTimedOut" if self.ended == "timed_out" else "nodeFailed"
            error = RunnerError(code=code, message=self._ended_reason())
            self._finish(self.ended, error=error)
            return
        while self.current is not None:
            node = self.compiled.nodes[self.current]
            if node.node is not None:  # include entry and exit nodes are no steps
                self.steps += 1
            if self.steps > self.compiled.max_steps:
                self._fail("maxSteps", f"more than {self.compiled.max_steps} steps")
                return
            exceeded = self.scopes.limit_exceeded(node)
            if exceeded is not None:
                self._fail("maxSteps", exceeded)
                return
            if not self._step(node):
                return
        self._finish("completed", output=self.last_output)

    def _ended_reason(self) -> str:
        """Why the run ends at a failed attempt the server ended (a deadline, an agent
        step's unproductive turns): `path: its error`, so the view names its code."""
        last = self.state_finished[-1] if self.state_finished else None
        if last is None or not last.error:
            return "the last node did not complete"
        return f"{last.node_path}: {last.error}"[:MAX_ERROR_TEXT]

    def _step(self, node: CompiledNode) -> bool:
        """Run one node; False when the run stopped here (parked or finished)."""
        pipelined = node.kind in PIPELINED_KINDS
        attempt_id, visit = self._start_attempt(node, pipelined)
        self.attempt_id = attempt_id
        ctx = self.scopes.context(
            node,
            run_id=self.run_id,
            visit=visit,
            effects=RunnerEffects(self.channel, attempt_id) if node.kind in EFFECT_KINDS else None,
        )
        try:
            output = self._run_node(node, ctx)
            # Plain JSON within the value cap (a large one goes by reference), or it fails.
            checked_output(output, self.channel.max_value_bytes)
        except (ClaimLost, Refused):
            raise
        except EffectAmbiguous as exc:
            # Never retried automatically: the run waits for an operator's review.
            self.channel.send(RunParked(reason="effectAmbiguous", detail=short_text(exc)))
            return False
        except Exception as exc:  # noqa: BLE001 - a node failure is data for routing
            return self._failed(node, attempt_id, visit, exc, pipelined=pipelined)
        try:
            # A protected decision routes on its answer, in the continuation run.
            protected = isinstance(node.node, HumanDecisionNode)
            route = None if protected else next_node(self.compiled, node.path, output, "completed")
        except RoutingError as exc:
            self._fail("routingFailed", short_text(exc))
            return False
        finished = NodeFinished(
            node_path=node.path, output=output, route=UNSET if route is None else route
        )
        if pipelined and route is None:
            # The run ends here: the node's finish goes with the run's, one unit.
            self.last_node = LastNode(attempt_id=attempt_id, node_path=node.path)
        elif pipelined:
            self.channel.post(finished, attempt_id)
        else:
            self.channel.send(finished, attempt_id)
        self.scopes.record(node.path, "completed", output)
        self.visits[node.path] = visit
        self.last_output = output
        if node.kind == "checkpoint":
            # The run waits without a runner; an answer starts its continuation run.
            self.channel.send(RunParked(reason="checkpoint"), attempt_id)
            return False
        self.current = route
        return True

    def _failed(
        self, node: CompiledNode, attempt_id: str, visit: int, exc: Exception, *, pipelined: bool
    ) -> bool:
        """Report the node's failure (whole) and route it; False when the run failed."""
        failed = NodeFailed(node_path=node.path, error=node_error(exc))
        if pipelined:
            self.channel.post(failed, attempt_id)
        else:
            self.channel.send(failed, attempt_id)
        self.visits[node.path] = visit
        self.scopes.record(node.path, "failed")
        try:
            self.current = next_node(self.compiled, node.path, None, "failed")
        except RoutingError:
            self.current = None
        if self.current is None:
            self._finish("failed", error=run_failure(node.path, exc))
            return False
        return True

    def _start_attempt(self, node: CompiledNode, pipelined: bool) -> tuple[str, int]:
        """Start the node's attempt (or continue the waiting one): its ID and visit."""
        waiting, self.waiting = self.waiting, None
        if waiting is not None and waiting.node_path == node.path:
            # Its start was committed by an earlier runner: nothing to start again.
            return waiting.attempt_id, waiting.visit
        attempt_id = f"attempt-{uuid.uuid4().hex}"
        started = NodeStarted(
            node_path=node.path,
            node_kind=node.kind,
            visit=self.visits.get(node.path, 0) + 1,
            timeout_ms=node.timeout_ms or UNSET,
        )
        if pipelined:
            # A pure node may run again, so its start need not be confirmed before it
            # runs; the reply must still carry the same visit (checked at the next wait).
            self.channel.post(started, attempt_id, visit=started.visit)
            return attempt_id, started.visit
        return attempt_id, self.channel.ask(started, StartedVisit, attempt_id).visit

    def _run_node(self, node: CompiledNode, ctx: EngineContext) -> Any:
        """The node's work under its limits; every process it started is stopped after.

        Raises:
            ResourceLimitExceeded: the node ran out of memory, or had more processes
                alive than its limit (they were stopped, so it did not complete).
        """
        watch = NodeWatch(Limits())
        guarded = self.guard.node(node.limits) if self.guard is not None else None
        try:
            with guarded or contextlib.nullcontext(watch) as watch:
                output = self._execute(node, ctx)
        except (ClaimLost, Refused, EffectAmbiguous):
            raise
        except Exception as exc:
            explained = watch.explain(exc)
            if explained is exc:
                raise
            # The traceback holds the node's frames, and with them what filled its memory.
            exc.__traceback__ = None
            raise explained from None
        exceeded = watch.exceeded()
        if exceeded is not None:
            raise exceeded
        return output

    def _execute(self, node: CompiledNode, ctx: EngineContext) -> Any:
        if node.include_transition is not None:
            # An include entry maps the parent's context to the child's input; an exit
            # hands the child's exit output back to the parent, which routes on it.
            return self.scopes.transition_output(node, ctx)
        place = NodePlace(
            self.channel,
            self.run_id,
            self.compiled.name,
            self.attempt_id,
            self.origin_session_id,
            self.state_dir,
            self.pi_agent_dir,
        )
        return run_node_kind(place, node, ctx)

    def _fail(self, code: str, message: str) -> None:
        self._finish("failed", error=RunnerError(code=code, message=message))

    def _finish(self, status: Any, *, output: Any = None, error: RunnerError | None = None) -> None:
        last_node = self.last_node if status == "completed" else None
        # Behind the posted messages, in the same write: the server refuses the end
        # unless it accepted every one of them (`receipts`), so none is waited for.
        self.channel.send_behind_posts(
            RunFinished(
                status=status,
                output=output if status == "completed" else UNSET,
                error=UNSET if error is None else error,
                last_node=UNSET if last_node is None else last_node,
                receipts=self.channel.proposals,
            )
        )
