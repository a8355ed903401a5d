"""Included workflows at run time: scoped contexts, entry/exit transitions, exits, resume.

These drive the runner's real `Execution` loop with an in-memory stand-in for the
server end of the channel, which commits attempts the way the server does and can
rebuild the resume state a new runner gets.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import msgspec
import pytest

from pi_workflows import (
    action,
    checkpoint,
    compute,
    define_workflow,
    include_workflow,
)
from pi_workflows.engine import (
    WorkflowDefinition,
    WorkflowDefinitionError,
    compile_workflow,
    effect_idempotency_key,
)
from pi_workflows.engine._channel import ClaimLost
from pi_workflows.engine._compile import CompiledWorkflow, ScopedState
from pi_workflows.engine._execution import Execution
from pi_workflows.wire.runner import (
    DEFAULT_MAX_VALUE_BYTES,
    RunnerAddress,
    RunnerPayload,
    RunnerReply,
    RunState,
)

RUN_ID = "run-test"
T = TypeVar("T")


@dataclass
class _Attempt:
    attempt_id: str
    path: str
    visit: int
    status: str = "running"
    output: Any = None
    route: str | None = None


@dataclass
class FakeServer:
    """The server end of a runner channel: commits every message, answers `accepted`."""

    crash_at: str | None = None
    """Raise ClaimLost when this node path starts (its attempt is then interrupted)."""
    attempts: list[_Attempt] = field(default_factory=list)
    messages: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    effects: dict[str, Any] = field(default_factory=dict)
    finished: dict[str, Any] | None = None
    parked: str | None = None
    run_input: Any = None

    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    """The channel's value cap (the runner checks every output against it)."""

    def post(
        self, body: RunnerPayload, attempt_id: str | None = None, *, visit: int | None = None
    ) -> None:
        """A pipelined message: applied in order like `send`; its answer must match."""
        result = self.send(body, attempt_id).result
        if visit is not None:
            assert result == {"visit": visit}, (body.kind, result)

    def ask(self, body: RunnerPayload, result_type: type[T], attempt_id: str | None = None) -> T:
        return msgspec.convert(self.send(body, attempt_id).result, result_type)

    def send(self, body: RunnerPayload, attempt_id: str | None = None) -> RunnerReply:
        return RunnerReply.build(
            RunnerAddress(RUN_ID, 1, "runner-test"),
            f"m-{len(self.messages)}",
            "accepted",
            result=self._apply(body.kind, msgspec.to_builtins(body), attempt_id),
        )

    def send_behind_posts(self, body: RunnerPayload) -> RunnerReply:
        """The run's end: every posted message was applied first (this server is in order)."""
        return self.send(body)

    @property
    def proposals(self) -> int:
        """The messages applied so far: the receipts a run's end counts."""
        return len(self.messages)

    def _apply(self, kind: str, payload: dict[str, Any], attempt_id: str | None) -> Any:
        self.messages.append((kind, payload))
        if kind == "node.started":
            path = payload["nodePath"]
            if path == self.crash_at:
                self.crash_at = None
                raise ClaimLost("crash injected")
            visit = 1 + sum(
                1 for a in self.attempts if a.path == path and a.status != "interrupted"
            )
            assert attempt_id is not None
            self.attempts.append(_Attempt(attempt_id, path, visit))
            return {"visit": visit}
        if kind == "node.finished":
            attempt = self._attempt(attempt_id)
            attempt.status, attempt.output = "completed", payload["output"]
            attempt.route = payload.get("route")
        elif kind == "node.failed":
            self._attempt(attempt_id).status = "failed"
        elif kind == "effect.reserve":
            key = payload["idempotencyKey"]
            effect = {"effectId": f"effect-{key}", "effectType": payload["effectType"]}
            effect["idempotencyKey"] = key
            if key in self.effects:
                return {"decision": "adopt", "effect": {**effect, **self.effects[key]}}
            return {"decision": "proceed", "effect": {**effect, "state": "applying"}}
        elif kind == "effect.settle":
            self.effects[payload["idempotencyKey"]] = {
                "state": "applied",
                "result": payload.get("result"),
            }
        elif kind == "run.finished":
            self.finished = {k: v for k, v in payload.items() if k not in ("lastNode", "receipts")}
            last = payload.get("lastNode")
            if last is not None:  # the last pure node finishes with the run, as one unit
                attempt = self._attempt(last["attemptId"])
                attempt.status, attempt.output = "completed", payload["output"]
        elif kind == "run.parked":
            self.parked = payload["reason"]
        return None

    def _attempt(self, attempt_id: str | None) -> _Attempt:
        return next(a for a in self.attempts if a.attempt_id == attempt_id)

    def state(self, answers: dict[str, Any] | None = None) -> dict[str, Any]:
        """The resume state a new runner gets (a running attempt became interrupted)."""
        for attempt in self.attempts:
            if attempt.status == "running":
                attempt.status = "interrupted"
        finished = [a for a in self.attempts if a.status in ("completed", "failed")]
        outputs = {a.path: a.output for a in finished if a.status == "completed"}
        outputs.update(answers or {})
        visits: dict[str, int] = {}
        for a in finished:
            visits[a.path] = visits.get(a.path, 0) + 1
        return {
            "input": self.run_input,
            "outputs": outputs,
            "visits": visits,
            "finished": [
                {
                    "attemptId": a.attempt_id,
                    "nodePath": a.path,
                    "visit": a.visit,
                    "status": a.status,
                    "nextNodePath": a.route,
                }
                for a in finished
            ],
            "unfinished": None,
        }

    def output_of(self, path: str) -> Any:
        """The output of the latest completed attempt of `path`."""
        done = [a for a in self.attempts if a.path == path and a.status == "completed"]
        assert done, f"{path} never completed"
        return done[-1].output

    def paths(self) -> list[str]:
        return [a.path for a in self.attempts]


