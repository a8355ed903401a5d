"""The runner process (`python -m pi_workflows.engine.runner`): one run generation.

Implements workflow-server.md § Runner lifecycle and § Runner protocol, runner side:
no database handle; every change is a message that waits for the server's reply.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import itertools
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from pi_workflows._paths import ensure_private_dir
from pi_workflows.engine._compile import CompiledNode, CompiledWorkflow, ScopedState
from pi_workflows.engine._context import NOT_APPLIED, EffectCall, EngineContext
from pi_workflows.engine._definition import (
    ActionNode,
    AgentNode,
    CheckpointNode,
    ComputeNode,
    HumanDecisionNode,
    NotifyNode,
    ShellNode,
)
from pi_workflows.engine._errors import RoutingError, SourceChangedError
from pi_workflows.engine._limits import (
    MEMORY_ENV,
    PROCESSES_ENV,
    RESOURCE_LIMIT_CODE,
    Limits,
    NodeGuard,
    NodeWatch,
    ResourceLimitExceeded,
    default_limits,
)
from pi_workflows.engine._loader import load_verified
from pi_workflows.engine._pi_child import PiChild, PiLaunch, PiOptions, PiUnavailable, TurnOutcome
from pi_workflows.engine._routing import next_node
from pi_workflows.supervision import (
    CRASH_ENV,
    CRASH_ONCE_ENV,
    RUNNER_SENT_KINDS,
    become_subreaper,
    crash_point,
    identity_of,
    set_process_name,
    signal_popen_group,
    stop_descendants,
)
from pi_workflows.supervision.zygote import CONTROL_FD_ENV
from pi_workflows.wire.canonical import CanonicalJSONError, dumps, loads, sha256_digest
from pi_workflows.wire.client import socket_path_for
from pi_workflows.wire.decisions import MAX_SUMMARY_CHARS, label_problem
from pi_workflows.wire.framing import MAX_FRAME_BYTES, SocketFrameReader
from pi_workflows.wire.protocol import (
    LAUNCH_SCHEMA,
    decode_launch_envelope,
    encode_runner_message,
    runner_message_from_wire,
)
from pi_workflows.wire.runner import MAX_UPLOAD_BYTES

__all__ = ["EFFECT_KEY_ENV", "LAUNCH_ENV", "RUNNER_FD_ENV", "RUN_ID_ENV", "main"]

LAUNCH_ENV = "PI_WORKFLOWS_LAUNCH"
RUNNER_PROCESS_NAME = "piw-runner"
RUNNER_FD_ENV = "PI_WORKFLOWS_RUNNER_FD"
AGENT_DIR_ENV = "PI_WORKFLOWS_AGENT_DIR"
STATE_DIR_ENV = "PI_WORKFLOWS_STATE_DIR"
EFFECT_KEY_ENV = "PI_WORKFLOWS_EFFECT_KEY"
"""The environment variable that gives a shell command its effect's idempotency key."""
RUN_ID_ENV = "PI_WORKFLOWS_RUN_ID"
"""The environment variable that gives a shell command the ID of its run."""
EXIT_CLAIM_LOST = 3
EXIT_PROTOCOL = 4
SHELL_EFFECT_TYPE = "shell"
PIPELINED_KINDS = frozenset({"compute"})
"""Node kinds whose start and finish are sent without waiting: pure work that may run
again. Every other kind (effects, waits, notifications) waits for each answer."""
SHELL_GRACE_S = 5.0
MAX_ERROR_TEXT = 4000


class ClaimLost(Exception):  # noqa: N818 - the design's own name for the handoff
    """The server fenced this runner: stop at once, write nothing more."""


class Refused(Exception):  # noqa: N818
    """The server refused a message; the runner cannot go on."""


class EffectFailed(Exception):  # noqa: N818
    """A managed effect was rejected or cancelled."""


class EffectAmbiguous(EffectFailed):
    """An effect may have applied and nothing proves it: it waits for an operator."""


CONTENT_MEDIA_TYPE = "application/json"
CONTENT_PART_BYTES = 512 * 1024
"""The most bytes one `content.read` asks for."""
MAX_CONTENT_BYTES = 256 * 1024 * 1024
"""The largest referenced value a runner reads; a larger reference is refused unread."""
MAX_OUTPUT_BYTES = MAX_FRAME_BYTES - 64 * 1024
"""The largest node output (canonical JSON): `node.finished` and `run.finished` must fit
in one runner frame with their envelope."""
CONTENT_PARK_REASON = "contentUnavailable"
REFERENCE_FIELDS = {"effect.settle": "result", "node.finished": "output", "run.finished": "output"}
"""The value of each message kind that goes by reference (`<name>Ref`, written before as
`content.write` parts) when it is too large for one frame."""


class ContentFailed(Exception):  # noqa: N818
    """A value the server sent by reference could not be read and verified.

    `code` is one of `invalidMediaType`, `wrongLength`, `contentTooLarge`,
    `contentUnavailable` (the server refused the read: missing content, bad range),
    `badPart`, `digestMismatch` or `malformedJson`. The message is bounded.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}"[:MAX_ERROR_TEXT])
        self.code = code


class RunnerStopped(ClaimLost):
    """The runner handed its run back (parked it) and must stop, writing nothing more."""


class OutputTooLarge(ValueError):  # noqa: N818 - the failure code, outputTooLarge
    """A node output is too large to report in one runner frame; the node fails."""


def checked_output(output: Any, limit: int = MAX_OUTPUT_BYTES) -> bytes:
    """Return the canonical JSON of a node output of at most `limit` bytes.

    `limit` is MAX_OUTPUT_BYTES (one runner frame) for every node but a shell node,
    whose result is bounded by its caps and may travel by reference.

    Raises:
        NotSerializableError: the output is not plain JSON.
        OutputTooLarge: more than `limit` bytes of canonical JSON.
    """
    data = dumps(output)
    if len(data) > limit:
        where = "fit in one runner frame" if limit == MAX_OUTPUT_BYTES else "go by reference"
        raise OutputTooLarge(
            f"the node output is {len(data)} bytes of JSON; at most {limit} {where}"
        )
    return data


def _failure_code(exc: BaseException) -> str:
    """The `node.failed` error code of a node's exception."""
    if isinstance(exc, ResourceLimitExceeded | MemoryError):
        return RESOURCE_LIMIT_CODE
    if isinstance(exc, PiUnavailable | AgentUnproductive):
        return exc.code
    return "outputTooLarge" if isinstance(exc, OutputTooLarge) else "nodeFailed"


class AgentUnproductive(RuntimeError):  # noqa: N818 - the failure code
    """An agent step's model ended more than `MAX_REMINDERS` + 1 turns without an accepted
    submission, as the server counted them (the message names no output)."""

    code = "agentUnproductive"


MAX_REMINDERS = 2
"""Unproductive turns 1 and 2 get a reminder through the same pi child; the third fails
(the server counts them: `record_unproductive_turn`)."""
AGENT_DEADLINE_GRACE_S = 15.0
"""How long after the node's deadline the runner gives up waiting for pi on its own
(the server's deadline stop comes first: a tick, plus the runner's SIGTERM grace)."""
VALIDATING_POLL_S = 0.25
"""How often a new attempt asks again while its interrupted attempt's output validates."""
PI_READY_TIMEOUT_S = 60.0
"""How long a fresh pi child gets to load the bridge and answer `get_state`."""
TURN_ERROR_CHARS = 2048
"""The bound of a provider error sent for the run view (the server's bound too)."""
ACCEPTED_OUTCOMES = frozenset({"accepted", "adopted"})
_NO_VALUE: Any = object()
"""No accepted submission is stored (an accepted output may itself be null)."""


