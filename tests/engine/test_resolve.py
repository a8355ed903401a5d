"""The source resolver child, run as a real subprocess: one canonical JSON line out."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from typing import Any

import pytest

from pi_workflows.engine import definition_digest
from pi_workflows.engine.resolve import MAX_MESSAGE_CHARS
from pi_workflows.wire.canonical import dumps, loads, sha256_digest

from .conftest import Roots

GREETER = """
    print("noise from import")  # must not reach stdout
    import os
    os.write(1, b"raw fd noise\\n")
    from pi_workflows import compute, define_workflow

    from pi_workflows.engine import InputInvalidError

    def check(value):
        if value["name"] == "nobody":
            raise ValueError(f"{value['name']} is not a name")  # quotes the value
        if value["name"] == "nobody-else":
            raise InputInvalidError("names are letters only")
        return {"name": value["name"].strip()}

    workflow = define_workflow(
        name="greeter",
        title=lambda ctx: f"greet {ctx.input['name']}",
        start_at="greet",
        input_schema={
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}},
        },
        input=check,
        nodes={"greet": compute(lambda ctx: {"text": "hi " + ctx.input["name"]})},
    )
"""


def run_resolver(request: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "pi_workflows.engine.resolve"],
        input=request,
        capture_output=True,
        timeout=30,
        check=False,
    )


def resolve(roots: Roots, workflow: str, value: Any, stderr: list[bytes] | None = None) -> Any:
    request = {
        "workflow": workflow,
        "projectPath": str(roots.project),
        "agentDir": str(roots.agent),
        "input": value,
    }
    done = run_resolver(dumps(request) + b"\n")
    assert done.returncode == 0, done.stderr.decode()
    if stderr is not None:
        stderr.append(done.stderr)
    assert done.stdout.endswith(b"\n")
    assert done.stdout.count(b"\n") == 1, done.stdout
    response = loads(done.stdout[:-1])  # canonical JSON, or this raises
    assert isinstance(response, dict)
    if not response["ok"]:
        assert set(response) == {"ok", "code", "message"}
        assert len(response["message"]) <= MAX_MESSAGE_CHARS
        assert "Traceback" not in response["message"]
    return response


def test_ok(roots: Roots) -> None:
    path = roots.write("project", "greeter", GREETER)
    stderr: list[bytes] = []
    response = resolve(roots, "greeter", {"name": "  Ada "}, stderr)
    assert b"noise from import" in stderr[0]
    assert b"raw fd noise" in stderr[0]
    assert response["ok"] is True
    assert response["input"] == {"name": "Ada"}
    assert response["inputHash"] == sha256_digest({"name": "Ada"})
    assert response["title"] == "greet Ada"
    assert response["workflow"] == "greeter"
    assert response["workflowName"] == "greeter"
    assert response["sourceIdentity"] == {
        "root": {"kind": "file", "path": str(path.resolve()), "hash": sha256_file(path)},
        "mounted": [],
    }
    assert response["definition"]["schema"] == "pi-workflows.definition-snapshot.v1"
    assert response["definition"]["startAt"] == "greet"
    assert response["definitionDigest"] == definition_digest(response["definition"])


def test_builtin(roots: Roots) -> None:
    response = resolve(roots, "hello", None)
    assert response["ok"] is True
    assert response["input"] == {"name": "world"}
    assert response["sourceIdentity"]["root"]["kind"] == "builtin"


def test_unknown_workflow_lists_what_exists_and_never_echoes_the_name(roots: Roots) -> None:
    roots.write("project", "greeter", GREETER)
    response = resolve(roots, "nope-MARKER-7f3a", {})
    assert response["code"] == "workflowNotFound"
    assert "MARKER" not in response["message"], "the client's name is not echoed"
    assert "no workflow has this name; available: " in response["message"]
    assert "greeter" in response["message"]


def test_definition_that_raises_on_import(roots: Roots) -> None:
    roots.write("project", "broken", "raise RuntimeError('x' * 5000)\n")
    response = resolve(roots, "broken", {})
    assert response["code"] == "definitionInvalid"
    assert "raised RuntimeError" in response["message"]
    assert len(response["message"]) == MAX_MESSAGE_CHARS
    assert response["message"].endswith("…")


def test_invalid_graph_is_a_definition_error(roots: Roots) -> None:
    roots.write(
        "project",
        "graph",
        """
        from pi_workflows import compute, define_workflow
        workflow = define_workflow(name="g", start_at="a",
            nodes={"a": compute(print), "b": compute(print)})
        """,
    )
    response = resolve(roots, "graph", {})
    assert response["code"] == "definitionInvalid"
    assert "node 'b'" in response["message"]
    assert "unreachable" in response["message"]


@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        ({}, "input of workflow 'greeter' is invalid at /name: is required"),
        ({"name": 5}, "input of workflow 'greeter' is invalid at /name: must be string"),
        ({"name": "nobody"}, "the workflow's input check refused it (ValueError)"),
        ({"name": "nobody-else"}, "invalid: names are letters only"),
    ],
    ids=["schema-required", "schema-type", "callable-raises", "callable-refuses"],
)
def test_invalid_input_names_the_place_and_the_rule_never_the_value(
    roots: Roots, value: Any, phrase: str
) -> None:
    roots.write("project", "greeter", GREETER)
    response = resolve(roots, "greeter", value)
    assert response["code"] == "inputInvalid"
    assert phrase in response["message"]
    assert "nobody" not in response["message"]


@pytest.mark.parametrize(
    "request_line",
    [b"not json\n", b'{"workflow": "x"}\n', b'{"agentDir":"relative","workflow":"x"}\n', b""],
    ids=["garbage", "not-canonical", "relative-agent-dir", "empty"],
)
def test_malformed_request_exits_2_with_nothing_on_stdout(request_line: bytes) -> None:
    done = run_resolver(request_line)
    assert done.returncode == 2
    assert done.stdout == b""
    assert b"pi-workflows resolver:" in done.stderr


def sha256_file(path: Any) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