def run(
    workflow: WorkflowDefinition | CompiledWorkflow,
    run_input: Any,
    server: FakeServer | None = None,
    state: dict[str, Any] | None = None,
    answered_checkpoint: str | None = None,
) -> FakeServer:
    """Run `workflow` with a fresh runner (resuming from `state` if given; a continuation
    names the checkpoint attempt it goes on after)."""
    server = server if server is not None else FakeServer()
    server.run_input = run_input
    server.finished = server.parked = None
    compiled = compile_workflow(workflow)
    execution = Execution(
        cast(Any, server),
        compiled,
        RUN_ID,
        msgspec.convert(state or {"input": run_input}, RunState),
        answered_checkpoint=answered_checkpoint,
    )
    with contextlib.suppress(ClaimLost):
        execution.run()
    return server


def seen(ctx: Any) -> dict[str, Any]:
    """What a node saw of its context."""
    return {
        "input": ctx.input,
        "outputs": dict(ctx.outputs),
        "results": dict(ctx.results),
        "path": ctx.node_path,
    }


def child_workflow(name: str = "kid") -> WorkflowDefinition:
    return define_workflow(
        name=name,
        start_at="x",
        nodes={
            "x": compute(seen),
            "y": compute(lambda ctx: {"twice": ctx.input["n"] * 2, "saw": seen(ctx)}),
        },
        edges=[{"from": "x", "to": "y"}],
        input_schema={"type": "object", "required": ["n"]},
        exits={"done": {"from": "y"}},
    )


def parent_workflow(child: WorkflowDefinition) -> WorkflowDefinition:
    return define_workflow(
        name="parent",
        start_at="prep",
        nodes={
            "prep": compute(lambda ctx: {"n": ctx.input["n"] + 1}),
            "after": compute(seen),
        },
        includes={"m": include_workflow(child, input=lambda ctx: {"n": ctx.outputs["prep"]["n"]})},
        edges=[{"from": "prep", "to": "m"}, {"from": "m.done", "to": "after"}],
    )


