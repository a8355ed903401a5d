"""Routing: plain edges, switches stringified like JavaScript, `$result.outcome`, defaults."""

from __future__ import annotations

from typing import Any

import pytest

from pi_workflows import compute, define_workflow, include_workflow
from pi_workflows.engine import (
    RoutingError,
    WorkflowDefinition,
    compile_workflow,
    js_string,
    next_node,
)


def _node(ctx: Any) -> Any:
    return {}


def switching(
    on: str, cases: dict[Any, str], default: str | None = None, extra_nodes: tuple[str, ...] = ()
) -> WorkflowDefinition:
    targets = sorted({*cases.values(), *([default] if default else []), *extra_nodes})
    switch: dict[str, Any] = {"on": on, "cases": cases}
    if default is not None:
        switch["default"] = default
    return define_workflow(
        name="r",
        start_at="a",
        nodes={"a": compute(_node), **{t: compute(_node) for t in targets}},
        edges=[{"from": "a", "switch": switch}],
    )


def test_plain_edges() -> None:
    wf = define_workflow(
        name="p",
        start_at="a",
        nodes={"a": compute(_node), "b": compute(_node)},
        edges=[{"from": "a", "to": "b"}],
    )
    assert next_node(wf, "a", {"anything": 1}, "completed") == "b"
    assert next_node(wf, "b", None, "completed") is None  # terminal: the run completes
    assert next_node(wf, "a", None, "failed") is None  # a failure ends the run
    assert next_node(wf, "a", None, "timed_out") is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, "true"),
        (False, "false"),
        (1, "1"),
        (0, "0"),
        (-7, "-7"),
        (1.0, "1"),
        (1.5, "1.5"),
        (-0.0, "0"),
        (0.1, "0.1"),
        (1e21, "1e+21"),
        (1e-7, "1e-7"),
        (123456789012345680000.0, "123456789012345680000"),
        (None, "null"),
        ("x", "x"),
        ("", ""),
    ],
)
def test_js_string(value: Any, expected: str) -> None:
    assert js_string(value) == expected


@pytest.mark.parametrize(
    ("value", "target"),
    [
        (True, "yes"),
        (False, "no"),
        (1, "one"),
        (1.0, "one"),
        (1.5, "onehalf"),
        (None, "nothing"),
        ("true", "yes"),  # the string "true" and the bool read the same in JavaScript
        ("word", "wordy"),
    ],
)
def test_switch_on_output_field_stringifies_like_javascript(value: Any, target: str) -> None:
    wf = switching(
        "$.k",
        {True: "yes", "false": "no", "1": "one", 1.5: "onehalf", None: "nothing", "word": "wordy"},
    )
    assert next_node(wf, "a", {"k": value}, "completed") == target


def test_dotted_paths_output_prefix_and_list_index() -> None:
    wf = switching("$.a.b", {"x": "hit"})
    assert next_node(wf, "a", {"a": {"b": "x"}}, "completed") == "hit"
    wf = switching("$output.a", {"x": "hit"})
    assert next_node(wf, "a", {"a": "x"}, "completed") == "hit"
    wf = switching("$.items.1", {"x": "hit"})
    assert next_node(wf, "a", {"items": ["y", "x"]}, "completed") == "hit"


def test_default_for_unmatched_and_missing_values() -> None:
    wf = switching("$.k", {"x": "hit"}, default="other")
    assert next_node(wf, "a", {"k": "y"}, "completed") == "other"
    assert next_node(wf, "a", {}, "completed") == "other"
    assert next_node(wf, "a", "not an object", "completed") == "other"


@pytest.mark.parametrize("output", [{"k": "y"}, {}, {"k": 2}])
def test_unmatched_switch_without_default_is_a_routing_error(output: Any) -> None:
    wf = switching("$.k", {"x": "hit"})
    with pytest.raises(RoutingError) as caught:
        next_node(wf, "a", output, "completed")
    assert caught.value.node == "a"
    assert "no default" in str(caught.value)
    assert "'$.k'" in str(caught.value)


@pytest.mark.parametrize("value", [{"x": 1}, [1, 2]])
def test_non_scalar_switch_value_is_a_routing_error(value: Any) -> None:
    wf = switching("$.k", {"x": "hit"}, default="other")
    with pytest.raises(RoutingError, match="not a string, number, bool or null"):
        next_node(wf, "a", {"k": value}, "completed")


def test_result_outcome_switch() -> None:
    wf = switching("$result.outcome", {"completed": "ok", "failed": "fix", "timed_out": "slow"})
    assert next_node(wf, "a", {"k": 1}, "completed") == "ok"
    assert next_node(wf, "a", None, "failed") == "fix"
    assert next_node(wf, "a", None, "timed_out") == "slow"
    assert next_node(wf, "a", None, "cancelled") is None  # cancellation is never routed


def test_result_outcome_without_a_case_or_default() -> None:
    wf = switching("$result.outcome", {"failed": "fix"}, extra_nodes=())
    with pytest.raises(RoutingError, match="'completed'"):
        next_node(wf, "a", {}, "completed")
    wf = switching("$result.outcome", {"failed": "fix"}, default="after")
    assert next_node(wf, "a", {}, "completed") == "after"
    assert next_node(wf, "a", {}, "timed_out") == "after"


def test_output_switch_does_not_route_failures() -> None:
    wf = switching("$.k", {"x": "hit"}, default="other")
    assert next_node(wf, "a", None, "failed") is None


def test_unknown_outcome_is_refused() -> None:
    wf = switching("$.k", {"x": "hit"})
    with pytest.raises(ValueError, match="unknown outcome"):
        next_node(wf, "a", {}, "ok")


def test_routing_through_a_compiled_include() -> None:
    child = define_workflow(
        name="child",
        start_at="check",
        nodes={"check": compute(_node), "good": compute(_node), "bad": compute(_node)},
        edges=[{"from": "check", "switch": {"on": "$.ok", "cases": {True: "good", False: "bad"}}}],
        exits={"passed": {"from": "good"}, "rejected": {"from": "bad"}},
    )
    parent = define_workflow(
        name="parent",
        start_at="prep",
        nodes={"prep": compute(_node), "ship": compute(_node), "stop": compute(_node)},
        includes={"review": include_workflow(child)},
        edges=[
            {"from": "prep", "to": "review"},
            {"from": "review.passed", "to": "ship"},
            {"from": "review.rejected", "to": "stop"},
        ],
    )
    compiled = compile_workflow(parent)
    assert compiled.start_at == "prep"
    path = ["prep"]
    outputs = {"review/check": {"ok": False}}
    while (current := path[-1]) is not None:
        nxt = next_node(compiled, current, outputs.get(current, {}), "completed")
        if nxt is None:
            break
        path.append(nxt)
    assert path == [
        "prep",
        "review",
        "review/check",
        "review/bad",
        "review/__piw_exit_rejected",
        "stop",
    ]