def bridge_accepted(outcome: TurnOutcome) -> bool:
    """Whether the turn's `workflow` tool reported a submission the server accepted.

    The bridge waits for the server's durable outcome and ends the turn on acceptance
    (`terminate: true`, `details.outcome` accepted or adopted). This only tells the runner
    to read the accepted value back: the server's stored value is the node's output.
    """
    for call in outcome.workflow_calls():
        args, result = call.args, call.result
        if not (isinstance(args, dict) and args.get("action") == "submit") or call.is_error:
            continue
        details = result.get("details") if isinstance(result, dict) else None
        if isinstance(details, dict) and details.get("outcome") in ACCEPTED_OUTCOMES:
            return True
    return False


def turn_ended(request_id: str, outcome: TurnOutcome) -> dict[str, Any]:
    """The `interaction.turnEnded` progress report of a turn with no accepted submission."""
    report: dict[str, Any] = {
        "operation": "interaction.turnEnded",
        "interactionId": request_id,
        "stopReason": outcome.stop_reason
        if outcome.stop_reason in ("stop", "toolUse", "length", "error", "aborted")
        else "unknown",
    }
    if outcome.provider_error:
        message = outcome.error_message or "the model provider failed"
        report["error"] = message[:TURN_ERROR_CHARS]
    return report


def _last_rejection(outcome: TurnOutcome) -> str | None:
    """Why the turn's last submit was refused, for the model's reminder only."""
    for call in reversed(outcome.workflow_calls()):
        if isinstance(call.args, dict) and call.args.get("action") == "submit" and call.is_error:
            content = call.result.get("content") if isinstance(call.result, dict) else None
            texts = [c.get("text", "") for c in content or [] if isinstance(c, dict)]
            return " ".join(texts)[:MAX_ERROR_TEXT] or None
    return None


_CONTRACT_SEPARATOR = "\n\n---\n"

RESUMED_NOTE = (
    "This workflow step is being presented again (reason: resumed): its runner restarted, "
    "and nothing of an earlier attempt's work on it was kept. Start it afresh."
)


def step_prompt(
    prompt: str, workflow: str, step: str, attempt: str, spec: AgentNode, *, resumed: bool = False
) -> str:
    """The step's prompt with the step contract appended (workflow-model.md § 8.1); a
    resumed step says that it is presented again."""
    schema = spec.output_schema
    expected = (
        dumps(schema).decode("utf-8") if schema is not None else "a JSON object with your result"
    )
    note = f"{RESUMED_NOTE}\n" if resumed else ""
    return (
        f"{prompt}{_CONTRACT_SEPARATOR}{note}"
        f"Workflow step contract (workflow: {workflow}, step: {step}, attempt: {attempt})\n"
        "You may report progress with the `workflow` tool: "
        f'{{"action":"update","step":"{step}","attempt":"{attempt}",'
        '"update":{"type":...,"key":...,"data":{...}}}.\n'
        "Complete this step by calling the `workflow` tool exactly once with "
        f'{{"action":"submit","step":"{step}","attempt":"{attempt}","output":<your result>}}.\n'
        f"Expected output (JSON Schema): {expected}\n"
        "The step is complete only after the tool accepts. If it reports a validation "
        "error, correct the output and call it again."
    )


def reminder_prompt(step: str, attempt: str, reason: str | None) -> str:
    """The prompt for a turn that ended without an accepted submission (same attempt)."""
    why = f" The last submission was not accepted: {reason}." if reason else ""
    return (
        f"Workflow step {step} (attempt {attempt}) is still waiting for its output "
        f"(reason: reminder).{why} "
        "Call the `workflow` tool with "
        f'{{"action":"submit","step":"{step}","attempt":"{attempt}","output":<your result>}}.'
    )


def _left(deadline: float | None, cap: float | None) -> float:
    """Seconds until `deadline`, at most `cap` (no deadline and no cap: a day)."""
    left = cap if cap is not None else 86_400.0
    if deadline is not None:
        left = min(left, deadline - time.monotonic())
    if left <= 0:
        raise TimeoutError("the agent step's timeout passed")
    return left