def test_an_include_runs_with_its_own_scope_and_hands_its_exit_back() -> None:
    server = run(parent_workflow(child_workflow()), {"n": 1, "secret": "root"})
    assert server.finished is not None and server.finished["status"] == "completed", server
    assert server.paths() == ["prep", "m", "m/x", "m/y", "m/__piw_exit_done", "after"]
    assert server.output_of("m") == {
        "schema": "pi-workflows.include-entry.v1",
        "invocation": 1,
        "input": {"n": 2},
    }
    # The child sees its own input and nothing of the parent's nodes.
    assert server.output_of("m/x") == {
        "input": {"n": 2},
        "outputs": {},
        "results": {},
        "path": "m/x",
    }
    saw_y = server.output_of("m/y")["saw"]
    assert saw_y["outputs"] == {"x": server.output_of("m/x")}
    assert saw_y["results"] == {"x": {"outcome": "completed"}}
    exit_output = {"exit": "done", "output": server.output_of("m/y")}
    assert server.output_of("m/__piw_exit_done") == exit_output
    # The parent sees the include under its mount name, as `{exit, output}`.
    after = server.output_of("after")
    assert after["input"] == {"n": 1, "secret": "root"}
    assert after["outputs"] == {"prep": {"n": 2}, "m": exit_output}
    assert after["results"]["m"] == {"outcome": "completed", "exit": "done"}
    assert server.finished["output"] == after


def test_routing_on_the_exit_the_child_left_through() -> None:
    child = define_workflow(
        name="judge",
        start_at="check",
        nodes={
            "check": compute(lambda ctx: {"ok": ctx.input["score"] > 5}),
            "pass_": compute(lambda ctx: {"verdict": "pass"}),
            "fail_": compute(lambda ctx: {"verdict": "fail"}),
        },
        edges=[
            {"from": "check", "switch": {"on": "$.ok", "cases": {True: "pass_", False: "fail_"}}}
        ],
        exits={"passed": {"from": "pass_"}, "failed": {"from": "fail_"}},
    )
    parent = define_workflow(
        name="gate",
        start_at="j",
        nodes={
            "ship": compute(lambda ctx: {"shipped": ctx.outputs["j"]["output"]["verdict"]}),
            "fix": compute(lambda ctx: {"fixing": ctx.outputs["j"]["exit"]}),
        },
        includes={"j": include_workflow(child)},
        edges=[{"from": "j.passed", "to": "ship"}, {"from": "j.failed", "to": "fix"}],
    )
    good = run(parent, {"score": 9})
    assert good.paths() == ["j", "j/check", "j/pass_", "j/__piw_exit_passed", "ship"]
    assert good.finished == {"status": "completed", "output": {"shipped": "pass"}}
    bad = run(parent, {"score": 1})
    assert bad.paths()[-2:] == ["j/__piw_exit_failed", "fix"]
    assert bad.finished == {"status": "completed", "output": {"fixing": "failed"}}


def test_a_switch_on_the_exit_output_and_an_unrouted_root_exit() -> None:
    child = define_workflow(
        name="c",
        start_at="a",
        nodes={"a": compute(lambda ctx: {"level": ctx.input})},
        exits={"done": {"from": "a"}},
    )
    parent = define_workflow(
        name="p",
        start_at="m",
        nodes={"hi": compute(lambda ctx: "hi"), "lo": compute(lambda ctx: "lo")},
        includes={"m": include_workflow(child), "tail": include_workflow(child)},
        edges=[
            {
                "from": "m.done",
                "switch": {"on": "$.output.level", "cases": {"3": "hi"}, "default": "lo"},
            },
            {"from": "hi", "to": "tail"},
        ],
    )
    assert run(parent, 1).finished == {"status": "completed", "output": "lo"}
    high = run(parent, 3)
    # The root may end through an include: the run's output is that exit's output.
    assert high.paths()[-3:] == ["tail", "tail/a", "tail/__piw_exit_done"]
    assert high.finished == {
        "status": "completed",
        "output": {"exit": "done", "output": {"level": 3}},
    }


