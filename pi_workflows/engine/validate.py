"""The validation child: `python -m pi_workflows.engine.validate` (see `main`).

Implements workflow-server.md § Interactive Pi execution (only this child loads workflow
code for a submission: `output_schema`, then `validate(output, ctx)`, with the context a
resuming runner would build) and python-port.md decision 4. It never opens the database.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema

from pi_workflows.engine._compile import CompiledWorkflow, ScopedState
from pi_workflows.engine._definition import AgentNode
from pi_workflows.engine._errors import SourceChangedError
from pi_workflows.engine._loader import load_verified
from pi_workflows.supervision import set_process_name
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.framing import FrameDecoder, FrameError, encode_frame
from pi_workflows.wire.schema_check import check_schema

__all__ = [
    "MAX_MESSAGE_CHARS",
    "VALIDATOR_FD_ENV",
    "VALIDATOR_PROCESS_NAME",
    "main",
    "node_context",
    "validate_request",
]

VALIDATOR_FD_ENV = "PI_WORKFLOWS_VALIDATOR_FD"
VALIDATOR_PROCESS_NAME = "piw-validator"
MAX_MESSAGE_CHARS = 1000
"""The bound of a rejection's message (the model reads it; the server bounds it too)."""


class Rejection(Exception):  # noqa: N818 - an outcome, reported to the model
    """The output is not accepted; the message says why, for the model."""


def node_context(
    compiled: CompiledWorkflow, state: Mapping[str, Any], node_path: str, run_id: str, visit: int
) -> Any:
    """The node's context as a runner resuming the run would build it: the committed
    attempts replayed in order into their include scopes."""
    scopes = ScopedState(compiled, state.get("input"))
    outputs: Mapping[str, Any] = state.get("outputs") or {}
    for attempt in state.get("finished") or []:
        status, path = attempt["status"], attempt["nodePath"]
        if status == "completed":
            scopes.record(path, status, outputs.get(path))
        elif status in ("failed", "timed_out"):
            scopes.record(path, status)
    return scopes.context(compiled.nodes[node_path], run_id=run_id, visit=visit)


def _schema_error(schema: Any, output: Any) -> str | None:
    validator_class = jsonschema.validators.validator_for(schema)
    if validator_class is jsonschema.Draft202012Validator:
        error = check_schema(schema).best_error(output)
    else:  # a schema that names an older draft is checked by that draft's rules
        error = jsonschema.exceptions.best_match(validator_class(schema).iter_errors(output))
    if error is None:
        return None
    where = error.json_path if error.path else "the output"
    return f"output_schema: at {where}: {error.message}"


def _accepted_value(spec: AgentNode, output: Any, ctx: Any) -> Any:
    schema = spec.output_schema
    if schema is not None:
        problem = _schema_error(schema, output)
        if problem is not None:
            raise Rejection(problem + ". Correct the output and submit again.")
    if spec.validate is None:
        return output
    try:
        value = spec.validate(output, ctx)
    except Exception as exc:  # noqa: BLE001 - a rejection, for the model
        text = str(exc) or type(exc).__name__
        raise Rejection(f"validate: {text}") from None
    value = output if value is None else value
    try:
        dumps(value)
    except Exception:  # noqa: BLE001 - a workflow bug the model cannot fix, still a rejection
        raise Rejection("validate returned a value that is not JSON") from None
    return value


def validate_request(request: Mapping[str, Any]) -> dict[str, Any]:
    """Validate one request frame; return the report frame (`interaction.*`).

    Runs workflow code (module import, `validate`): call it only in a child process.
    """
    ids = {"interactionId": request["interactionId"], "submissionId": request["submissionId"]}
    try:
        value = _checked_value(request)
    except Rejection as exc:
        error = {"code": "submissionRejected", "message": _bounded(str(exc))}
        return {"kind": "interaction.rejected", "payload": {**ids, "error": error}}
    return {"kind": "interaction.accepted", "payload": {**ids, "value": value}}


def _checked_value(request: Mapping[str, Any]) -> Any:
    project = Path(request["projectPath"]) if request.get("projectPath") else None
    agent_dir = Path(request["agentDir"]) if request.get("agentDir") else None
    try:
        loaded = load_verified(request["workflowSource"], project=project, agent_dir=agent_dir)
    except SourceChangedError:
        raise Rejection("the workflow's source changed since the run started") from None
    if loaded.digest != request["definitionDigest"]:
        raise Rejection("the workflow's definition changed since the run started")
    node = loaded.compiled.nodes.get(request["nodePath"])
    spec = node.node if node is not None else None
    if not isinstance(spec, AgentNode):
        raise Rejection("the step is not an agent step")
    ctx = node_context(
        loaded.compiled, request["state"], request["nodePath"], request["runId"], request["visit"]
    )
    return _accepted_value(spec, request["value"], ctx)


def _bounded(text: str) -> str:
    clean = "".join(ch if ch.isprintable() or ch in "\n\t" else " " for ch in text).strip()
    return clean if len(clean) <= MAX_MESSAGE_CHARS else clean[: MAX_MESSAGE_CHARS - 1] + "…"


def _read_frame(sock: socket.socket) -> dict[str, Any] | None:
    decoder = FrameDecoder()
    while True:
        data = sock.recv(65536)
        if not data:
            return None
        frames = decoder.feed(data)
        if frames:
            return frames[0]


def main() -> int:
    """Serve one validation on the socket named by `PI_WORKFLOWS_VALIDATOR_FD`.

    **Protocol** (canonical JSON frames, one per line): the child sends
    `{"kind": "validation.ready"}`; the server sends one `validation.request`
    (`runId`, `interactionId`, `submissionId`, `workflowSource`, `definitionDigest`,
    `projectPath`, `agentDir`, `nodePath`, `visit`, `state`, `value`); the child
    answers with one `interaction.accepted` (`payload: {interactionId, submissionId,
    value}`) or `interaction.rejected` (`payload: {..., error: {code, message}}`) and
    exits. Anything else, or no answer, and the server rejects the submission.

    **Exit status:** 0 when a report was written; 2 for a malformed request; 1 if the
    child itself crashed.
    """
    set_process_name(VALIDATOR_PROCESS_NAME)
    sys.stdout = sys.stderr  # workflow prints never reach the channel
    sock = socket.socket(fileno=int(os.environ.pop(VALIDATOR_FD_ENV)))
    sock.setblocking(True)
    try:
        sock.sendall(encode_frame({"kind": "validation.ready"}))
        request = _read_frame(sock)
        if request is None or request.get("kind") != "validation.request":
            return 2
        report = validate_request(request)
        sock.sendall(encode_frame(report))
        return 0
    except (FrameError, KeyError, OSError):
        traceback.print_exc()
        return 2
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
