"""Compiled node paths and effect idempotency keys; the context that derives them."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from pi_workflows import define_workflow, shell
from pi_workflows.engine import (
    NOT_APPLIED,
    EffectCall,
    EffectKeyConflictError,
    EngineContext,
    WorkflowDefinitionError,
    compiled_node_path,
    definition_snapshot,
    effect_idempotency_key,
)
from pi_workflows.wire.canonical import dumps


def test_compiled_node_path() -> None:
    assert compiled_node_path([], "a") == "a"
    assert compiled_node_path(["child"], "x") == "child/x"
    assert compiled_node_path(("m", "n"), "x") == "m/n/x"
    with pytest.raises(ValueError, match="non-empty"):
        compiled_node_path(["", "n"], "x")


def test_key_is_the_documented_digest() -> None:
    key = effect_idempotency_key("run-1", "payment.charge", "child/charge", 1)
    expected = dumps(
        {
            "schema": "pi-workflows.effect-key.v1",
            "runId": "run-1",
            "effectType": "payment.charge",
            "nodePath": "child/charge",
            "visit": 1,
        }
    )
    assert key == "sha256:" + hashlib.sha256(expected).hexdigest()


def test_same_inputs_same_key_and_each_part_matters() -> None:
    base = effect_idempotency_key("run-1", "payment.charge", "charge", 1)
    assert effect_idempotency_key("run-1", "payment.charge", "charge", 1) == base  # crash rerun
    others = {
        effect_idempotency_key("run-1", "payment.charge", "charge", 2),  # loop revisit
        effect_idempotency_key("run-1", "payment.charge", "a/charge", 1),  # another mount
        effect_idempotency_key("run-1", "payment.charge", "b/charge", 1),
        effect_idempotency_key("run-2", "payment.charge", "charge", 1),
        effect_idempotency_key("run-1", "payment.refund", "charge", 1),
    }
    assert base not in others
    assert len(others) == 5


@pytest.mark.parametrize(
    "args",
    [
        ("", "t", "n", 1),
        ("r", "", "n", 1),
        ("r", "t", "", 1),
        ("r", "t", "n", 0),
        ("r", "t", "n", True),
    ],
)
def test_key_parts_are_checked(args: tuple[Any, ...]) -> None:
    with pytest.raises(ValueError, match="must"):
        effect_idempotency_key(*args)


class RecordingHost:
    def __init__(self) -> None:
        self.calls: list[EffectCall] = []

    def run_effect(self, call: EffectCall) -> Any:
        self.calls.append(call)
        return call.apply(call.key, call.request)


def test_context_effect_derives_the_key_and_calls_the_host() -> None:
    host = RecordingHost()
    ctx = EngineContext(
        input={"n": 2},
        outputs={"double": {"n": 4}},
        run_id="run-1",
        node_path="m/charge",
        visit=3,
        effects=host,
    )
    result = ctx.effect(
        "payment.charge",
        {"amount": ctx.outputs["double"]["n"]},
        apply=lambda key, req: {"charged": req["amount"], "key": key},
    )
    (call,) = host.calls
    assert call.key == effect_idempotency_key("run-1", "payment.charge", "m/charge", 3)
    assert result == {"charged": 4, "key": call.key}
    assert call.request_fingerprint.startswith("sha256:")
    assert call.read_back is None
    with pytest.raises(EffectKeyConflictError):
        ctx.effect("payment.charge", {"amount": 1}, apply=lambda k, r: None)
    ctx.effect("payment.receipt", {"amount": 1}, apply=lambda k, r: None)
    assert len(host.calls) == 2


def test_context_effect_refusals() -> None:
    ctx = EngineContext(input=None, run_id="r", node_path="a", effects=RecordingHost())
    with pytest.raises(ValueError, match="effect type"):
        ctx.effect("Bad Type", {}, apply=lambda k, r: None)
    with pytest.raises(ValueError, match="not plain JSON"):
        ctx.effect("x.y", {"f": float("nan")}, apply=lambda k, r: None)
    plain = EngineContext(input=None, run_id="r", node_path="a")
    with pytest.raises(ValueError, match="action nodes only"):
        plain.effect("x.y", {}, apply=lambda k, r: None)


def test_context_views_are_read_only() -> None:
    outputs = {"a": 1}
    ctx = EngineContext(input=None, outputs=outputs)
    outputs["b"] = 2
    assert dict(ctx.outputs) == {"a": 1}
    with pytest.raises(TypeError):
        ctx.outputs["c"] = 3  # type: ignore[index]
    assert repr(NOT_APPLIED) == "NOT_APPLIED"


def test_context_effect_carries_the_idempotent_declaration() -> None:
    host = RecordingHost()
    ctx = EngineContext(input=None, run_id="r", node_path="a", effects=host)
    ctx.effect("x.y", {}, apply=lambda k, r: None, idempotent=True)
    ctx.effect("x.z", {}, apply=lambda k, r: None)
    assert [call.idempotent for call in host.calls] == [True, False]
    with pytest.raises(ValueError, match="not both"):
        ctx.effect("x.w", {}, apply=lambda k, r: None, idempotent=True, read_back=lambda k, r: 1)
    with pytest.raises(TypeError, match="True or False"):
        ctx.effect("x.v", {}, apply=lambda k, r: None, idempotent="yes")  # type: ignore[arg-type]


def test_shell_idempotent_and_read_back_options() -> None:
    def argv(ctx: Any) -> list[str]:
        return ["true"]

    plain = shell(argv)
    assert (plain.idempotent, plain.read_back) == (False, None)
    assert shell(argv, idempotent=True).idempotent
    with pytest.raises(WorkflowDefinitionError, match="not both"):
        shell(argv, idempotent=True, read_back=lambda k, r: None)
    with pytest.raises(WorkflowDefinitionError, match="read_back must be a function"):
        shell(argv, read_back="yes")  # type: ignore[arg-type]
    with pytest.raises(WorkflowDefinitionError, match="True or False"):
        shell(argv, idempotent=1)  # type: ignore[arg-type]
    nodes = {
        "a": shell(argv, idempotent=True),
        "b": shell(argv, read_back=lambda k, r: None),
        "c": shell(argv),
    }
    edges = [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]
    workflow = define_workflow(name="s", start_at="a", nodes=nodes, edges=edges)
    snapshot = definition_snapshot(workflow)
    shells = snapshot["nodes"]
    assert shells["a"].get("idempotent") is True and "readBack" not in shells["a"]
    assert shells["b"].get("readBack") is True and "idempotent" not in shells["b"]
    assert "idempotent" not in shells["c"] and "readBack" not in shells["c"]
