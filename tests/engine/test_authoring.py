"""The authoring API: the issue's example defines, every graph rule names its node,
definitions are frozen."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from pi_workflows import (
    action,
    checkpoint,
    compute,
    define_workflow,
    include_workflow,
    notify,
    shell,
)
from pi_workflows.engine import (
    ActionNode,
    CheckpointNode,
    ComputeNode,
    NotifyNode,
    ShellNode,
    WorkflowDefinition,
    WorkflowDefinitionError,
    compile_workflow,
    definition_snapshot,
)
from pi_workflows.errors import PiWorkflowsError


def double(ctx: Any) -> Any:
    return {"n": ctx.input["n"] * 2}


def charge(ctx: Any) -> Any:
    return ctx.effect(
        "payment.charge",
        {"amount": ctx.outputs["double"]["n"]},
        apply=lambda key, req: {"charged": req["amount"]},
        read_back=None,
    )


def example() -> WorkflowDefinition:
    return define_workflow(
        name="example",
        start_at="double",
        nodes={
            "double": compute(double),
            "build": shell(lambda ctx: ["make", "all"], timeout=600),
            "charge": action(charge),
            "approve": checkpoint(summary="Ship it?"),
            "done": notify(lambda ctx: f"charged {ctx.outputs['charge']['charged']}"),
        },
        edges=[
            {"from": "double", "to": "build"},
            {"from": "build", "to": "charge"},
            {"from": "charge", "to": "approve"},
            {"from": "approve", "to": "done"},
        ],
    )


def test_the_issue_example_defines() -> None:
    wf = example()
    assert wf.name == "example"
    assert wf.start_at == "double"
    assert [type(n) for n in wf.nodes.values()] == [
        ComputeNode,
        ShellNode,
        ActionNode,
        CheckpointNode,
        NotifyNode,
    ]
    assert [n.kind for n in wf.nodes.values()] == [
        "compute",
        "shell",
        "action",
        "checkpoint",
        "notify",
    ]
    assert wf.max_steps == 100
    assert wf.nodes["build"].timeout_ms == 600_000
    assert wf.nodes["double"].timeout_ms == 900_000  # the engine default, 15 minutes
    assert wf.outgoing["double"].target == "build"
    assert "done" not in wf.outgoing
    assert wf.source_path == __file__


def test_durations_are_seconds_and_inf_means_no_deadline() -> None:
    assert compute(double, timeout=1.5).timeout_ms == 1500
    assert compute(double, timeout=math.inf).timeout_ms is None
    assert shell(lambda ctx: ["true"], timeout=None).timeout_ms == 600_000
    assert checkpoint().timeout_ms is None


@pytest.mark.parametrize(
    "make",
    [
        lambda: compute(3),  # type: ignore[arg-type]
        lambda: compute(double, timeout=0),
        lambda: compute(double, timeout=-1),
        lambda: compute(double, timeout=True),
        lambda: action(double, timeout="5"),  # type: ignore[arg-type]
        lambda: shell("make"),  # type: ignore[arg-type]
        lambda: shell(lambda ctx: ["x"], max_output_bytes=0),
        lambda: checkpoint(summary=""),
        lambda: checkpoint(input_schema={"type": "nope"}),
        lambda: notify(""),
        lambda: notify("x", kind="loud"),  # type: ignore[arg-type]
        lambda: include_workflow(""),
        lambda: include_workflow(42),  # type: ignore[arg-type]
    ],
)
def test_constructors_validate_eagerly(make: Any) -> None:
    with pytest.raises(WorkflowDefinitionError):
        make()


def test_definitions_are_frozen() -> None:
    wf = example()
    with pytest.raises(dataclasses.FrozenInstanceError):
        wf.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        wf.nodes["x"] = compute(double)  # type: ignore[index]
    with pytest.raises(TypeError):
        wf.outgoing["done"] = wf.edges[0]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        wf.nodes["double"].fn = double  # type: ignore[misc, union-attr]
    edge = wf.edges[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        edge.target = "approve"  # type: ignore[misc]
    assert isinstance(wf.edges, tuple)


def test_input_schema_is_a_copy() -> None:
    wf = define_workflow(
        name="s",
        start_at="a",
        nodes={"a": compute(double)},
        input_schema={"type": "object"},
    )
    wf.input_schema["type"] = "string"
    assert wf.input_schema == {"type": "object"}


def _node(ctx: Any) -> Any:
    return {}


def _child_with_exit() -> WorkflowDefinition:
    return define_workflow(
        name="child",
        start_at="x",
        nodes={"x": compute(_node)},
        exits={"done": {"from": "x"}},
    )


# Each case: (keyword overrides for define_workflow, the node the error must name, a phrase).
_BASE: dict[str, Any] = {
    "name": "t",
    "start_at": "a",
    "nodes": {"a": compute(_node), "b": compute(_node)},
    "edges": [{"from": "a", "to": "b"}],
}
_C = compute(_node)
RULES: list[tuple[str, dict[str, Any], str, str]] = [
    ("unknown target", {"edges": [{"from": "a", "to": "zzz"}]}, "a", "unknown target 'zzz'"),
    (
        "unknown switch target",
        {"edges": [{"from": "a", "switch": {"on": "$.k", "cases": {"x": "b", "y": "nope"}}}]},
        "a",
        "unknown target 'nope'",
    ),
    (
        "unknown default target",
        {"edges": [{"from": "a", "switch": {"on": "$.k", "cases": {"x": "b"}, "default": "q"}}]},
        "a",
        "unknown target 'q'",
    ),
    (
        "unknown source",
        {"edges": [{"from": "a", "to": "b"}, {"from": "ghost", "to": "b"}]},
        "ghost",
        "not a node",
    ),
    ("unreachable node", {"edges": []}, "b", "unreachable"),
    ("reserved $ name", {"nodes": {"a": _C, "$b": _C}}, "$b", "reserved for switch selectors"),
    ("reserved / name", {"nodes": {"a": _C, "b/c": _C}}, "b/c", "'/'"),
    ("reserved . name", {"nodes": {"a": _C, "b.c": _C}}, "b.c", "'mount.exit'"),
    ("reserved __piw_ prefix", {"nodes": {"a": _C, "__piw_x": _C}}, "__piw_x", "reserved"),
    ("id starts with a digit", {"nodes": {"a": _C, "1b": _C}}, "1b", "not a valid node id"),
    ("id with a space", {"nodes": {"a": _C, "b c": _C}}, "b c", "not a valid node id"),
    ("id too long", {"nodes": {"a": _C, "b" * 65: _C}}, "b" * 65, "at most 64"),
    (
        "two outgoing edges",
        {"edges": [{"from": "a", "to": "b"}, {"from": "a", "to": "b"}]},
        "a",
        "more than one outgoing edge",
    ),
    (
        "unsupported selector $result.error",
        {"edges": [{"from": "a", "switch": {"on": "$result.error", "cases": {"x": "b"}}}]},
        "a",
        "not supported",
    ),
    (
        "selector without $",
        {"edges": [{"from": "a", "switch": {"on": "field", "cases": {"x": "b"}}}]},
        "a",
        "not supported",
    ),
    (
        "empty path",
        {"edges": [{"from": "a", "switch": {"on": "$.", "cases": {"x": "b"}}}]},
        "a",
        "not supported",
    ),
    (
        "empty cases",
        {"edges": [{"from": "a", "switch": {"on": "$.k", "cases": {}}}]},
        "a",
        "non-empty 'cases'",
    ),
    (
        "cases that read the same in JavaScript",
        {"edges": [{"from": "a", "switch": {"on": "$.k", "cases": {True: "b", "true": "b"}}}]},
        "a",
        "'true'",
    ),
    (
        "both to and switch",
        {"edges": [{"from": "a", "to": "b", "switch": {"on": "$.k", "cases": {"x": "b"}}}]},
        "a",
        "exactly one of",
    ),
    ("unknown edge key", {"edges": [{"from": "a", "to": "b", "when": 1}]}, "a", "unknown keys"),
    ("start_at unknown", {"start_at": "nope"}, "nope", "start_at"),
    ("not a node", {"nodes": {"a": _C, "b": _node}}, "b", "wrap it with compute"),
    (
        "mount name is a node id",
        {"includes": {"a": include_workflow("child")}},
        "a",
        "both a node id and an include mount",
    ),
    (
        "edge from a mount without an exit",
        {
            "includes": {"m": include_workflow("child")},
            "edges": [{"from": "a", "to": "m"}, {"from": "m", "to": "b"}],
        },
        "m",
        "'m.<exit>'",
    ),
    (
        "edge from an exit the child lacks",
        {
            "includes": {"m": include_workflow(_child_with_exit())},
            "edges": [{"from": "a", "to": "m"}, {"from": "m.nope", "to": "b"}],
        },
        "m.nope",
        "has exits ['done']",
    ),
    (
        "exit from a node with an edge",
        {"exits": {"done": {"from": "a"}}},
        "a",
        "terminal node",
    ),
    (
        "exit from an unknown node",
        {"exits": {"done": {"from": "ghost"}}},
        "ghost",
        "not a node",
    ),
    (
        "two exits from one node",
        {"exits": {"one": {"from": "b"}, "two": {"from": "b"}}},
        "b",
        "same node",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "node", "phrase"),
    [pytest.param(o, n, p, id=i) for i, o, n, p in RULES],
)
def test_each_graph_rule_names_the_node(overrides: dict[str, Any], node: str, phrase: str) -> None:
    with pytest.raises(WorkflowDefinitionError) as caught:
        define_workflow(**{**_BASE, **overrides})
    error = caught.value
    assert error.node == node
    assert error.workflow == "t"
    assert repr(node) in str(error)
    assert phrase in str(error)
    assert isinstance(error, PiWorkflowsError)


@pytest.mark.parametrize(
    "overrides",
    [
        {"name": "has space"},
        {"name": ""},
        {"nodes": {}},
        {"max_steps": 0},
        {"max_steps": True},
        {"input_schema": {"type": 5}},
        {"input": "not callable"},
        {"edges": "a->b"},
    ],
)
def test_workflow_level_rules(overrides: dict[str, Any]) -> None:
    with pytest.raises(WorkflowDefinitionError):
        define_workflow(**{**_BASE, **overrides})


def test_cycles_and_switch_reachability_are_allowed() -> None:
    wf = define_workflow(
        name="loop",
        start_at="a",
        nodes={"a": compute(_node), "b": compute(_node), "c": compute(_node)},
        edges=[
            {"from": "a", "switch": {"on": "$.again", "cases": {True: "a", False: "b"}}},
            {
                "from": "b",
                "switch": {"on": "$result.outcome", "cases": {"failed": "a"}, "default": "c"},
            },
        ],
        max_steps=7,
    )
    assert dict(wf.outgoing["a"].switch.cases) == {"true": "a", "false": "b"}  # type: ignore[union-attr]
    assert wf.max_steps == 7


def test_direct_include_compiles_to_mount_paths() -> None:
    parent = define_workflow(
        name="parent",
        start_at="a",
        nodes={"a": compute(_node), "b": compute(_node)},
        includes={"m": include_workflow(_child_with_exit(), input=lambda ctx: {"x": 1})},
        edges=[{"from": "a", "to": "m"}, {"from": "m.done", "to": "b"}],
    )
    compiled = compile_workflow(parent)
    assert set(compiled.nodes) == {"a", "b", "m", "m/x", "m/__piw_exit_done"}
    assert compiled.outgoing["a"].target == "m"
    assert compiled.outgoing["m"].target == "m/x"
    assert compiled.outgoing["m/x"].target == "m/__piw_exit_done"
    assert compiled.outgoing["m/__piw_exit_done"].target == "b"
    assert compiled.nodes["m"].include_transition == "entry"
    assert compiled.nodes["m/x"].mount_path == ("m",)
    snap = definition_snapshot(parent)
    assert snap["mounts"]["m"]["exits"] == {"done": "m/__piw_exit_done"}
    assert snap["nodes"]["m/x"]["localNodeId"] == "x"


def test_included_child_needs_exits() -> None:
    child = define_workflow(name="child", start_at="x", nodes={"x": compute(_node)})
    parent = define_workflow(
        name="parent",
        start_at="a",
        nodes={"a": compute(_node)},
        includes={"m": include_workflow(child)},
        edges=[{"from": "a", "to": "m"}],
    )
    with pytest.raises(WorkflowDefinitionError, match="declares no exits") as caught:
        compile_workflow(parent)
    assert caught.value.node == "m"


def test_every_terminal_node_of_an_included_child_is_an_exit() -> None:
    child = define_workflow(
        name="child",
        start_at="x",
        nodes={"x": compute(_node), "y": compute(_node), "z": compute(_node)},
        edges=[{"from": "x", "switch": {"on": "$.k", "cases": {"1": "y"}, "default": "z"}}],
        exits={"done": {"from": "y"}},
    )
    parent = define_workflow(
        name="parent",
        start_at="m",
        nodes={"a": compute(_node)},
        includes={"m": include_workflow(child)},
        edges=[{"from": "m.done", "to": "a"}],
    )
    with pytest.raises(WorkflowDefinitionError, match="no exit leaves from it") as caught:
        compile_workflow(parent)
    assert caught.value.node == "z"
    assert caught.value.workflow == "child"
