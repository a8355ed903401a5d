"""The `assistant_message` node: definition-time checks and its snapshot.

An assistant-message step is an agent step whose output is the model's visible reply:
it takes no `output_schema` or `validate`, it is marked `visible` in the snapshot (so a
headless start is refused), and its prompt is never stored.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from pi_workflows import assistant_message, compute, define_workflow
from pi_workflows.domain._operations import origin_session_steps
from pi_workflows.engine import DEFAULT_AGENT_TIMEOUT, AgentNode, WorkflowDefinitionError
from pi_workflows.engine._compile import definition_snapshot


def test_it_is_a_visible_agent_step_with_its_bound_and_defaults() -> None:
    node = assistant_message("Plan the release", max_chars=2000)
    assert isinstance(node, AgentNode)
    assert node.visible and node.max_chars == 2000
    assert node.validate is None and node.output_schema is None and node.tools is None
    assert node.timeout_ms == round(DEFAULT_AGENT_TIMEOUT * 1000)
    unbounded = assistant_message(lambda ctx: "x", timeout=math.inf)
    assert unbounded.max_chars is None and unbounded.timeout_ms is None


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"prompt": "  "}, "prompt must be non-empty"),
        ({"prompt": 3}, "prompt must be non-empty"),
        ({"prompt": "p", "max_chars": 0}, "max_chars must be a positive integer"),
        ({"prompt": "p", "max_chars": -5}, "max_chars must be a positive integer"),
        ({"prompt": "p", "max_chars": True}, "max_chars must be a positive integer"),
        ({"prompt": "p", "max_chars": 1.5}, "max_chars must be a positive integer"),
        ({"prompt": "p", "max_chars": 10**7}, "max_chars must be a positive integer"),
        ({"prompt": "p", "timeout": -1}, "timeout must be positive"),
        ({"prompt": "p", "output_schema": {"type": "object"}}, "takes no output_schema"),
        ({"prompt": "p", "validate": lambda o, c: o}, "takes no output_schema or validate"),
    ],
)
def test_it_rejects_bad_options_with_the_fix(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=fragment):
        assistant_message(**kwargs)


def test_define_workflow_refuses_a_visible_step_given_a_check_naming_the_node() -> None:
    checked = dataclasses.replace(assistant_message("p"), validate=lambda o, c: o)
    with pytest.raises(WorkflowDefinitionError, match="is an assistant_message step") as caught:
        define_workflow(name="plan", start_at="plan", nodes={"plan": checked})
    assert caught.value.node == "plan"


def test_the_snapshot_marks_it_visible_with_its_bound_and_never_the_prompt() -> None:
    wf = define_workflow(
        name="plan",
        start_at="prep",
        nodes={
            "prep": compute(lambda ctx: {}),
            "plan": assistant_message("SECRET-PROMPT", max_chars=300),
            "free": assistant_message(lambda ctx: "tell me"),
        },
        edges=[{"from": "prep", "to": "plan"}, {"from": "plan", "to": "free"}],
    )
    snapshot = definition_snapshot(wf)
    plan = snapshot["nodes"]["plan"]
    assert plan["kind"] == "agent" and plan["visible"] is True and plan["maxChars"] == 300
    assert plan["validate"] is False and "outputSchema" not in plan
    assert "maxChars" not in snapshot["nodes"]["free"]
    assert "SECRET-PROMPT" not in repr(snapshot)
    assert origin_session_steps(snapshot) == ["free", "plan"]