def test_an_include_inside_an_include() -> None:
    inner = child_workflow("inner")
    middle = define_workflow(
        name="middle",
        start_at="pre",
        nodes={
            "pre": compute(lambda ctx: {"n": ctx.input["n"] * 10}),
            "post": compute(seen),
        },
        includes={"in": include_workflow(inner, input=lambda ctx: ctx.outputs["pre"])},
        edges=[{"from": "pre", "to": "in"}, {"from": "in.done", "to": "post"}],
        exits={"done": {"from": "post"}},
    )
    server = run(parent_workflow(middle), {"n": 1})
    assert server.finished is not None and server.finished["status"] == "completed"
    assert server.paths() == [
        "prep",
        "m",
        "m/pre",
        "m/in",
        "m/in/x",
        "m/in/y",
        "m/in/__piw_exit_done",
        "m/post",
        "m/__piw_exit_done",
        "after",
    ]
    assert server.output_of("m/in/x")["input"] == {"n": 20}
    post = server.output_of("m/post")
    assert post["input"] == {"n": 2}
    assert set(post["outputs"]) == {"pre", "in"}
    assert post["outputs"]["in"]["output"]["twice"] == 40
    assert set(server.output_of("after")["outputs"]) == {"prep", "m"}


def test_reentering_an_include_starts_with_empty_local_state() -> None:
    child = define_workflow(
        name="count",
        start_at="look",
        nodes={"look": compute(seen), "tick": compute(lambda ctx: {"round": ctx.input["round"]})},
        edges=[{"from": "look", "to": "tick"}],
        exits={"done": {"from": "tick"}},
    )
    parent = define_workflow(
        name="loop",
        start_at="m",
        nodes={
            "again": compute(lambda ctx: {"next": ctx.outputs["m"]["output"]["round"] + 1}),
            "end": compute(lambda ctx: ctx.outputs["m"]),
        },
        includes={
            "m": include_workflow(
                child, input=lambda ctx: {"round": ctx.outputs.get("again", {"next": 1})["next"]}
            )
        },
        edges=[
            {"from": "m.done", "to": "again"},
            {"from": "again", "switch": {"on": "$.next", "cases": {4: "end"}, "default": "m"}},
        ],
    )
    server = run(parent, {})
    assert server.finished == {
        "status": "completed",
        "output": {"exit": "done", "output": {"round": 3}},
    }
    entries = [a.output for a in server.attempts if a.path == "m"]
    assert [e["invocation"] for e in entries] == [1, 2, 3]
    looks = [a.output for a in server.attempts if a.path == "m/look"]
    assert [look["input"] for look in looks] == [{"round": 1}, {"round": 2}, {"round": 3}]
    assert all(look["outputs"] == {} and look["results"] == {} for look in looks)


def test_the_root_max_steps_counts_real_attempts_only() -> None:
    child = define_workflow(
        name="one", start_at="a", nodes={"a": compute(lambda ctx: 1)}, exits={"done": {"from": "a"}}
    )
    parent = define_workflow(
        name="loop",
        start_at="m",
        nodes={"tick": compute(lambda ctx: 2)},
        includes={"m": include_workflow(child)},
        edges=[{"from": "m.done", "to": "tick"}, {"from": "tick", "to": "m"}],
        max_steps=3,
    )
    server = run(parent, {})
    one_round = ["m", "m/a", "m/__piw_exit_done"]
    assert server.paths() == [*one_round, "tick", *one_round], "the 2nd tick is step 4"
    assert server.finished is not None and server.finished["error"]["code"] == "maxSteps"


def test_a_child_max_steps_bounds_one_invocation() -> None:
    looping = define_workflow(
        name="spin",
        start_at="a",
        nodes={"a": compute(lambda ctx: {"go": True}), "end": compute(lambda ctx: {})},
        edges=[{"from": "a", "switch": {"on": "$.go", "cases": {True: "a"}, "default": "end"}}],
        exits={"done": {"from": "end"}},
        max_steps=3,
    )
    parent = define_workflow(
        name="p",
        start_at="m",
        nodes={"z": compute(lambda ctx: 0)},
        includes={"m": include_workflow(looping)},
        edges=[{"from": "m.done", "to": "z"}],
    )
    server = run(parent, {})
    assert server.paths() == ["m", "m/a", "m/a", "m/a"]
    assert server.finished is not None and server.finished["status"] == "failed"
    assert server.finished["error"]["code"] == "maxSteps"
    assert "'m'" in server.finished["error"]["message"]


