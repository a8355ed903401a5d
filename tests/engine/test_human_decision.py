"""`human_decision(...)`: checked when the workflow is defined, snapshotted for the server.

The default answer of `on_timeout` is validated against the choices (or the answer
schema) here, with an error naming the problem, so a bad default never reaches a run.
The snapshot carries what the server needs to present and check answers without
workflow code: `protected`, audience, choices, answer schema and the timeout default.
"""

from __future__ import annotations

from typing import Any

import pytest

from pi_workflows import choice, compute, define_workflow, human_decision
from pi_workflows.engine import WorkflowDefinitionError, definition_snapshot

CHOICES: dict[str, Any] = {
    "approve": "Approve",
    "reject": choice("Reject", input="reason", max_length=200),
}


def _workflow(node: Any, edges: list[dict[str, Any]] | None = None) -> Any:
    return define_workflow(
        name="d",
        start_at="ask",
        nodes={"ask": node, "yes": compute(lambda c: 1), "no": compute(lambda c: 2)},
        edges=edges
        if edges is not None
        else [
            {
                "from": "ask",
                "switch": {"on": "$.choice", "cases": {"approve": "yes", "reject": "no"}},
            }
        ],
    )


def test_the_snapshot_marks_the_node_protected_with_its_choices_and_default() -> None:
    node = human_decision(
        "Ship it?",
        choices=CHOICES,
        on_timeout=(90, {"choice": "approve"}),
        audience="release-managers",
    )
    snap = definition_snapshot(_workflow(node))["nodes"]["ask"]
    assert snap["kind"] == "checkpoint"
    assert snap["protected"] is True
    assert snap["audience"] == "release-managers"
    assert snap["summary"] == "Ship it?"
    assert snap["choices"] == [
        {"id": "approve", "label": "Approve"},
        {
            "id": "reject",
            "label": "Reject",
            "input": {"name": "reason", "prompt": "Reject", "minLength": 1, "maxLength": 200},
        },
    ]
    assert snap["onTimeout"] == {"afterMs": 90_000, "defaultAnswer": {"choice": "approve"}}
    assert "answerSchema" not in snap


def test_a_schema_decision_snapshots_its_schema_and_no_choices() -> None:
    schema = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}
    node = human_decision("Go?", answer_schema=schema, on_timeout=(5, {"ok": False}))
    workflow = define_workflow(name="d", start_at="ask", nodes={"ask": node})
    snap = definition_snapshot(workflow)["nodes"]["ask"]
    assert snap["answerSchema"] == schema and "choices" not in snap
    assert snap["audience"] == "operator"


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        (
            {"on_timeout": (60, {"choice": "ship"})},
            "the on_timeout default answer cannot answer it at /choice: the choice is not "
            "one of the decision's choices: approve, reject",
        ),
        (
            {"on_timeout": (60, {"choice": "reject"})},
            'at /input: choice reject needs "input": {"reason": text}',
        ),
        (
            {"on_timeout": (60, {"choice": "reject", "input": {"reason": "x" * 201}})},
            "input reason must be 1 to 200 characters",
        ),
        ({"on_timeout": (60, {"choice": "approve", "extra": 1})}, "keys it may not have: extra"),
        ({"on_timeout": (0, {"choice": "approve"})}, "timeout must be positive seconds"),
        ({"on_timeout": (float("inf"), {"choice": "approve"})}, "needs finite seconds"),
        ({"on_timeout": 60}, "on_timeout must be (seconds, default_answer)"),
        ({"on_timeout": (60, {"choice": {1, 2}})}, "is not plain JSON"),
        ({"audience": "checkpoint"}, "not 'checkpoint'"),
        ({"audience": "two words"}, "must be a name like 'operator'"),
    ],
)
def test_a_bad_option_is_refused_when_the_node_is_made(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        human_decision("Ship it?", choices=CHOICES, **kwargs)
    assert says in str(refused.value)


def test_a_schema_default_is_checked_against_the_schema() -> None:
    schema = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}
    with pytest.raises(WorkflowDefinitionError) as refused:
        human_decision("Go?", answer_schema=schema, on_timeout=(5, {"ok": "no"}))
    assert "at /ok" in str(refused.value) and "must be boolean" in str(refused.value)


@pytest.mark.parametrize(
    ("summary", "choices", "says"),
    [
        ("", CHOICES, "summary must be non-empty text"),
        ("bell\x07", CHOICES, "summary must be non-empty text"),
        ("Go?", {}, "choices must be a non-empty dict"),
        ("Go?", {"1st": "First"}, "choice id '1st' must be letters"),
        ("Go?", {"a": "Same", "b": "Same"}, "two choices have the same label"),
        ("Go?", {f"c{i}": f"C{i}" for i in range(17)}, "at most 16 choices"),
        ("Go?", {"a": 3}, "must be a label or choice(label, ...)"),
        ("Go?", {"a": "x" * 65}, "the label is 65 characters long"),
    ],
)
def test_bad_summaries_and_choices_are_refused(summary: str, choices: Any, says: str) -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        human_decision(summary, choices=choices)
    assert says in str(refused.value)


def test_choices_or_an_answer_schema_exactly_one() -> None:
    with pytest.raises(WorkflowDefinitionError, match="one of them"):
        human_decision("Go?")
    with pytest.raises(WorkflowDefinitionError, match="one of them"):
        human_decision("Go?", choices=CHOICES, answer_schema={"type": "object"})


def test_a_switch_on_the_choice_may_name_only_the_decisions_choices() -> None:
    node = human_decision("Ship it?", choices=CHOICES)
    with pytest.raises(WorkflowDefinitionError) as refused:
        _workflow(
            node,
            edges=[{"from": "ask", "switch": {"on": "$.choice", "cases": {"ship": "yes"}}}],
        )
    assert "cases ['ship'] that are not its choices ['approve', 'reject']" in str(refused.value)


def test_choice_options_need_an_input_name() -> None:
    with pytest.raises(WorkflowDefinitionError, match="need input=NAME"):
        choice("Reject", prompt="Why?")
    with pytest.raises(WorkflowDefinitionError, match="min_length <= max_length"):
        choice("Reject", input="reason", min_length=10, max_length=5)
