"""Work a forked child would otherwise repeat: done once in the zygote, before it forks.

The zygote (`pi_workflows.supervision.zygote`) calls `prewarm()` after importing the
child programs and before `gc.freeze()`. Everything here fills process-wide caches that
a runner or resolver needs before its first message: the protocol validators (building
and checking a JSON Schema validator is ~10-20 ms per schema, far more than the fork),
their compiled patterns, jsonschema's own lazily built tables, and the canonical JSON
codec. No workflow code runs: the values are synthetic, and a warm-up that fails only
leaves a cache cold.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

__all__ = ["prewarm"]

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


def _runner_messages(envelope: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    base = {
        "schema": envelope["schema"],
        "runId": envelope["runId"],
        "generation": envelope["generation"],
        "runnerEpoch": envelope["runnerEpoch"],
        "expectedRevision": 0,
    }
    ready = {
        **base,
        "kind": "runner.ready",
        "messageId": f"{_EPOCH}-m1",
        "payload": {"protocolVersion": 1, "definitionDigest": _ZERO},
    }
    reply = {
        **base,
        "kind": "reply",
        "messageId": f"reply-{_EPOCH}-m1",
        "replyTo": f"{_EPOCH}-m1",
        "outcome": "accepted",
        "revision": 1,
    }
    command = {
        **base,
        "kind": "command",
        "expectedRevision": 1,
        "messageId": f"command-{_EPOCH}",
        "command": "start",
        "payload": {"state": {}},
    }
    return [("runner", ready), ("server", reply), ("server", command)]


def _warm_protocol() -> None:
    from pi_workflows.wire import protocol  # noqa: PLC0415
    from pi_workflows.wire.canonical import dumps  # noqa: PLC0415

    for name in ("worker-launch.v1", "runner.v1"):
        # An empty object builds the schema's branch validators and its full validator
        # (with the schema check); the refusal is expected.
        with contextlib.suppress(protocol.ProtocolViolation):
            protocol.validate(name, {})
    envelope = _launch_envelope()
    with contextlib.suppress(protocol.ProtocolViolation):
        protocol.decode_launch_envelope(dumps(envelope))
    for sender, message in _runner_messages(envelope):
        with contextlib.suppress(protocol.ProtocolViolation):
            if sender == "runner":
                protocol.encode_runner_message(message, sender="runner")
            else:
                protocol.runner_message_from_wire(message, sender="server")


def _warm_input_schemas() -> None:
    # What `validate_input` does for a workflow's input schema, once, so jsonschema's
    # lazily built keyword tables and its reference registry exist before the fork.
    from jsonschema import Draft202012Validator  # noqa: PLC0415
    from jsonschema.exceptions import best_match  # noqa: PLC0415

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 1, "pattern": "^[a-z]"}},
        "required": ["name"],
        "additionalProperties": False,
    }
    for value in ({"name": "ok"}, {"name": 1}, {}):
        best_match(Draft202012Validator(schema).iter_errors(value))


def prewarm() -> None:
    """Fill the caches a runner and a resolver need; never raises."""
    for step in (_warm_protocol, _warm_input_schemas):
        try:
            step()
        except Exception:  # a cold cache is slower, never wrong
            log.debug("zygote warm-up step %s failed", step.__name__, exc_info=True)
