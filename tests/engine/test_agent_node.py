"""The `agent` node: definition-time checks and its snapshot (no prompt in it)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from pi_workflows import agent, define_workflow
from pi_workflows.engine import DEFAULT_AGENT_TIMEOUT, AgentNode, WorkflowDefinitionError
from pi_workflows.engine._compile import definition_snapshot

SCHEMA = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}}


def test_agent_keeps_its_options_and_defaults() -> None:
    node = agent(
        prompt="Summarise the repo",
        output_schema=SCHEMA,
        tools=["read", "bash"],
        model="fake-model",
        provider="fake",
        thinking="low",
    )
    assert isinstance(node, AgentNode)
    assert node.output_schema == SCHEMA
    assert node.tools == ("read", "bash")
    assert (node.model, node.provider, node.thinking) == ("fake-model", "fake", "low")
    assert node.timeout_ms == round(DEFAULT_AGENT_TIMEOUT * 1000)
    assert agent(prompt=lambda ctx: "x", timeout=math.inf).timeout_ms is None


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"prompt": "  "}, "prompt must be non-empty"),
        ({"prompt": 3}, "prompt must be non-empty"),
        ({"prompt": "p", "output_schema": {"type": "nope"}}, "output_schema is not a valid"),
        ({"prompt": "p", "output_schema": "x"}, "output_schema must be a JSON Schema"),
        ({"prompt": "p", "validate": "no"}, "validate must be a function"),
        ({"prompt": "p", "tools": "bash"}, "tools must be a list"),
        ({"prompt": "p", "tools": ["workflow"]}, "is not a Pi tool name"),
        ({"prompt": "p", "tools": ["bash", "bash"]}, "twice"),
        ({"prompt": "p", "thinking": "max"}, "thinking must be one of"),
        ({"prompt": "p", "model": ""}, "model must be a non-empty name"),
        ({"prompt": "p", "timeout": -1}, "timeout must be positive"),
    ],
)
def test_agent_rejects_bad_options_with_the_fix(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=fragment):
        agent(**kwargs)


def test_the_snapshot_has_the_contract_but_never_the_prompt() -> None:
    wf = define_workflow(
        name="ask",
        nodes={"ask": agent(prompt="SECRET-PROMPT", output_schema=SCHEMA, validate=lambda o, c: o)},
        start_at="ask",
    )
    snap = definition_snapshot(wf)["nodes"]["ask"]
    assert snap["kind"] == "agent"
    assert snap["outputSchema"] == SCHEMA and snap["validate"] is True
    assert "SECRET-PROMPT" not in repr(definition_snapshot(wf))
