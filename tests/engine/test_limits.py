"""`limits=`: checked when defined, inherited through workflows and includes, in the snapshot;
the server default from the environment."""

from __future__ import annotations

from typing import Any

import pytest

from pi_workflows import (
    action,
    compute,
    define_workflow,
    include_workflow,
    notify,
    shell,
)
from pi_workflows.engine import (
    WorkflowDefinitionError,
    compile_workflow,
    definition_digest,
    definition_snapshot,
)
from pi_workflows.engine._limits import (
    DEFAULT_MEMORY_CAP_MB,
    DEFAULT_PROCESSES,
    MEMORY_ENV,
    PROCESSES_ENV,
    Limits,
    builtin_memory_mb,
    default_limits,
    limits_env,
    parse_limits,
)


def _noop(ctx: Any) -> dict[str, Any]:
    return {}


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ([("memory_mb", 1)], "must be a dict"),
        ({"memory": 100}, "unknown keys ['memory']"),
        ({"memory_mb": "512"}, "memory_mb must be an integer"),
        ({"memory_mb": True}, "memory_mb must be an integer"),
        ({"memory_mb": 8}, "from 16"),
        ({"memory_mb": 1.5e3}, "memory_mb must be an integer"),
        ({"processes": 0}, "processes must be an integer from 1"),
        ({"processes": -4}, "processes must be an integer from 1"),
    ],
)
def test_bad_limits_are_refused_when_defined(value: Any, words: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match="compute: limits") as raised:
        compute(_noop, limits=value)
    assert words in str(raised.value)


def test_limits_are_accepted_by_nodes_and_workflows() -> None:
    assert compute(_noop, limits={"memory_mb": 64}).limits == Limits(64, None)
    assert action(_noop, limits={"processes": 4}).limits == Limits(None, 4)
    assert shell(lambda ctx: ["true"], limits={"memory_mb": 32, "processes": 2}).limits == (
        Limits(32, 2)
    )
    assert compute(_noop, limits={}).limits is None
    assert compute(_noop).limits is None
    workflow = define_workflow(
        name="w", start_at="a", nodes={"a": compute(_noop)}, limits={"processes": 9}
    )
    assert workflow.limits == Limits(None, 9)
    with pytest.raises(WorkflowDefinitionError, match="workflow 'w': limits"):
        define_workflow(name="w", start_at="a", nodes={"a": compute(_noop)}, limits={"x": 1})


def test_each_key_comes_from_the_nearest_level_that_sets_it() -> None:
    child = define_workflow(
        name="child",
        start_at="inner",
        nodes={
            "inner": compute(_noop, limits={"processes": 2}),
            "plain": compute(_noop),
        },
        edges=[{"from": "inner", "to": "plain"}],
        exits={"done": {"from": "plain"}},
        limits={"memory_mb": 128},
    )
    parent = define_workflow(
        name="parent",
        start_at="own",
        nodes={
            "own": compute(_noop, limits={"memory_mb": 512}),
            "bare": notify("hi"),
        },
        includes={"sub": include_workflow(child)},
        edges=[{"from": "own", "to": "sub"}, {"from": "sub.done", "to": "bare"}],
        limits={"memory_mb": 256, "processes": 16},
    )
    nodes = compile_workflow(parent).nodes
    assert nodes["own"].limits == Limits(512, 16)
    assert nodes["bare"].limits == Limits(256, 16)
    assert nodes["sub"].limits == Limits(256, 16)  # the entry runs in the parent's scope
    assert nodes["sub/inner"].limits == Limits(128, 2)
    assert nodes["sub/plain"].limits == Limits(128, 16)
    assert nodes["sub/__piw_exit_done"].limits == Limits(128, 16)
    snapshot = definition_snapshot(parent)["nodes"]
    assert snapshot["own"]["limits"] == {"memoryMb": 512, "processes": 16}
    assert snapshot["sub/inner"]["limits"] == {"memoryMb": 128, "processes": 2}


def test_a_workflow_without_limits_keeps_its_snapshot_and_digest() -> None:
    def build(**extra: Any) -> Any:
        return define_workflow(name="w", start_at="a", nodes={"a": compute(_noop)}, **extra)

    plain = definition_snapshot(build())
    assert "limits" not in plain["nodes"]["a"]
    assert definition_digest(build()) == definition_digest(build(limits={}))
    assert definition_digest(build()) != definition_digest(build(limits={"processes": 3}))


def test_the_server_default_comes_from_the_environment() -> None:
    builtin = builtin_memory_mb()
    assert 16 <= builtin <= DEFAULT_MEMORY_CAP_MB
    assert default_limits({}) == Limits(builtin, DEFAULT_PROCESSES)
    assert default_limits({MEMORY_ENV: "0", PROCESSES_ENV: "0"}) == Limits()
    assert default_limits({MEMORY_ENV: " 2048 ", PROCESSES_ENV: "64"}) == Limits(2048, 64)
    for bad in ("-5", "a lot", "8", "1.5"):
        with pytest.raises(ValueError, match=MEMORY_ENV):
            default_limits({MEMORY_ENV: bad})
    assert default_limits(limits_env(Limits(300, None))) == Limits(300, None)


def test_parse_limits_none_and_empty() -> None:
    assert parse_limits(None, "x") is None
    assert parse_limits({"memory_mb": None}, "x") is None
    assert Limits(1, None).over(Limits(5, 6)) == Limits(1, 6)
    assert Limits().over(None) == Limits()