class Channel:
    """Request/reply over the private channel: `send` waits for its reply; `post` (pure
    progress) is answered later, and every answer is checked before the next `send`."""

    def __init__(self, sock: socket.socket, envelope: Mapping[str, Any]) -> None:
        self._sock = sock
        self._reader = SocketFrameReader(sock)
        self._envelope = envelope
        self._ids = itertools.count(1)
        self.revision = 0
        self.pending_command: dict[str, Any] | None = None
        self._unanswered: dict[str, tuple[str, Mapping[str, Any] | None]] = {}
        """Posted messages whose replies have not been read, by message ID."""
        self._uploaded: dict[str, dict[str, Any]] = {}
        """The last value sent by reference, by digest: a shell result is named three
        times (settle, node finished, run finished) and written once."""

    def send(
        self, kind: str, payload: dict[str, Any], attempt_id: str | None = None
    ) -> dict[str, Any]:
        """Send one message and return its accepted reply, its result read in full.

        A result the server sent by reference (`resultRef`) is read in bounded parts
        and verified; the returned reply carries it as `result`.

        Raises:
            ClaimLost: the server answered with claim loss.
            RunnerStopped: a referenced result could not be read; the run was parked
                with `contentUnavailable`.
            Refused: any other refusal.
        """
        answer = self._exchange(kind, self._by_reference(kind, payload), attempt_id)
        ref = answer.get("resultRef")
        if ref is None:
            return answer
        resolved = {key: value for key, value in answer.items() if key != "resultRef"}
        resolved["result"] = self._resolve(ref, f"the reply to {kind}")
        return resolved

    def wait_command(self) -> dict[str, Any]:
        """Return the one command the server sends after `runner.ready`.

        A state sent by reference (`stateRef`) is read and verified, and the returned
        command carries it as `state`.

        Raises:
            ClaimLost: the server closed the channel.
            RunnerStopped: the referenced state could not be read; the run was parked.
        """
        while self.pending_command is None:
            raw = self._reader.read_message()
            if raw is None:
                raise ClaimLost("the server closed the channel before the command")
            answer = runner_message_from_wire(raw, sender="server")
            if answer["kind"] == "command":
                self.pending_command = answer
        command = self.pending_command
        self.revision = command["expectedRevision"]
        payload = command["payload"]
        ref = payload.get("stateRef")
        if ref is None:
            return command
        state = self._resolve(ref, "the run state")
        if not isinstance(state, dict):
            self._hand_back(ContentFailed("malformedJson", "not an object"), "the run state")
        resolved = {key: value for key, value in payload.items() if key != "stateRef"}
        resolved["state"] = state
        return {**command, "payload": resolved}

    def read_content(self, ref: Mapping[str, Any]) -> Any:
        """Read a referenced JSON value in parts of at most 512 KiB and verify it.

        Every part must start where the last ended and have the length asked for; the
        whole must have the reference's byte count and SHA-256 digest, and be JSON.

        Raises:
            ContentFailed: a bounded failure (see its codes); nothing is half-used.
            ClaimLost: the server answered a read with claim loss.
        """
        media_type, total, digest = ref.get("mediaType"), ref.get("byteCount"), ref.get("digest")
        if media_type != CONTENT_MEDIA_TYPE:
            raise ContentFailed("invalidMediaType", f"{str(media_type)[:128]!r} is not JSON")
        if not isinstance(total, int) or isinstance(total, bool) or total < 0:
            raise ContentFailed("wrongLength", "the reference has no byte count")
        if total > MAX_CONTENT_BYTES:
            raise ContentFailed(
                "contentTooLarge", f"{total} bytes is more than {MAX_CONTENT_BYTES} bytes"
            )
        hasher = hashlib.sha256()
        parts: list[bytes] = []
        offset = 0
        while offset < total:
            length = min(CONTENT_PART_BYTES, total - offset)
            try:
                reply = self._exchange(
                    "content.read", {"digest": digest, "offset": offset, "length": length}
                )
            except Refused as exc:
                raise ContentFailed("contentUnavailable", str(exc)) from None
            part = _decoded_part(reply.get("result"), offset)
            if len(part) != length:
                raise ContentFailed(
                    "wrongLength", f"the part at {offset} has {len(part)} bytes, not {length}"
                )
            hasher.update(part)
            parts.append(part)
            offset += length
        if "sha256:" + hasher.hexdigest() != digest:
            raise ContentFailed("digestMismatch", f"the {total} bytes read do not match {digest}")
        try:
            return loads(b"".join(parts))
        except CanonicalJSONError as exc:
            raise ContentFailed("malformedJson", str(exc)[:200]) from None

    def _by_reference(self, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        """`payload`, or, when its value is too large for one frame, the payload with
        that value written first as `content.write` parts and named by reference.

        Raises:
            OutputTooLarge: more than MAX_UPLOAD_BYTES; nothing was sent.
        """
        name = REFERENCE_FIELDS.get(kind)
        if name is None or name not in payload:
            return payload
        data = dumps(payload[name])
        if len(data) <= MAX_OUTPUT_BYTES:
            return payload
        rest = {key: value for key, value in payload.items() if key != name}
        rest[f"{name}Ref"] = self._upload(data)
        return rest

    def _upload(self, data: bytes) -> dict[str, Any]:
        """Write `data` in parts of at most 512 KiB; its `uploadRef`."""
        if len(data) > MAX_UPLOAD_BYTES:
            raise OutputTooLarge(
                f"the value is {len(data)} bytes of JSON; at most {MAX_UPLOAD_BYTES} "
                "go by reference"
            )
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        known = self._uploaded.get(digest)
        if known is not None:
            return known
        parts: list[str] = []
        for offset in range(0, len(data), CONTENT_PART_BYTES):
            part = data[offset : offset + CONTENT_PART_BYTES]
            reply = self._exchange("content.write", {"data": base64.b64encode(part).decode()})
            stored = (reply.get("result") or {}).get("digest")
            expected = "sha256:" + hashlib.sha256(part).hexdigest()
            if stored != expected:
                raise Refused(f"content.write: the server stored {stored!r}, not {expected}")
            parts.append(expected)
        ref = {
            "mediaType": CONTENT_MEDIA_TYPE,
            "byteCount": len(data),
            "digest": digest,
            "parts": parts,
        }
        self._uploaded = {digest: ref}
        return ref

    def _resolve(self, ref: Mapping[str, Any], what: str) -> Any:
        try:
            return self.read_content(ref)
        except ContentFailed as exc:
            self._hand_back(exc, what)

    def _hand_back(self, exc: ContentFailed, what: str) -> NoReturn:
        """Park the run for review with a bounded reason, then stop (never a traceback)."""
        detail = f"{what}: {exc}"[:MAX_ERROR_TEXT]
        self._exchange("run.parked", {"reason": CONTENT_PARK_REASON, "detail": detail})
        raise RunnerStopped(f"{CONTENT_PARK_REASON}: {exc.code}")

    def post(
        self,
        kind: str,
        payload: dict[str, Any],
        attempt_id: str | None = None,
        expect: Mapping[str, Any] | None = None,
    ) -> None:
        """Send a message of pure progress without waiting for its reply.

        The server applies a runner's messages in order; the replies are read at the
        next `send` or `flush`, and a refusal then stops the runner there. Only progress
        that may repeat goes this way (a pure node's start and finish): the runner waits
        for every answer before an effect, a wait, an interaction or the end of the run.
        `expect` names result fields the reply must carry (a pipelined node's visit).
        """
        message = self._message(kind, self._by_reference(kind, payload), attempt_id)
        self._write(message)
        self._unanswered[message["messageId"]] = (kind, expect)

    def flush(self) -> None:
        """Wait for the replies to every posted message; raise at the first refusal.

        Raises:
            ClaimLost: a posted message was answered with claim loss (a fence).
            Refused: any other refusal, or a reply that contradicts what was posted.
        """
        while self._unanswered:
            answer = self._read_answer()
            if answer is not None:
                self._settle_posted(answer)

    def _message(
        self, kind: str, payload: dict[str, Any], attempt_id: str | None
    ) -> dict[str, Any]:
        message: dict[str, Any] = {
            "schema": LAUNCH_SCHEMA,
            "kind": kind,
            "runId": self._envelope["runId"],
            "generation": self._envelope["generation"],
            "runnerEpoch": self._envelope["runnerEpoch"],
            "expectedRevision": self.revision,
            "messageId": f"{self._envelope['runnerEpoch']}-m{next(self._ids)}",
            "payload": payload,
        }
        if attempt_id is not None:
            message["attemptId"] = attempt_id
        return message

    def _write(self, message: dict[str, Any]) -> None:
        self._sock.sendall(encode_runner_message(message, sender="runner") + b"\n")
        crash_point("runner.message.after_send")
        kind = message["kind"]
        if kind in RUNNER_SENT_KINDS:  # a content.read is a read: it has no point of its own
            crash_point(f"runner.message.{kind.replace('.', '_')}.after_send")

    def _read_answer(self) -> dict[str, Any] | None:
        """The next reply from the server (a command is kept for `wait_command`)."""
        raw = self._reader.read_message()
        if raw is None:
            raise ClaimLost("the server closed the channel")
        answer = runner_message_from_wire(raw, sender="server")
        if answer["kind"] == "command":
            self.pending_command = answer
            return None
        return answer

    def _settle_posted(self, answer: dict[str, Any]) -> None:
        posted = self._unanswered.pop(answer.get("replyTo", ""), None)
        if posted is None:
            return
        kind, expect = posted
        accepted = self._accepted(kind, answer)
        result = accepted.get("result") or {}
        for key, value in (expect or {}).items():
            if result.get(key) != value:
                raise Refused(f"{kind}: the server's {key} is {result.get(key)!r}, not {value!r}")

    def _accepted(self, kind: str, answer: dict[str, Any]) -> dict[str, Any]:
        outcome = answer["outcome"]
        if outcome == "claimLost":
            self._unanswered.clear()  # the rest were refused too: nothing more is written
            raise ClaimLost(answer.get("error", {}).get("code", "claimLost"))
        if outcome not in ("accepted", "adopted"):
            error = answer.get("error") or {}
            raise Refused(f"{kind}: {outcome} {error.get('code', '')} {error.get('message', '')}")
        self.revision = answer.get("revision", self.revision) or self.revision
        return answer

    def _exchange(
        self, kind: str, payload: dict[str, Any], attempt_id: str | None = None
    ) -> dict[str, Any]:
        """Send one message and return its accepted reply as it came (no reference read)."""
        self.flush()
        message = self._message(kind, payload, attempt_id)
        self._write(message)
        while True:
            answer = self._read_answer()
            if answer is None or answer.get("replyTo") != message["messageId"]:
                continue
            return self._accepted(kind, answer)


def _decoded_part(result: Any, offset: int) -> bytes:
    """The bytes of one `content.read` result: `{"offset": offset, "data": base64}`."""
    if not isinstance(result, dict) or result.get("offset") != offset:
        raise ContentFailed("badPart", f"the reply to the read at {offset} is not that part")
    data = result.get("data")
    if not isinstance(data, str):
        raise ContentFailed("badPart", f"the part at {offset} has no data")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ContentFailed("badPart", f"the part at {offset} is not base64") from None


class RunnerEffects:
    """The effect host: reserve with the server, apply, settle (see `EffectHost`)."""

    def __init__(self, channel: Channel, attempt_id: str) -> None:
        self._channel = channel
        self._attempt_id = attempt_id

    def run_effect(self, call: EffectCall) -> Any:
        reserve: dict[str, Any] = {
            "effectType": call.effect_type,
            "idempotencyKey": call.key,
            "request": call.request,
        }
        if call.idempotent:
            # An interrupted apply is then applied again (the server opens a new attempt).
            reserve["idempotent"] = True
        reply = self._channel.send("effect.reserve", reserve, self._attempt_id)
        reservation = reply["result"]
        decision = reservation["decision"]
        effect = reservation["effect"]
        if decision == "adopt":
            if effect["state"] == "applied":
                return effect["result"]
            raise EffectFailed(f"effect {call.effect_type} is {effect['state']}")
        if decision == "ambiguous":
            raise EffectAmbiguous(f"effect {call.effect_type} is ambiguous and needs review")
        if decision == "uncertain":
            return self._prove(call)
        return self._apply(call)

    def _prove(self, call: EffectCall) -> Any:
        if call.read_back is None:
            self._settle(call, "ambiguous")
            raise EffectAmbiguous(
                f"effect {call.effect_type} may have applied before a crash and has no read-back"
            )
        try:
            observed = call.read_back(call.key, call.request)
        except Exception:  # noqa: BLE001 - an unanswerable read-back is ambiguity
            self._settle(call, "ambiguous")
            raise EffectAmbiguous(f"read-back of {call.effect_type} could not tell") from None
        crash_point("runner.effect.after_read_back")
        if observed is NOT_APPLIED:
            self._settle(
                call,
                "failed",
                error={"code": "notApplied", "message": "read-back: not applied"},
                read_back="notApplied",
            )
            return self._apply(call)
        self._settle(call, "succeeded", result=observed, read_back="applied")
        return observed

    def _apply(self, call: EffectCall) -> Any:
        crash_point("runner.effect.after_reserve")
        try:
            result = call.apply(call.key, call.request)
        except Exception as exc:
            self._settle(call, "failed", error={"code": "effectFailed", "message": _text(exc)})
            raise
        crash_point("runner.effect.after_apply")
        self._settle(call, "succeeded", result=result)
        crash_point("runner.effect.after_settle")
        return result

    def _settle(
        self,
        call: EffectCall,
        outcome: str,
        *,
        result: Any = None,
        error: dict[str, str] | None = None,
        read_back: str | None = None,
    ) -> None:
        payload: dict[str, Any] = {"idempotencyKey": call.key, "outcome": outcome}
        if outcome == "succeeded":
            payload["result"] = result
        if error is not None:
            payload["error"] = error
        if read_back is not None:
            payload["readBack"] = read_back
        self._channel.send("effect.settle", payload, self._attempt_id)


def _run_failure(path: str, exc: BaseException) -> tuple[str, str]:
    """The run's error when node `path` failed with no route: the node's own failure code
    (piUnavailable, agentUnproductive …) is named in the reason; a plain exception is
    named by its type."""
    code = _failure_code(exc)
    run_code = code if code == RESOURCE_LIMIT_CODE else "nodeFailed"
    why = _text(exc) if code == "nodeFailed" else f"{code}: {exc}"
    return run_code, f"{path}: {why}"[:MAX_ERROR_TEXT]


def _text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text[:MAX_ERROR_TEXT] or type(exc).__name__


MAX_TRACEBACK_BYTES = 16 * 1024
"""The most traceback text a `node.failed` carries (the runner.v1 bound); the tail is
kept, since the innermost frames and the exception say most."""
_ENGINE_DIR = str(Path(__file__).resolve().parent.parent) + os.sep


def _traceback_text(exc: BaseException) -> str:
    """The bounded traceback of a failed node: the workflow's frames, not the engine's."""
    shown = traceback.TracebackException.from_exception(exc)
    for part in (shown, *_chained(shown)):
        part.stack = traceback.StackSummary.from_list(
            [frame for frame in part.stack if not frame.filename.startswith(_ENGINE_DIR)]
        )
    text = "".join(shown.format())
    data = text.encode("utf-8")
    if len(data) <= MAX_TRACEBACK_BYTES:
        return text
    return "…" + data[-(MAX_TRACEBACK_BYTES - 4) :].decode("utf-8", "ignore")


def _chained(shown: traceback.TracebackException) -> list[traceback.TracebackException]:
    found: list[traceback.TracebackException] = []
    current = shown.__cause__ or shown.__context__
    while current is not None and len(found) < 8:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _run_shell(
    argv: list[str],
    timeout_ms: int | None,
    max_output: int,
    channel: Channel | None = None,
    *,
    effect_key: str | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Run one command in its own group with capped output and SIGTERM→SIGKILL timeout.

    The group is registered with the server (`process.register`) while it runs, so a
    runner that is killed or cancelled cannot leave the command running behind it. The
    command's environment is `shell_environment(effect_key, run_id)`. At most
    `max_output` bytes of each of stdout and stderr are kept as they are read (the rest
    is counted, never held); the command's exit ends the wait (see `_capture`).
    """
    # The command waits at a gate until its group is registered, so no instant exists in
    # which the runner could die (or the server stop) and leave an unregistered command
    # running. `sh` holds the gate and then execs the command in place: same PID, same
    # start identity. If the runner dies first, the gate closes empty and nothing runs.
    gate_r, gate_w = os.pipe()
    try:
        child = subprocess.Popen(
            ["/bin/sh", "-c", _GATE_SCRIPT, "piw-gate", *argv],
            stdin=gate_r,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=shell_environment(effect_key, run_id),
        )
    except BaseException:
        os.close(gate_w)
        raise
    finally:
        os.close(gate_r)
    try:
        registration = _register(channel, child.pid)
        os.write(gate_w, b"go\n")
    finally:
        os.close(gate_w)
    cap = max(0, min(max_output, SHELL_STREAM_MAX_BYTES))
    try:
        captured = _capture(child, None if timeout_ms is None else timeout_ms / 1000, cap)
    finally:
        if child.returncode is None:  # the runner is failing: never leave the group behind
            signal_popen_group(child, signal.SIGKILL)
            child.wait()
        if channel is not None and registration is not None:
            channel.send("runner.progress", {**registration, "operation": "process.unregister"})
    code = child.returncode
    out, err = captured.stdout, captured.stderr
    return fit_shell_output(
        {
            "exitCode": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "timedOut": captured.timed_out,
            "stdout": bytes(out.kept).decode("utf-8", "replace"),
            "stderr": bytes(err.kept).decode("utf-8", "replace"),
            "stdoutTruncatedBytes": out.dropped,
            "stderrTruncatedBytes": err.dropped,
            "truncated": out.dropped > 0 or err.dropped > 0,
        }
    )


RUNNER_PRIVATE_ENV = frozenset(
    {
        LAUNCH_ENV,
        RUNNER_FD_ENV,
        AGENT_DIR_ENV,
        STATE_DIR_ENV,
        CONTROL_FD_ENV,
        CRASH_ENV,
        CRASH_ONCE_ENV,
    }
)
"""Variables pi-workflows uses to start and test its own processes: a shell command
never sees them (the launch envelope names the run, its epoch and the project)."""


def shell_environment(effect_key: str | None, run_id: str | None) -> dict[str, str]:
    """The environment of a shell command: the runner's own, without `RUNNER_PRIVATE_ENV`,
    with `PI_WORKFLOWS_EFFECT_KEY` and `PI_WORKFLOWS_RUN_ID` when given."""
    env = {key: value for key, value in os.environ.items() if key not in RUNNER_PRIVATE_ENV}
    if effect_key is not None:
        env[EFFECT_KEY_ENV] = effect_key
    if run_id is not None:
        env[RUN_ID_ENV] = run_id
    return env


SHELL_DRAIN_S = 0.5
"""After a command exits, how long its pipes are still read. What it wrote is already in
them; a background process that keeps them open cannot hold the result any longer."""
SHELL_POLL_S = 0.05
"""How often the exit is polled where no pidfd tells it (not Linux)."""
SHELL_READ_BYTES = 256 * 1024


@dataclass
class _Stream:
    """One captured pipe: its first `cap` bytes are kept, the rest only counted."""

    cap: int
    kept: bytearray = field(default_factory=bytearray)
    total: int = 0

    def take(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += data[:room]

    @property
    def dropped(self) -> int:
        return self.total - len(self.kept)


@dataclass
class _Captured:
    stdout: _Stream
    stderr: _Stream
    timed_out: bool = False


def _capture(child: subprocess.Popen[bytes], timeout_s: float | None, cap: int) -> _Captured:
    """Read the command's stdout and stderr as they come until it has exited and its
    pipes are drained (end of file, or `SHELL_DRAIN_S` after the exit); time it out.

    The command's exit is the process's exit, not the closing of its pipes: a
    background process that keeps stdout open neither holds the result nor makes the
    command time out. Memory stays at `cap` per stream plus one read.
    """
    assert child.stdout is not None and child.stderr is not None
    captured = _Captured(_Stream(cap), _Stream(cap))
    streams = {child.stdout.fileno(): captured.stdout, child.stderr.fileno(): captured.stderr}
    selector = selectors.DefaultSelector()
    exit_fd = _pidfd(child.pid)
    try:
        for fd in streams:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        if exit_fd is not None:
            selector.register(exit_fd, selectors.EVENT_READ)
        clock = _ShellClock(child, timeout_s, polled=exit_fd is None)
        while True:
            reading = any(fd in streams for fd in selector.get_map())
            wait = clock.advance(captured, reading=reading)
            if wait is None:
                return captured
            for key, _ in selector.select(wait):
                if key.fd == exit_fd:
                    selector.unregister(exit_fd)  # exited: the clock's `poll` reaps it
                elif not _read_into(key.fd, streams[key.fd]):
                    selector.unregister(key.fd)
    finally:
        selector.close()
        if exit_fd is not None:
            os.close(exit_fd)
        child.stdout.close()
        child.stderr.close()


def _read_into(fd: int, stream: _Stream) -> bool:
    """Read what is there into `stream`; False at end of file."""
    try:
        data = os.read(fd, SHELL_READ_BYTES)
    except BlockingIOError:
        return True
    stream.take(data)
    return bool(data)


class _ShellClock:
    """The deadlines of one command: its timeout (SIGTERM to the group, SIGKILL after
    `SHELL_GRACE_S`) and, once it exited, how long its pipes are still read."""

    def __init__(
        self, child: subprocess.Popen[bytes], timeout_s: float | None, *, polled: bool
    ) -> None:
        self._child = child
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._kill_at: float | None = None
        self._drain_until: float | None = None
        self._polled = polled

    def advance(self, captured: _Captured, *, reading: bool) -> float | None:
        """Act on what is due; the seconds to wait for the pipes, or None when done."""
        now = time.monotonic()
        if self._drain_until is None and self._child.poll() is not None:
            self._drain_until = now + SHELL_DRAIN_S
        if self._drain_until is not None and (not reading or now >= self._drain_until):
            return None
        if self._deadline is not None and now >= self._deadline:
            captured.timed_out = True
            signal_popen_group(self._child, signal.SIGTERM)
            self._deadline, self._kill_at = None, now + SHELL_GRACE_S
        if self._kill_at is not None and now >= self._kill_at:
            signal_popen_group(self._child, signal.SIGKILL)
            self._kill_at = None
        wakes = [t for t in (self._deadline, self._kill_at, self._drain_until) if t is not None]
        if self._drain_until is None and self._polled:
            wakes.append(now + SHELL_POLL_S)
        return max(0.0, min(wakes) - now) if wakes else 60.0


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits (Linux 5.3+), or None."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None


SHELL_OUTPUT_BUDGET = MAX_UPLOAD_BYTES - 64 * 1024
"""The largest canonical JSON a shell result may have. A result larger than one runner
frame travels by reference (`content.write`), so the budget is what a reference holds."""
SHELL_STREAM_MAX_BYTES = SHELL_OUTPUT_BUDGET // 2
"""No stream keeps more than this, whatever `max_output_bytes` says: more could never be
reported."""


def fit_shell_output(result: dict[str, Any], budget: int = SHELL_OUTPUT_BUDGET) -> dict[str, Any]:
    """Shorten stdout and stderr (the longer first) until the result's JSON fits `budget`.

    A command that finished has a known result; output that escapes to more JSON than
    a reference holds (NUL bytes become six characters each) is cut, never the result
    itself, so the effect settles instead of failing or becoming ambiguous. The bytes
    cut are added to the stream's `…TruncatedBytes`. The JSON is measured in bounded
    pieces, never built whole here.
    """
    size = _result_json_len(result)
    while size > budget:
        lengths = {name: _json_len(result[name]) for name in ("stdout", "stderr")}
        name = "stdout" if lengths["stdout"] >= lengths["stderr"] else "stderr"
        text = result[name]
        # Cut as many characters as the excess is worth at this text's JSON bytes per
        # character (escapes make it up to six), plus one: a round or two.
        per_char = lengths[name] / max(1, len(text))
        keep = max(0, len(text) - int((size - budget) / per_char) - 1)
        cut = len(text[keep:].encode("utf-8", "replace"))
        dropped = f"{name}TruncatedBytes"
        result = {
            **result,
            name: text[:keep],
            dropped: int(result.get(dropped, 0)) + cut,
            "truncated": True,
        }
        size = _result_json_len(result)
    return result


_MEASURE_CHARS = 1024 * 1024


def _json_len(text: str) -> int:
    """`len(dumps(text))`, measured a megabyte of characters at a time (an escape never
    spans two characters, so the pieces add up)."""
    pieces = range(0, len(text), _MEASURE_CHARS)
    return 2 + sum(len(dumps(text[i : i + _MEASURE_CHARS])) - 2 for i in pieces)


def _result_json_len(result: dict[str, Any]) -> int:
    """`len(dumps(result))`: its other fields, plus each stream's string."""
    rest = len(dumps({**result, "stdout": "", "stderr": ""}))
    return rest + _json_len(result["stdout"]) - 2 + _json_len(result["stderr"]) - 2


_GATE_SCRIPT = 'read -r _ || exit 127; exec "$@" </dev/null'
"""Wait for the runner's go on stdin (sent once the group is registered), then become the
command, its stdin /dev/null. (The gate is stdin, not a numbered descriptor: `dash`
takes only one digit in a redirection.)"""


def _register(channel: Channel | None, pid: int) -> dict[str, Any] | None:
    identity = identity_of(pid)
    if channel is None or identity is None:
        return None
    registration = {
        "operation": "process.register",
        "pid": pid,
        "processGroupId": pid,
        "startIdentity": f"{identity.start_ticks}:{identity.boot_id or 'none'}",
    }
    channel.send("runner.progress", registration)
    return registration


class Execution:
    """Runs the compiled workflow from where the durable state says to continue."""

    def __init__(
        self,
        channel: Channel,
        compiled: CompiledWorkflow,
        envelope: Mapping[str, Any],
        state: Mapping[str, Any],
        *,
        answered_checkpoint: str | None = None,
        guard: NodeGuard | None = None,
        state_dir: Path | None = None,
        pi_agent_dir: Path | None = None,
    ) -> None:
        """`answered_checkpoint`: the checkpoint attempt a `continue` command goes on after
        (its output in `state` is the answer); any other completed checkpoint that is the
        last step has no answer yet, so the run waits there again. `guard` applies each
        node's limits and stops what the node left running (none: in-process tests)."""
        self.channel = channel
        self.guard = guard
        self.state_dir = state_dir
        """The server's state folder: agent steps keep pi's private files under it."""
        self.pi_agent_dir = pi_agent_dir
        """Pi's agent folder (`models.json`, `auth.json`, `settings.json`)."""
        self.compiled = compiled
        self.run_id = str(envelope["runId"])
        origin = state.get("originSessionId")
        self.origin_session_id: str | None = origin if isinstance(origin, str) else None
        """The Pi session an interactive run is bound to: its agent steps run there."""
        # Outputs and results by full compiled path; each node's context sees them
        # projected to its include scope. A resumed runner rebuilds the scopes by replaying
        # the committed attempts in order (outputs are the latest completed per path).
        self.scopes = ScopedState(compiled, state.get("input"))
        committed: Mapping[str, Any] = state.get("outputs") or {}
        self.visits: dict[str, int] = dict(state.get("visits") or {})
        self.steps = 0
        self.current: str | None = compiled.start_at
        self.last_output: Any = None
        self.ended: str | None = None
        for attempt in state.get("finished") or []:
            status, path = attempt["status"], attempt["nodePath"]
            known = compiled.nodes.get(path)
            if known is None or known.node is not None:  # entries and exits are no steps
                self.steps += 1
            self.ended = None
            if status == "completed":
                self.scopes.record(path, status, committed.get(path))
                self.current = attempt["nextNodePath"]
                self.last_output = committed.get(path)
            elif status in ("failed", "timed_out"):
                # The server may have ended the attempt (a deadline); route it here.
                self.scopes.record(path, status)
                self.current = attempt["nextNodePath"] or self._route_after(path, status)
                if self.current is None:
                    self.ended = status
            else:  # interrupted or cancelled: that node runs again
                self.current = attempt["nodePath"]
        unfinished = state.get("unfinished")
        if unfinished is not None:
            self.current = unfinished["nodePath"]
        # A waiting attempt (an origin-session step whose output was accepted, or whose
        # run was requeued) continues in place: same attempt, visit and deadline.
        self.waiting: Mapping[str, Any] | None = (
            unfinished if unfinished is not None and unfinished.get("status") == "waiting" else None
        )
        # A runner that died after its checkpoint completed and before the run waited
        # there: the answer does not exist yet, so wait again instead of going on.
        self.unanswered_checkpoint: str | None = None
        self.route_error: str | None = None
        finished = state.get("finished") or []
        if unfinished is None and finished and self.ended is None:
            last = finished[-1]
            known = compiled.nodes.get(last["nodePath"])
            if (
                last["status"] == "completed"
                and known is not None
                and known.kind == "checkpoint"
                and last.get("attemptId") != answered_checkpoint
            ):
                self.unanswered_checkpoint = last.get("attemptId")
            elif (
                last["status"] == "completed"
                and known is not None
                and isinstance(known.node, HumanDecisionNode)
            ):
                # A protected decision routes on its answer (`$.choice`), which the
                # parent run could not know: the continuation routes here.
                self._route_answer(last["nodePath"], committed.get(last["nodePath"]))

    def _route_answer(self, path: str, answer: Any) -> None:
        try:
            self.current = next_node(self.compiled, path, answer, "completed")
        except RoutingError as exc:
            self.current, self.route_error = None, _text(exc)

    def _route_after(self, path: str, outcome: str) -> str | None:
        try:
            return next_node(self.compiled, path, None, outcome)
        except RoutingError:
            return None

    def run(self) -> None:
        if self.unanswered_checkpoint is not None:
            self.channel.send("run.parked", {"reason": "checkpoint"}, self.unanswered_checkpoint)
            return
        if self.route_error is not None:
            self._finish("failed", error=("routingFailed", self.route_error))
            return
        if self.current is None and self.ended is not None:
            code = "nodeTimedOut" if self.ended == "timed_out" else "nodeFailed"
            self._finish(self.ended, error=(code, "the last node did not complete"))
            return
        while self.current is not None:
            node = self.compiled.nodes[self.current]
            if node.node is not None:  # include entry and exit nodes are no steps
                self.steps += 1
            if self.steps > self.compiled.max_steps:
                self._finish(
                    "failed", error=("maxSteps", f"more than {self.compiled.max_steps} steps")
                )
                return
            exceeded = self.scopes.limit_exceeded(node)
            if exceeded is not None:
                self._finish("failed", error=("maxSteps", exceeded))
                return
            if not self._step(node):
                return
        self._finish("completed", output=self.last_output)

    def _step(self, node: CompiledNode) -> bool:
        """Run one node; False when the run stopped here (parked or finished)."""
        pipelined = node.kind in PIPELINED_KINDS
        attempt_id, visit = self._start_attempt(node, pipelined)
        self.attempt_id = attempt_id
        ctx = self.scopes.context(
            node,
            run_id=self.run_id,
            visit=visit,
            effects=RunnerEffects(self.channel, attempt_id)
            if node.kind in ("action", "shell")
            else None,
        )
        try:
            output = self._run_node(node, ctx)
            # JSON that fits one frame (a shell result: a reference), or the node failed.
            checked_output(
                output, SHELL_OUTPUT_BUDGET if node.kind == "shell" else MAX_OUTPUT_BYTES
            )
            outcome = "completed"
        except (ClaimLost, Refused):
            raise
        except EffectAmbiguous as exc:
            # Never retried automatically: the run waits for an operator's review.
            self.channel.send("run.parked", {"reason": "effectAmbiguous", "detail": _text(exc)})
            return False
        except Exception as exc:  # noqa: BLE001 - a node failure is data for routing
            output, outcome = None, "failed"
            (self.channel.post if pipelined else self.channel.send)(
                "node.failed",
                {
                    "nodePath": node.path,
                    "error": {
                        "code": _failure_code(exc),
                        "message": _text(exc),
                        "traceback": _traceback_text(exc),
                    },
                },
                attempt_id,
            )
            self.visits[node.path] = visit
            self.scopes.record(node.path, "failed")
            try:
                self.current = next_node(self.compiled, node.path, None, "failed")
            except RoutingError:
                self.current = None
            if self.current is None:
                self._finish("failed", error=_run_failure(node.path, exc))
                return False
            return True
        try:
            # A protected decision routes on its answer, in the continuation run.
            protected = isinstance(node.node, HumanDecisionNode)
            route = None if protected else next_node(self.compiled, node.path, output, outcome)
        except RoutingError as exc:
            self._finish("failed", error=("routingFailed", _text(exc)))
            return False
        finished: dict[str, Any] = {"nodePath": node.path, "output": output}
        if route is not None:
            finished["route"] = route
        (self.channel.post if pipelined else self.channel.send)(
            "node.finished", finished, attempt_id
        )
        self.scopes.record(node.path, outcome, output)
        self.visits[node.path] = visit
        self.last_output = output
        if node.kind == "checkpoint":
            # The run waits without a runner; an answer starts its continuation run.
            self.channel.send("run.parked", {"reason": "checkpoint"}, attempt_id)
            return False
        self.current = route
        return True

    def _start_attempt(self, node: CompiledNode, pipelined: bool) -> tuple[str, int]:
        """Start the node's attempt (or continue the waiting one): its ID and visit."""
        waiting, self.waiting = self.waiting, None
        if waiting is not None and waiting.get("nodePath") == node.path:
            # Its start was committed by an earlier runner: nothing to start again.
            return str(waiting["attemptId"]), int(waiting["visit"])
        attempt_id = f"attempt-{uuid.uuid4().hex}"
        started: dict[str, Any] = {
            "nodePath": node.path,
            "nodeKind": node.kind,
            "visit": self.visits.get(node.path, 0) + 1,
        }
        if node.timeout_ms:
            started["timeoutMs"] = node.timeout_ms
        if pipelined:
            # A pure node may run again, so its start need not be confirmed before it
            # runs; the reply must still carry the same visit (checked at the next wait).
            self.channel.post("node.started", started, attempt_id, {"visit": started["visit"]})
            return attempt_id, int(started["visit"])
        reply = self.channel.send("node.started", started, attempt_id)
        return attempt_id, int((reply.get("result") or {}).get("visit", started["visit"]))

    def _run_node(self, node: CompiledNode, ctx: EngineContext) -> Any:
        """`_execute` under the node's limits; every process it started is stopped after.

        Raises:
            ResourceLimitExceeded: the node ran out of memory, or had more processes
                alive than its limit (they were stopped, so it did not complete).
        """
        watch = NodeWatch(Limits())
        guarded = self.guard.node(node.limits) if self.guard is not None else None
        try:
            with guarded or contextlib.nullcontext(watch) as watch:
                output = self._execute(node, ctx)
        except (ClaimLost, Refused, EffectAmbiguous):
            raise
        except Exception as exc:
            explained = watch.explain(exc)
            if explained is exc:
                raise
            # The traceback holds the node's frames, and with them what filled its memory.
            exc.__traceback__ = None
            raise explained from None
        exceeded = watch.exceeded()
        if exceeded is not None:
            raise exceeded
        return output

    def _execute(self, node: CompiledNode, ctx: EngineContext) -> Any:
        if node.include_transition is not None:
            # An include entry maps the parent's context to the child's input; an exit
            # hands the child's exit output back to the parent, which routes on it.
            return self.scopes.transition_output(node, ctx)
        spec = node.node
        if isinstance(spec, ComputeNode | ActionNode):
            return spec.fn(ctx)
        if isinstance(spec, ShellNode):
            argv = [str(part) for part in spec.argv_fn(ctx)]
            timeout_ms, cap = spec.timeout_ms, spec.max_output_bytes
            return ctx.effect(
                SHELL_EFFECT_TYPE,
                {"argv": argv},
                apply=lambda key, request: _run_shell(
                    request["argv"],
                    timeout_ms,
                    cap,
                    self.channel,
                    effect_key=key,
                    run_id=self.run_id,
                ),
                read_back=spec.read_back,
                idempotent=spec.idempotent,
            )
        if isinstance(spec, NotifyNode):
            text = spec.message_fn(ctx) if callable(spec.message_fn) else spec.message_fn
            self.channel.send(
                "notification.requested",
                {
                    "notificationId": f"{self.run_id}:{node.path}:{ctx.visit}",
                    "content": {"text": str(text), "kind": spec.notify_kind},
                },
            )
            return {"text": str(text)}
        if isinstance(spec, CheckpointNode):
            summary = spec.summary(ctx) if callable(spec.summary) else spec.summary
            return {"summary": summary}
        if isinstance(spec, HumanDecisionNode):
            return {"summary": _decision_summary(spec, ctx)}
        if isinstance(spec, AgentNode):
            return self._run_agent(node, spec, ctx)
        raise TypeError(f"node kind {node.kind} cannot run")

    def _run_agent(self, node: CompiledNode, spec: AgentNode, ctx: EngineContext) -> Any:
        """A headless agent step: find pi, propose the attempt's request, drive one pi child.

        pi is resolved first, so a missing binary fails the step (`piUnavailable`) before
        any request exists. A resumed runner whose request already has an accepted
        submission adopts that output and never asks again. Otherwise one `pi --mode
        rpc` child, registered with the server before its first prompt, runs the step's
        turns; it and everything it started are stopped before the step ends.
        """
        if self.origin_session_id is not None:
            return self._request_in_origin_session(node, spec, ctx, self.origin_session_id)
        # `tools=None` on the node means no built-in tool beside `workflow`.
        options = PiOptions(
            spec.provider, spec.model, spec.thinking, spec.tools if spec.tools is not None else ()
        )
        from pi_workflows.pi import (  # noqa: PLC0415 - agent steps only
            BridgeConfig,
            bridge_extension_path,
            write_bridge_config,
        )

        request_id = f"request-{self.attempt_id}"
        folder = self._agent_folder()
        config = BridgeConfig(
            run_id=self.run_id,
            interaction_id=request_id,
            step=node.path,
            attempt=self.attempt_id,
            client_id=f"bridge-{self.attempt_id}",
            output_schema=spec.output_schema,
            # The bridge submits to the server itself, over its client socket.
            socket_path=None if self.state_dir is None else str(socket_path_for(self.state_dir)),
        )
        launch = PiLaunch.build(
            environ=os.environ,
            bridge=bridge_extension_path(),
            cwd=Path.cwd(),
            options=options,
            agent_dir=self.pi_agent_dir,
            tmpdir=folder / "tmp",
            extra_env=write_bridge_config(folder / "bridge.json", config),
            stderr_path=folder / "pi.stderr.log",
        )
        prompt = spec.prompt(ctx) if callable(spec.prompt) else spec.prompt
        contract = {
            "step": node.path,
            "attempt": self.attempt_id,
            "outputSchema": spec.output_schema,
            "validate": spec.validate is not None,
        }
        requested = {
            "interactionId": request_id,
            "interactionKind": "agent",
            "contractHash": sha256_digest(contract),
            "request": contract,
        }
        deadline = None if spec.timeout_ms is None else time.monotonic() + spec.timeout_ms / 1000
        result = self._request(requested, deadline)
        if "acceptedSubmissionId" in result:
            return result.get("value")
        # Presented again: the request existed already, or the server found the request
        # of this visit's interrupted attempt (a runner died mid-step).
        resumed = bool(result.get("existing") or result.get("resumed"))
        message = step_prompt(
            str(prompt), self.compiled.name, node.path, self.attempt_id, spec, resumed=resumed
        )
        return self._drive_pi(node.path, launch, message, requested=requested, deadline=deadline)

    def _request_in_origin_session(
        self, node: CompiledNode, spec: AgentNode, ctx: EngineContext, session_id: str
    ) -> Any:
        """An interactive agent step: propose the request with its step prompt; no pi here.

        The node's deadline was committed with `node.started`. The server commits the
        request and the origin session's `step` message, parks the run (waiting) and
        releases the claim: this runner then stops. A resumed runner whose request already
        has an accepted submission adopts that output instead
        (workflow-server.md § Interactive Pi execution).
        """
        prompt = spec.prompt(ctx) if callable(spec.prompt) else spec.prompt
        contract = {
            "step": node.path,
            "attempt": self.attempt_id,
            "outputSchema": spec.output_schema,
            "validate": spec.validate is not None,
        }
        text = step_prompt(str(prompt), self.compiled.name, node.path, self.attempt_id, spec)
        requested = {
            "interactionId": f"request-{self.attempt_id}",
            "interactionKind": "agent",
            "contractHash": sha256_digest(contract),
            # The server keeps the prompt as the step message's content, not the contract.
            "request": {**contract, "prompt": text},
            "targetSessionId": session_id,
        }
        deadline = None if spec.timeout_ms is None else time.monotonic() + spec.timeout_ms / 1000
        result = self._request(requested, deadline)
        if "acceptedSubmissionId" in result:
            return result.get("value")
        raise RunnerStopped("the step waits for its origin Pi session")

    def _request(self, requested: Mapping[str, Any], deadline: float | None) -> dict[str, Any]:
        """Propose the attempt's request. While an output of this step's interrupted
        attempt is still validating, the server writes nothing and says so: ask again
        until that outcome is stored (adopted if accepted), within the step's deadline
        (the server's `timed_out` ends the wait first)."""
        while True:
            reply = self.channel.send("interaction.requested", dict(requested), self.attempt_id)
            result: dict[str, Any] = reply.get("result") or {}
            if result.get("status") != "validating":
                return result
            time.sleep(min(VALIDATING_POLL_S, _left(deadline, None)))

    def _agent_folder(self) -> Path:
        """A private (0700) folder for this attempt's bridge config, pi's TMPDIR and log."""
        root = self.state_dir / "pi" if self.state_dir is not None else Path.cwd() / ".piw-pi"
        folder = root / self.run_id / self.attempt_id
        ensure_private_dir(folder / "tmp")
        return folder

    def _drive_pi(
        self,
        launch_step: str,
        launch: PiLaunch,
        message: str,
        *,
        requested: Mapping[str, Any],
        deadline: float | None,
    ) -> Any:
        """Spawn pi, register it, run turns until an accepted submission; always stop its
        tree.

        The server enforces the node's deadline (it stops the runner and pi's group and
        records `timed_out`); the runner's own wait ends `AGENT_DEADLINE_GRACE_S` later,
        a backstop that never races the server's decision.
        """
        if deadline is not None:
            deadline += AGENT_DEADLINE_GRACE_S
        child = PiChild.spawn(launch)
        registration: dict[str, Any] | None = None
        try:
            # Registered before the first prompt: pi runs no model turn until then, and
            # exits on stdin EOF if this runner dies first.
            registration = _register(self.channel, child.pid)
            child.wait_ready(_left(deadline, PI_READY_TIMEOUT_S))
            return self._turns(
                child, message, requested=requested, deadline=deadline, step=launch_step
            )
        finally:
            # abort if busy, stdin EOF, SIGTERM, SIGKILL (pi-rpc.md § 7); pi's keeper ends
            # whatever its tools daemonised as pi exits.
            child.stop()
            # Backstop: anything still below this runner (a child subreaper) is stopped
            # and reaped before the group is unregistered.
            stop_descendants()
            if registration is not None:
                self.channel.send(
                    "runner.progress", {**registration, "operation": "process.unregister"}
                )

    def _turns(
        self,
        child: PiChild,
        message: str,
        *,
        requested: Mapping[str, Any],
        deadline: float | None,
        step: str,
    ) -> Any:
        """Run turns through one child until the server holds an accepted submission.

        The bridge submits to the server and waits for its durable outcome; the runner
        never validates. A turn whose submit was accepted ends the step with the value
        the server stored (read back with a repeat of `interaction.requested`). Any
        other turn is reported to the server, which counts it durably (a resumed
        runner goes on counting) and answers: remind (1 and 2, the same child gets a
        reminder), or fail (above 2: `agentUnproductive`).
        """
        request_id = str(requested["interactionId"])
        while True:
            outcome = child.run_turn(message, _left(deadline, None))
            if bridge_accepted(outcome):
                value = self._accepted_value(requested)
                if value is not _NO_VALUE:
                    return value
            answer = self.channel.send("runner.progress", turn_ended(request_id, outcome))
            verdict = answer.get("result") or {}
            action = verdict.get("action")
            if action == "accepted":  # settled meanwhile: the server's value is the truth
                value = self._accepted_value(requested)
                if value is _NO_VALUE:
                    raise RuntimeError("the step's request settled without an accepted output")
                return value
            if action == "fail":
                last = "provider error" if outcome.provider_error else "no accepted submit"
                raise AgentUnproductive(
                    f"the agent ended {verdict.get('count')} turns without an accepted "
                    f"workflow submission (last: {last})"
                )
            reason = (
                "the model provider failed" if outcome.provider_error else _last_rejection(outcome)
            )
            message = reminder_prompt(step, self.attempt_id, reason)

    def _accepted_value(self, requested: Mapping[str, Any]) -> Any:
        """The accepted output the server stored for this attempt's request (a repeat of
        `interaction.requested` is idempotent), or `_NO_VALUE` if there is none."""
        reply = self.channel.send("interaction.requested", dict(requested), self.attempt_id)
        result = reply.get("result") or {}
        return result.get("value") if "acceptedSubmissionId" in result else _NO_VALUE

    def _finish(
        self, status: str, *, output: Any = None, error: tuple[str, str] | None = None
    ) -> None:
        payload: dict[str, Any] = {"status": status}
        if status == "completed":
            payload["output"] = output
        if error is not None:
            payload["error"] = {"code": error[0], "message": error[1][:MAX_ERROR_TEXT]}
        self.channel.send("run.finished", payload)


def _decision_summary(spec: HumanDecisionNode, ctx: EngineContext) -> str:
    """The summary a person decides on; a bad one fails the node (before any decision)."""
    text = spec.summary(ctx) if callable(spec.summary) else spec.summary
    problem = (
        label_problem(text, limit=MAX_SUMMARY_CHARS, multiline=True)
        if isinstance(text, str)
        else "is no text"
    )
    if problem is not None:
        raise ValueError(f"the human_decision summary {problem}")
    return text


def main() -> int:
    """Run one generation; the exit code is for logs only (the server decides outcomes)."""
    sys.stdout = sys.stderr  # workflow prints must never reach a protocol stream
    set_process_name(RUNNER_PROCESS_NAME)
    # Whatever a node starts stays below this process, even after `setsid`, until the
    # node's end stops it (and the zygote, a subreaper too, if this process dies first).
    become_subreaper()
    defaults = _server_default_limits()
    NodeGuard.before_load(defaults)
    # Taken out of the environment once read: workflow code, and any process it starts,
    # never sees the launch envelope, the channel's descriptor or the agent folder.
    envelope = decode_launch_envelope(os.environ.pop(LAUNCH_ENV).encode("utf-8"))
    sock = socket.socket(fileno=int(os.environ.pop(RUNNER_FD_ENV)))
    sock.setblocking(True)
    channel = Channel(sock, envelope)
    project = Path(envelope["projectPath"]) if envelope["projectPath"] else None
    agent_value = os.environ.pop(AGENT_DIR_ENV, "")
    agent_dir = Path(agent_value) if agent_value else None
    state_value = os.environ.pop(STATE_DIR_ENV, "")
    state_dir = Path(state_value) if state_value else None
    try:
        try:
            loaded = load_verified(envelope["workflowSource"], project=project, agent_dir=agent_dir)
        except SourceChangedError as exc:
            channel.send("run.parked", {"reason": "workflowSourceChanged", "detail": _text(exc)})
            return 0
        if loaded.digest != envelope["definitionDigest"]:
            channel.send(
                "run.parked",
                {"reason": "workflowSourceChanged", "detail": "the definition digest changed"},
            )
            return 0
        crash_point("runner.ready.before_send")
        channel.send("runner.ready", {"protocolVersion": 1, "definitionDigest": loaded.digest})
        command = channel.wait_command()
        payload = command["payload"]
        state = payload.get("state") or {}
        answered = payload.get("parentAttemptId")
        if answered is None and command.get("command") == "continue":
            finished = state.get("finished") or []  # the answered checkpoint comes last
            answered = finished[-1].get("attemptId") if finished else None
        guard = NodeGuard((node.limits for node in loaded.compiled.nodes.values()), defaults)
        Execution(
            channel,
            loaded.compiled,
            envelope,
            state,
            answered_checkpoint=answered,
            guard=guard,
            state_dir=state_dir,
            pi_agent_dir=agent_dir,
        ).run()
        return 0
    except ClaimLost:
        return EXIT_CLAIM_LOST
    except Refused:
        traceback.print_exc()
        return EXIT_PROTOCOL
    finally:
        stop_descendants()  # nothing a node started outlives its runner


def _server_default_limits() -> Limits:
    """The server's default limits, taken out of the environment like the launch's."""
    try:
        limits = default_limits()
    except ValueError:  # the server checked them at start; a hand-made launch may not
        limits = Limits()
    for name in (MEMORY_ENV, PROCESSES_ENV):
        os.environ.pop(name, None)
    return limits


def _exit(code: int) -> NoReturn:
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