def test_an_exit_validate_that_raises_fails_the_exit_and_may_be_routed() -> None:
    def refuse(output: Any) -> Any:
        raise ValueError("not good enough")

    child = define_workflow(
        name="c",
        start_at="a",
        nodes={"a": compute(lambda ctx: {"v": 1})},
        exits={"done": {"from": "a", "validate": refuse}},
    )
    parent = define_workflow(
        name="p",
        start_at="m",
        nodes={"recover": compute(lambda ctx: dict(ctx.results))},
        includes={"m": include_workflow(child)},
        edges=[
            {"from": "m.done", "switch": {"on": "$result.outcome", "cases": {"failed": "recover"}}}
        ],
    )
    server = run(parent, {})
    assert server.finished is not None
    assert server.finished["output"] == {"m": {"outcome": "failed", "exit": "done"}}


def test_an_invalid_include_input_fails_the_entry_and_the_run() -> None:
    parent = define_workflow(
        name="p",
        start_at="m",
        nodes={"z": compute(lambda ctx: 0)},
        includes={"m": include_workflow(child_workflow(), input=lambda ctx: {"m": 1})},
        edges=[{"from": "m.done", "to": "z"}],
    )
    server = run(parent, {})
    assert server.paths() == ["m"]
    assert server.finished is not None and server.finished["error"]["code"] == "nodeFailed"
    assert "at /n: is required" in server.finished["error"]["message"]


@pytest.mark.parametrize("crash_at", ["m", "m/x", "m/y", "m/__piw_exit_done", "after"])
def test_a_new_runner_rebuilds_the_scopes_from_committed_attempts(crash_at: str) -> None:
    workflow = parent_workflow(child_workflow())
    whole = run(workflow, {"n": 1})
    server = run(workflow, {"n": 1}, FakeServer(crash_at=crash_at))
    assert server.finished is None, "the first runner lost its claim"
    server = run(workflow, {"n": 1}, server, state=server.state())
    assert server.finished == whole.finished
    completed = [a.path for a in server.attempts if a.status == "completed"]
    assert completed == whole.paths(), "nothing that completed ran again"
    assert server.output_of("m/y") == whole.output_of("m/y")


def test_a_resumed_run_counts_only_real_steps() -> None:
    parent = define_workflow(
        name="p",
        start_at="m",
        nodes={"z": compute(lambda ctx: "z")},
        includes={"m": include_workflow(child_workflow(), input=lambda ctx: {"n": 1})},
        edges=[{"from": "m.done", "to": "z"}],
        max_steps=3,  # x, y, z: the entry and exit do not count
    )
    assert run(parent, {}).finished == {"status": "completed", "output": "z"}
    server = run(parent, {}, FakeServer(crash_at="z"))
    server = run(parent, {}, server, state=server.state())
    assert server.finished == {"status": "completed", "output": "z"}


def test_a_checkpoint_inside_an_include_continues_with_the_answer() -> None:
    child = define_workflow(
        name="ask",
        start_at="approve",
        nodes={
            "approve": checkpoint(summary=lambda ctx: f"ship {ctx.input['n']}?"),
            "use": compute(lambda ctx: {"answer": ctx.outputs["approve"], "n": ctx.input["n"]}),
        },
        edges=[{"from": "approve", "to": "use"}],
        exits={"done": {"from": "use"}},
    )
    workflow = parent_workflow(child)
    server = run(workflow, {"n": 4})
    assert server.parked == "checkpoint"
    assert server.output_of("m/approve") == {"summary": "ship 5?"}
    asked = next(a.attempt_id for a in server.attempts if a.path == "m/approve")
    state = server.state({"m/approve": {"ok": True}})
    server = run(workflow, {"n": 4}, server, state=state, answered_checkpoint=asked)
    assert server.finished is not None and server.finished["status"] == "completed"
    assert server.output_of("m/use") == {"answer": {"ok": True}, "n": 5}


