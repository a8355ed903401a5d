"""Work a forked child would otherwise repeat: done once in the zygote, or ahead in a spare.

`prewarm()` (the zygote, before `gc.freeze`) fills the per-process caches children need
(the launch validator, the runner.v1 record decoders); `rehearse()` (a spare, while idle) takes
the copy-on-write faults of a first load. Neither runs user code; failures only leave caches cold.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["prewarm", "rehearse"]

log = logging.getLogger(__name__)

_ZERO = "sha256:" + "0" * 64
_EPOCH = "runner-" + "0" * 32


def _launch_envelope() -> dict[str, Any]:
    from pi_workflows.wire.protocol import LAUNCH_SCHEMA  # noqa: PLC0415

    return {
        "schema": LAUNCH_SCHEMA,
        "runId": "run-" + "0" * 32,
        "generation": 1,
        "runnerEpoch": _EPOCH,
        "projectPath": "/",
        "workflowSource": {
            "root": {"kind": "file", "path": "/prewarm.workflow.py", "hash": _ZERO},
            "mounted": [],
        },
        "definitionDigest": _ZERO,
        "inputHash": _ZERO,
        "protocolVersion": 1,
    }


def _runner_frames(envelope: dict[str, Any]) -> list[dict[str, Any]]:
    base = {
        "schema": envelope["schema"],
        "runId": envelope["runId"],
        "generation": envelope["generation"],
        "runnerEpoch": envelope["runnerEpoch"],
    }
    reply = {
        **base,
        "kind": "reply",
        "replyTo": f"{_EPOCH}-m1",
        "outcome": "accepted",
        "revision": 1,
        "result": {"visit": 1},
    }
    command = {
        **base,
        "kind": "command",
        "expectedRevision": 1,
        "messageId": f"command-{_EPOCH}",
        "command": "start",
        "payload": {"state": {"input": {}, "outputs": {}}},
    }
    return [reply, command]


def _warm_protocol() -> None:
    from pi_workflows.wire import protocol  # noqa: PLC0415
    from pi_workflows.wire import runner as records  # noqa: PLC0415
    from pi_workflows.wire.canonical import dumps  # noqa: PLC0415

    # An empty object builds the launch schema's branch validators and its full validator
    # (with the schema check); the refusal is expected.
    with contextlib.suppress(protocol.ProtocolViolation):
        protocol.validate("worker-launch.v1", {})
    envelope = _launch_envelope()
    with contextlib.suppress(protocol.ProtocolViolation):
        protocol.decode_launch_envelope(dumps(envelope))
    # msgspec builds each record type's decoder on first use: the runner's first frames.
    address = records.RunnerAddress(envelope["runId"], 1, envelope["runnerEpoch"])
    for frame in _runner_frames(envelope):
        with contextlib.suppress(protocol.ProtocolViolation):
            decoded = records.decode_server_frame(frame)
            if isinstance(decoded, records.RunnerReply):
                records.result_as(decoded, records.StartedVisit)
            else:
                decoded.run_state()
    ready = records.RunnerReady(protocol_version=1, definition_digest=_ZERO)
    message = records.RunnerMessage(
        run_id=address.run_id,
        generation=1,
        runner_epoch=address.runner_epoch,
        message_id=f"{_EPOCH}-m1",
        expected_revision=0,
        body=ready,
    )
    records.RunnerMessage.from_wire(message.to_wire())


def _warm_input_schemas() -> None:
    # What `validate_input` does for a workflow's input schema (a runner checks it once,
    # with jsonschema: compiling would cost more), so jsonschema's lazily built keyword
    # tables and its reference registry exist before the fork; and one compiled check,
    # so fastjsonschema's code generator is loaded too.
    from pi_workflows.wire.schema_check import SchemaCheck  # noqa: PLC0415

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 1, "pattern": "^[a-z]"}},
        "required": ["name"],
        "additionalProperties": False,
    }
    interpreted, compiled = SchemaCheck(schema), SchemaCheck(schema)
    compiled.compile()
    for value in ({"name": "ok"}, {"name": 1}, {}):
        interpreted.first_violation(value)
        compiled.first_violation(value)


_REHEARSAL = b"""
from pi_workflows import compute, define_workflow

def first(ctx):
    return {"x": 1}

workflow = define_workflow(
    name="rehearsal",
    title="rehearsal",
    start_at="a",
    input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
    nodes={"a": compute(first), "b": compute(lambda ctx: {"y": 2})},
    edges=[{"from": "a", "to": "b"}],
)
"""


def _rehearse_load() -> None:
    # What `load_verified` and the resolver do to a workflow file, on a built-in text
    # (never a user's file): compile, execute, compile the graph, snapshot and digest.
    from pathlib import Path  # noqa: PLC0415

    from pi_workflows.engine._compile import (  # noqa: PLC0415
        compile_workflow,
        definition_digest,
        definition_snapshot,
        validate_input,
    )
    from pi_workflows.engine._loader import _definition_from  # noqa: PLC0415
    from pi_workflows.wire.canonical import dumps, loads, sha256_digest  # noqa: PLC0415

    definition = _definition_from(Path("/nonexistent/rehearsal.workflow.py"), _REHEARSAL)
    snapshot = definition_snapshot(compile_workflow(definition))
    definition_digest(snapshot)
    value = validate_input(definition, loads(dumps({"n": 1})))
    sha256_digest(value)
    loads(dumps({"ok": True, "definition": snapshot}))


def _rehearse_guard() -> None:
    # A runner's first node lists its descendants and arms the process cap: the /proc
    # reads' first run and the cap's thread (a spare only: the zygote stays one thread).
    from pi_workflows.engine._limits import default_limits  # noqa: PLC0415
    from pi_workflows.supervision import DescendantCap, descendants  # noqa: PLC0415

    default_limits({"PI_WORKFLOWS_DEFAULT_MEMORY_MB": "0"})
    descendants()
    DescendantCap.shared()


def prewarm() -> None:
    """Fill the caches a runner and a resolver need; never raises."""
    _steps((_warm_protocol, _warm_input_schemas, _rehearse_load))


def rehearse() -> None:
    """In a spare child, before its request: touch what the first request will touch.

    A forked child pays a copy-on-write fault for every page it first writes (reference
    counts, caches, the compiler's arenas): about a millisecond each for decoding the
    envelope and loading a small workflow. A spare rehearses both while it is idle, so
    the real request runs on pages that are already its own. Never raises; runs no user
    code, writes to no descriptor, and reaches no crash point (a spare reads
    `PI_WORKFLOWS_CRASH` from its request's environment, at its first crash point).
    It starts the process cap's thread, which waits, idle, until a node arms it.
    """
    _steps((_warm_protocol, _warm_input_schemas, _rehearse_load, _rehearse_guard))


def _steps(steps: tuple[Callable[[], None], ...]) -> None:
    for step in steps:
        try:
            step()
        except Exception:  # a cold cache is slower, never wrong
            log.debug("zygote warm-up step %s failed", step.__name__, exc_info=True)
