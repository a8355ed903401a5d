"""The resource-manager authoring API: definitions, conditions, the pass context's outcomes."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

import pi_workflows
from pi_workflows import resource_managers as rm
from pi_workflows.engine import (
    MAX_CONDITIONS,
    MAX_FINALIZERS,
    MAX_REQUEUE_AFTER_SECONDS,
    MAX_STATUS_BYTES,
    ChildRun,
    ChildRunCall,
    ManagedEffect,
    ManagedEffectCall,
    ReconcileContext,
    ReconcileResult,
    ReconcileResultError,
    RequestKeyConflictError,
    Resource,
    ResourceManagerDefinitionError,
    ResourceRunnerRequiredError,
    condition_false,
    condition_true,
    condition_unknown,
    define_resource_manager,
    finish_pass,
)


def _status(spec: Any) -> Any:
    return {"seen": None}


def _settle(ctx: ReconcileContext) -> ReconcileResult:
    return ctx.settled(status={"ok": True}, conditions=[condition_true("Ready", "Done")])


def resource(**changes: Any) -> Resource:
    fields: dict[str, Any] = {
        "manager": "summaries",
        "key": "docs",
        "uid": "res-1",
        "generation": 3,
        "resource_version": 7,
        "spec": {"path": "docs"},
        "status": {"seen": None},
    }
    fields.update(changes)
    return Resource(**fields)


def context(**changes: Any) -> ReconcileContext:
    return ReconcileContext(resource(**changes), deadline=time.monotonic() + 60)


# ---------------------------------------------------------------------------
# define_resource_manager


def test_a_valid_definition_is_frozen_and_keeps_its_schema() -> None:
    schema = {"type": "object", "required": ["path"]}
    definition = define_resource_manager(
        name="summaries", initial_status=_status, reconcile=_settle, spec_schema=schema
    )
    assert definition.name == "summaries"
    assert definition.spec_schema == schema
    assert definition.spec_schema_json == b'{"required":["path"],"type":"object"}'
    assert definition.spec_validator is not None
    assert definition.source_path == __file__
    with pytest.raises(AttributeError):
        definition.name = "other"  # type: ignore[misc]


def test_the_root_and_the_public_module_name_the_api() -> None:
    assert pi_workflows.define_resource_manager is define_resource_manager
    assert pi_workflows.condition_true is condition_true
    assert rm.ReconcileContext is ReconcileContext
    assert set(rm.__all__) <= set(dir(rm))


@pytest.mark.parametrize("name", ["", "dot.ted", "has space", "-lead", "_lead", "x" * 129, None, 3])
def test_bad_names_are_refused(name: Any) -> None:
    with pytest.raises(ResourceManagerDefinitionError, match="not a valid resource manager name"):
        define_resource_manager(name=name, initial_status=_status, reconcile=_settle)


def test_callables_are_required() -> None:
    with pytest.raises(ResourceManagerDefinitionError, match="initial_status must be a function"):
        define_resource_manager(name="m", initial_status={}, reconcile=_settle)  # type: ignore[arg-type]
    with pytest.raises(ResourceManagerDefinitionError, match="reconcile must be a function"):
        define_resource_manager(name="m", initial_status=_status, reconcile="x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ([1], "must be a JSON Schema"),
        ({"type": "nope"}, "not a valid Draft 2020-12 JSON Schema"),
        ({"const": math.nan}, "not plain JSON"),
    ],
)
def test_bad_spec_schemas_are_refused(schema: Any, problem: str) -> None:
    with pytest.raises(ResourceManagerDefinitionError, match=problem):
        define_resource_manager(
            name="m", initial_status=_status, reconcile=_settle, spec_schema=schema
        )


# ---------------------------------------------------------------------------
# Conditions


def test_conditions_have_the_three_statuses() -> None:
    assert condition_true("Ready", "Merged").to_wire() == {
        "type": "Ready",
        "status": "True",
        "reason": "Merged",
    }
    assert condition_false("Ready", "ChecksFailed", "2 checks failed").status == "False"
    assert condition_unknown("Reviewed", "Waiting").status == "Unknown"
    assert condition_true("Ready", "Merged").observed_generation is None


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (("", "R"), "condition type"),
        (("1Ready", "R"), "condition type"),
        (("Ready", ""), "reason must be a short word"),
        (("Ready", "has space"), "reason must be a short word"),
        (("Ready", "R", "x" * 1001), "message must be text"),
        (("Ready", "R", 5), "message must be text"),
    ],
)
def test_malformed_conditions_are_refused(args: tuple[Any, ...], problem: str) -> None:
    with pytest.raises(ReconcileResultError, match=problem):
        condition_true(*args)


def test_condition_from_wire_round_trips_and_checks() -> None:
    stored = {
        "type": "Ready",
        "status": "False",
        "reason": "Pending",
        "message": "m",
        "observedGeneration": 4,
        "lastTransitionTime": 1_700_000_000_000,
    }
    parsed = rm.Condition.from_wire(stored)
    assert parsed.observed_generation == 4
    assert parsed.to_wire() == {k: v for k, v in stored.items() if k != "lastTransitionTime"}
    with pytest.raises(ReconcileResultError, match="status must be"):
        rm.Condition.from_wire({**stored, "status": "true"})
    with pytest.raises(ReconcileResultError, match="observedGeneration"):
        rm.Condition.from_wire({**stored, "observedGeneration": 0})


# ---------------------------------------------------------------------------
# Outcomes


def test_settled_stamps_every_condition_with_the_generation_read() -> None:
    ctx = context(generation=5)
    forged = rm.Condition("Ready", "True", "Merged", observed_generation=99)
    result = ctx.settled(
        status={"n": 1}, conditions=[forged, condition_unknown("Reviewed", "Waiting")]
    )
    assert result.outcome == "settled"
    assert result.generation == 5
    assert result.resource_version == 7
    assert [c.observed_generation for c in result.conditions] == [5, 5]
    assert finish_pass(ctx, result) is result
    assert result.to_wire() == {
        "outcome": "settled",
        "generation": 5,
        "resourceVersion": 7,
        "status": {"n": 1},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Merged", "observedGeneration": 5},
            {"type": "Reviewed", "status": "Unknown", "reason": "Waiting", "observedGeneration": 5},
        ],
    }


def test_a_pass_on_an_old_generation_cannot_report_the_new_one_ready() -> None:
    old = context(generation=2)
    result = old.settled(status={}, conditions=[condition_true("Ready", "Merged")])
    ready = result.conditions[0]
    assert ready.observed_generation == 2
    # The generation the pass read travels with the result: the server compares it (and
    # the resource version) with the resource it commits to.
    assert result.generation == 2
    assert result.to_wire()["generation"] == 2


def test_settled_copies_the_status() -> None:
    status = {"files": ["a"]}
    result = context().settled(status=status)
    status["files"].append("b")
    assert result.status == {"files": ["a"]}


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"status": {1, 2}}, "status is not plain JSON"),
        ({"status": "x" * MAX_STATUS_BYTES}, "at most 1048576"),
        ({"status": {}, "conditions": "Ready"}, "must be a list"),
        ({"status": {}, "conditions": [{"type": "Ready"}]}, "must come from condition_"),
        (
            {"status": {}, "conditions": [condition_true("A", "r"), condition_false("A", "r")]},
            "two conditions of type 'A'",
        ),
        (
            {
                "status": {},
                "conditions": [condition_true(f"C{i}", "r") for i in range(MAX_CONDITIONS + 1)],
            },
            "at most 32 conditions",
        ),
    ],
)
def test_bad_settled_calls_are_refused(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(ReconcileResultError, match=problem):
        context().settled(**kwargs)


def test_requeue_and_requeue_after() -> None:
    ctx = context()
    assert ctx.requeue().to_wire() == {
        "outcome": "requeue",
        "generation": 3,
        "resourceVersion": 7,
    }
    later = context().requeue_after(2.5)
    assert later.outcome == "requeueAfter"
    assert later.requeue_after_ms == 2500
    assert context().requeue_after(0.0001).requeue_after_ms == 1
    assert context().requeue_after(MAX_REQUEUE_AFTER_SECONDS).requeue_after_ms is not None


@pytest.mark.parametrize(
    "seconds", [0, -1, math.inf, math.nan, True, "5", MAX_REQUEUE_AFTER_SECONDS + 1]
)
def test_requeue_after_is_bounded(seconds: Any) -> None:
    with pytest.raises(ReconcileResultError, match="seconds must be a number"):
        context().requeue_after(seconds)


def test_a_pass_has_exactly_one_outcome() -> None:
    ctx = context()
    first = ctx.requeue()
    with pytest.raises(ReconcileResultError, match="already has its outcome"):
        ctx.settled(status={})
    with pytest.raises(ReconcileResultError, match="already has its outcome"):
        ctx.add_finalizer("cleanup")
    assert finish_pass(ctx, first) is first


def test_finish_pass_accepts_only_the_contexts_own_outcome() -> None:
    ctx = context()
    with pytest.raises(ReconcileResultError, match=r"must return ctx\.settled"):
        finish_pass(ctx, None)
    other = context().requeue()
    ctx.requeue()
    with pytest.raises(ReconcileResultError, match="return the outcome it made"):
        finish_pass(ctx, other)


# ---------------------------------------------------------------------------
# Finalizers and the deadline


def test_finalizers_are_added_once_and_travel_with_the_outcome() -> None:
    ctx = context(finalizers=("worktree",))
    ctx.add_finalizer("example.org/session")
    ctx.add_finalizer("worktree")
    assert ctx.finalizers == ("worktree", "example.org/session")
    ctx.remove_finalizer("worktree")
    ctx.remove_finalizer("never-held")
    result = ctx.requeue()
    assert result.finalizers == ("example.org/session",)
    assert result.to_wire()["finalizers"] == ["example.org/session"]


def test_finalizer_rules() -> None:
    with pytest.raises(ReconcileResultError, match="finalizer 'bad name' is not valid"):
        context().add_finalizer("bad name")
    deleting = context(deletion_requested=True, finalizers=("worktree",))
    with pytest.raises(ReconcileResultError, match="deletion of this resource was requested"):
        deleting.add_finalizer("another")
    deleting.remove_finalizer("worktree")
    assert deleting.settled(status={}).finalizers == ()
    unchanged = context(finalizers=("worktree",))
    unchanged.add_finalizer("worktree")
    left = unchanged.requeue()
    assert left.finalizers is None
    assert "finalizers" not in left.to_wire()
    full = context(finalizers=tuple(f"f{i}" for i in range(MAX_FINALIZERS)))
    with pytest.raises(ReconcileResultError, match="at most 16"):
        full.add_finalizer("one-more")


def test_the_deadline_is_readable() -> None:
    deadline = time.monotonic() + 30
    ctx = ReconcileContext(resource(), deadline=deadline)
    assert ctx.deadline == deadline
    assert 0 < ctx.time_left() <= 30
    assert ReconcileContext(resource(), deadline=time.monotonic() - 1).time_left() == 0.0


def test_the_resource_is_what_the_pass_read() -> None:
    stored = (condition_true("Ready", "Merged"),)
    ctx = context(conditions=stored, deletion_requested=True)
    assert ctx.resource.key == "docs"
    assert ctx.resource.deletion_requested
    assert ctx.resource.condition("Ready") == stored[0]
    assert ctx.resource.condition("Missing") is None


def test_the_resource_round_trips_its_wire_form() -> None:
    read = resource(conditions=(rm.Condition("Ready", "True", "Merged", None, 2),))
    wire = read.to_wire()
    assert wire["resourceVersion"] == 7
    assert Resource.from_wire(wire) == read
    for change in ({"uid": ""}, {"generation": 0}, {"resourceVersion": True}, {"finalizers": [1]}):
        with pytest.raises(ValueError, match="malformed resource"):
            Resource.from_wire({**wire, **change})
    with pytest.raises(ValueError, match="malformed resource"):
        Resource.from_wire({"uid": "x"})


# ---------------------------------------------------------------------------
# Services


def test_services_need_a_resource_runner() -> None:
    ctx = context()
    with pytest.raises(ResourceRunnerRequiredError, match="only in a pass run by"):
        ctx.workflows.ensure(request_key="summary/a.md", workflow="summarise", input={"f": 1})
    with pytest.raises(ResourceRunnerRequiredError, match="only in a pass run by"):
        ctx.effects.ensure(
            key="note/1", kind="notes.write", request={}, observe=_observe, apply=_observe
        )


def _observe(key: str, request: Any) -> Any:
    return rm.NOT_APPLIED


class _Host:
    """A host as a test gives it: records each checked call."""

    def __init__(self) -> None:
        self.children: dict[str, ChildRunCall] = {}
        self.effects: list[ManagedEffectCall] = []

    def ensure_child(self, call: ChildRunCall) -> ChildRun:
        known = self.children.setdefault(call.request_key, call)
        if known.input_fingerprint != call.input_fingerprint:
            raise RequestKeyConflictError("the key was used with another input")
        return ChildRun(request_key=call.request_key, run_id="run-1", state="queued")

    def ensure_effect(self, call: ManagedEffectCall) -> ManagedEffect:
        self.effects.append(call)
        return ManagedEffect(call.key, call.kind, "applied", call.apply(call.key, call.request))


def test_services_check_the_call_then_hand_it_to_the_host() -> None:
    host = _Host()
    ctx = ReconcileContext(resource(), deadline=time.monotonic() + 60, workflows=host, effects=host)
    run = ctx.workflows.ensure(request_key="summary/3/a.md", workflow="summarise", input={"f": 1})
    assert run == ChildRun("summary/3/a.md", "run-1", "queued")
    assert not run.finished
    again = ctx.workflows.ensure(request_key="summary/3/a.md", workflow="summarise", input={"f": 1})
    assert again.run_id == "run-1"
    with pytest.raises(RequestKeyConflictError):
        ctx.workflows.ensure(request_key="summary/3/a.md", workflow="summarise", input={"f": 2})
    effect = ctx.effects.ensure(
        key="note/1",
        kind="notes.write",
        request={"n": 1},
        observe=_observe,
        apply=lambda key, request: {"wrote": key},
    )
    assert effect.result == {"wrote": "note/1"}
    assert host.effects[0].request_fingerprint.startswith("sha256:")


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"request_key": "", "workflow": "w", "input": {}}, "request_key must be"),
        ({"request_key": "k k", "workflow": "w", "input": {}}, "request_key must be"),
        ({"request_key": "k", "workflow": "", "input": {}}, "workflow must be"),
        ({"request_key": "k", "workflow": "w", "input": {1}}, "input is not plain JSON"),
    ],
)
def test_workflows_ensure_checks_its_arguments(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(ReconcileResultError, match=problem):
        context().workflows.ensure(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"key": "/x"}, "key must be"),
        ({"kind": "Upper"}, "kind 'Upper' must be lowercase"),
        ({"observe": None}, "observe and apply must be functions"),
        ({"request": math.inf}, "request is not plain JSON"),
    ],
)
def test_effects_ensure_checks_its_arguments(kwargs: dict[str, Any], problem: str) -> None:
    call: dict[str, Any] = {
        "key": "k",
        "kind": "notes.write",
        "request": {},
        "observe": _observe,
        "apply": _observe,
    }
    with pytest.raises(ReconcileResultError, match=problem):
        context().effects.ensure(**{**call, **kwargs})