def test_a_runner_resumed_after_an_unanswered_checkpoint_waits_there_again() -> None:
    # A runner died after its checkpoint completed and before the run waited: the next
    # runner must wait for the answer, never go on past the checkpoint without one.
    child = define_workflow(
        name="ask",
        start_at="approve",
        nodes={"approve": checkpoint(summary="ship?"), "use": compute(lambda ctx: {})},
        edges=[{"from": "approve", "to": "use"}],
        exits={"done": {"from": "use"}},
    )
    workflow = parent_workflow(child)
    server = run(workflow, {"n": 4})
    assert server.parked == "checkpoint"
    server = run(workflow, {"n": 4}, server, state=server.state())
    assert server.parked == "checkpoint" and server.finished is None
    assert "m/use" not in server.paths()


def test_effects_inside_an_include_are_keyed_by_the_full_compiled_path() -> None:
    def charge(ctx: Any) -> Any:
        return ctx.effect(
            "payment.charge", {"n": ctx.input["n"]}, apply=lambda key, req: {"key": key}
        )

    child = define_workflow(
        name="pay",
        start_at="charge",
        nodes={"charge": action(charge)},
        exits={"done": {"from": "charge"}},
    )
    parent = define_workflow(
        name="p",
        start_at="a",
        nodes={"charge": action(charge)},
        includes={"a": include_workflow(child), "b": include_workflow(child)},
        edges=[{"from": "a.done", "to": "b"}, {"from": "b.done", "to": "charge"}],
    )
    server = run(parent, {"n": 1})
    assert server.finished is not None and server.finished["status"] == "completed"
    keys = {path: server.output_of(path)["key"] for path in ("a/charge", "b/charge", "charge")}
    for path, key in keys.items():
        assert key == effect_idempotency_key(RUN_ID, "payment.charge", path, 1)
    assert len(set(keys.values())) == 3


def test_scoped_state_views_directly() -> None:
    compiled = compile_workflow(parent_workflow(child_workflow()))
    state = ScopedState(compiled, {"n": 1})
    state.record("prep", "completed", {"n": 2})
    state.record("m", "completed", {"schema": "x", "invocation": 1, "input": {"n": 2}})
    assert state.view(()) == ({"n": 1}, {"prep": {"n": 2}}, {"prep": {"outcome": "completed"}})
    assert state.view(("m",)) == ({"n": 2}, {}, {})
    state.record("m/x", "failed")
    assert state.view(("m",))[1:] == ({}, {"x": {"outcome": "failed"}})
    state.record("m/x", "completed", {"x": 1})
    state.record("m/y", "completed", {"y": 1})
    assert state.view(("m",))[1] == {"x": {"x": 1}, "y": {"y": 1}}
    assert state.invocation("m") == 2
    state.record("m/__piw_exit_done", "completed", {"exit": "done", "output": {"y": 1}})
    assert state.view(())[1] == {"prep": {"n": 2}, "m": {"exit": "done", "output": {"y": 1}}}


def test_a_nested_exit_without_an_edge_is_refused() -> None:
    inner = child_workflow("inner")
    unrouted = define_workflow(
        name="middle",
        start_at="pre",
        nodes={"pre": compute(lambda ctx: {"go": True}), "post": compute(lambda ctx: {})},
        includes={"in": include_workflow(inner)},
        edges=[{"from": "pre", "switch": {"on": "$.go", "cases": {True: "in"}, "default": "post"}}],
        exits={"done": {"from": "post"}},
    )
    compile_workflow(unrouted)  # at the root an unrouted exit ends the run: allowed
    parent = define_workflow(
        name="p",
        start_at="m",
        nodes={"z": compute(lambda ctx: 0)},
        includes={"m": include_workflow(unrouted)},
        edges=[{"from": "m.done", "to": "z"}],
    )
    with pytest.raises(WorkflowDefinitionError, match=r"'in\.done'") as caught:
        compile_workflow(parent)
    assert caught.value.node == "in"
