"""The runner's end of its private channel: typed runner.v1 records out, replies in.

Implements workflow-server.md § Runner protocol, runner side. Every frame the server
sends is checked once, here, into its record (`decode_server_frame`); every message goes
out as a record. Values too large for one frame travel by reference (`_values.py`).
"""

from __future__ import annotations

import itertools
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import msgspec

from pi_workflows.engine._values import (
    CONTENT_PARK_REASON,
    MAX_ERROR_TEXT,
    ContentFailed,
    encode_part,
    part_digest,
    read_reference,
    upload_ref,
    values_by_reference,
)
from pi_workflows.supervision import RUNNER_SENT_KINDS, crash_point
from pi_workflows.wire.framing import SocketFrameReader
from pi_workflows.wire.protocol import ProtocolViolation
from pi_workflows.wire.runner import (
    DEFAULT_MAX_VALUE_BYTES,
    UNSET,
    ContentRead,
    ContentRef,
    ContentWrite,
    ContentWritten,
    RunnerAddress,
    RunnerCommand,
    RunnerMessage,
    RunnerPayload,
    RunnerReply,
    RunParked,
    RunState,
    StartedVisit,
    UploadRef,
    decode_server_frame,
    result_as,
)

__all__ = ["Channel", "ClaimLost", "NodePlace", "Refused", "RunnerStopped"]

_T = TypeVar("_T")


class ClaimLost(Exception):  # noqa: N818 - the design's own name for the handoff
    """The server fenced this runner: stop at once, write nothing more."""


class Refused(Exception):  # noqa: N818
    """The server refused a message; the runner cannot go on."""


class RunnerStopped(ClaimLost):
    """The runner handed its run back (parked it) and must stop, writing nothing more."""


class Channel:
    """Request/reply over the private channel: `send` waits for its reply; `post` (pure
    progress) is answered later, and every answer is checked before the next `send`."""

    def __init__(
        self,
        sock: socket.socket,
        address: RunnerAddress,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        self._sock = sock
        self._reader = SocketFrameReader(sock)
        self.address = address
        self.max_value_bytes = max_value_bytes
        """The value cap (`PI_WORKFLOWS_MAX_VALUE_BYTES`) the server enforces too."""
        self._ids = itertools.count(1)
        self.revision = 0
        self.pending_command: RunnerCommand | None = None
        self._unanswered: dict[str, tuple[str, int | None]] = {}
        """Posted messages whose replies have not been read: kind and expected visit."""
        self._uploaded: dict[str, UploadRef] = {}
        """The last value sent by reference, by digest: a shell result is named three
        times (settle, node finished, run finished) and written once."""
        self.proposals = 0
        """Messages made so far that the server keeps a reply for when it accepts them
        (all but content reads and writes): what `run.finished` counts as `receipts`."""

    # --- messages -------------------------------------------------------------------------

    def send(self, body: RunnerPayload, attempt_id: str | None = None) -> RunnerReply:
        """Send one message and return its accepted reply, its result read in full.

        A result the server sent by reference (`resultRef`) is read in bounded parts
        and verified; the returned reply carries it as `result`.

        Raises:
            ValueTooLarge: a value of `body` is over the value cap; nothing was sent.
            ClaimLost: the server answered with claim loss.
            RunnerStopped: a referenced result could not be read; the run was parked
                with `contentUnavailable`.
            Refused: any other refusal.
        """
        answer = self._exchange(self._by_reference(body), attempt_id)
        if not isinstance(answer.result_ref, ContentRef):
            return answer
        value = self._resolve(answer.result_ref, f"the reply to {body.kind}")
        return msgspec.structs.replace(answer, result=value, result_ref=UNSET)

    def send_behind_posts(self, body: RunnerPayload) -> RunnerReply:
        """`send` without waiting first for the answers to the posted messages, so the
        server can commit them together. Only for a message the server refuses unless
        every earlier one was accepted (`run.finished` with its `receipts`); the posted
        answers are still read and checked, before its own.

        Raises:
            ClaimLost, Refused: as `send` (a refused posted message included).
        """
        return self._exchange(self._by_reference(body), behind_posts=True)

    def ask(self, body: RunnerPayload, result_type: type[_T], attempt_id: str | None = None) -> _T:
        """`send`, and the accepted reply's result as its record.

        Raises:
            Refused: the result is not one (as well as what `send` raises).
        """
        reply = self.send(body, attempt_id)
        try:
            return result_as(reply, result_type)
        except ProtocolViolation as exc:
            raise Refused(f"{body.kind}: {exc}") from None

    def post(
        self, body: RunnerPayload, attempt_id: str | None = None, *, visit: int | None = None
    ) -> None:
        """Send a message of pure progress without waiting for its reply.

        The server applies a runner's messages in order; the replies are read at the
        next `send` or `flush`, and a refusal then stops the runner there. Only progress
        that may repeat goes this way (a pure node's start and finish): the runner waits
        for every answer before an effect, a wait, an interaction or the end of the run.
        `visit`: the visit a pipelined `node.started` reply must carry.
        """
        message = self._message(self._by_reference(body), attempt_id)
        self._write(message)
        self._unanswered[message.message_id] = (body.kind, visit)

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

    def wait_command(self) -> tuple[RunnerCommand, RunState]:
        """Return the one command the server sends after `runner.ready`, and its state.

        A state sent by reference (`stateRef`) is read and verified first.

        Raises:
            ClaimLost: the server closed the channel.
            RunnerStopped: the referenced state could not be read; the run was parked.
        """
        while self.pending_command is None:
            answer = self._read_answer()
            if answer is None:
                continue
        command = self.pending_command
        self.revision = command.expected_revision
        ref = command.payload.state_ref
        if not isinstance(ref, ContentRef):
            return command, command.run_state()
        value = self._resolve(ref, "the run state")
        try:
            return command, command.run_state(value)
        except ProtocolViolation:
            self._hand_back(ContentFailed("malformedJson", "not a run state"), "the run state")

    def read_content(self, ref: ContentRef) -> Any:
        """Read a referenced JSON value in verified parts (see `read_reference`).

        Raises:
            ContentFailed: a bounded failure; nothing is half-used.
            ClaimLost: the server answered a read with claim loss.
        """
        return read_reference(ref, self._read_part)

    # --- values by reference ----------------------------------------------------------------

    def _by_reference(self, body: RunnerPayload) -> RunnerPayload:
        """`body`, with each value too large for one frame written first as `content.write`
        parts and named by reference.

        Raises:
            ValueTooLarge: a value is over the cap; nothing was sent.
        """
        return values_by_reference(body, self.max_value_bytes, self._upload)

    def _upload(self, data: bytes) -> UploadRef:
        """Write `data` in parts of at most 512 KiB; its `uploadRef`."""
        return upload_ref(data, self._uploaded, self._write_part)

    def _write_part(self, part: bytes) -> str:
        written = self._ask_raw(ContentWrite(data=encode_part(part)), ContentWritten)
        expected = part_digest(part)
        if written.digest != expected:
            raise Refused(f"content.write: the server stored {written.digest}, not {expected}")
        # A runner killed here leaves parts that no message names: the node runs again.
        crash_point("runner.content.after_write")
        return expected

    def _read_part(self, digest: str, offset: int, length: int) -> RunnerReply:
        try:
            return self._exchange(ContentRead(digest=digest, offset=offset, length=length))
        except Refused as exc:
            raise ContentFailed("contentUnavailable", str(exc)) from None

    def _resolve(self, ref: ContentRef, what: str) -> Any:
        try:
            return self.read_content(ref)
        except ContentFailed as exc:
            self._hand_back(exc, what)

    def _hand_back(self, exc: ContentFailed, what: str) -> NoReturn:
        """Park the run for review with a bounded reason, then stop (never a traceback)."""
        detail = f"{what}: {exc}"[:MAX_ERROR_TEXT]
        self._exchange(RunParked(reason=CONTENT_PARK_REASON, detail=detail))
        raise RunnerStopped(f"{CONTENT_PARK_REASON}: {exc.code}")

    # --- the exchange -----------------------------------------------------------------------

    def _ask_raw(self, body: RunnerPayload, result_type: type[_T]) -> _T:
        reply = self._exchange(body)
        try:
            return result_as(reply, result_type)
        except ProtocolViolation as exc:
            raise Refused(f"{body.kind}: {exc}") from None

    def _message(self, body: RunnerPayload, attempt_id: str | None) -> RunnerMessage:
        address = self.address
        if not isinstance(body, ContentRead | ContentWrite):  # those keep no reply
            self.proposals += 1
        return RunnerMessage(
            run_id=address.run_id,
            generation=address.generation,
            runner_epoch=address.runner_epoch,
            message_id=f"{address.runner_epoch}-m{next(self._ids)}",
            expected_revision=self.revision,
            body=body,
            attempt_id=attempt_id,
        )

    def _write(self, message: RunnerMessage) -> None:
        self._sock.sendall(message.encode() + b"\n")
        crash_point("runner.message.after_send")
        kind = message.kind
        if kind in RUNNER_SENT_KINDS:  # a content read or write has no point of its own
            crash_point(f"runner.message.{kind.replace('.', '_')}.after_send")

    def _read_answer(self) -> RunnerReply | None:
        """The next reply from the server (a command is kept for `wait_command`)."""
        raw = self._reader.read_message()
        if raw is None:
            raise ClaimLost("the server closed the channel")
        frame = decode_server_frame(raw)
        if isinstance(frame, RunnerCommand):
            self.pending_command = frame
            return None
        return frame

    def _settle_posted(self, answer: RunnerReply) -> None:
        posted = self._unanswered.pop(answer.reply_to, None)
        if posted is None:
            return
        kind, visit = posted
        accepted = self._accepted(kind, answer)
        if visit is None:
            return
        try:
            counted = result_as(accepted, StartedVisit).visit
        except ProtocolViolation:
            counted = None
        if counted != visit:
            raise Refused(f"{kind}: the server's visit is {counted!r}, not {visit!r}")

    def _accepted(self, kind: str, answer: RunnerReply) -> RunnerReply:
        if answer.outcome == "claimLost":
            self._unanswered.clear()  # the rest were refused too: nothing more is written
            error = answer.error
            raise ClaimLost(error.code if error is not UNSET else "claimLost")
        if not answer.ok:
            error = answer.error
            said = f"{error.code} {error.message}" if error is not UNSET else ""
            raise Refused(f"{kind}: {answer.outcome} {said}")
        if isinstance(answer.revision, int) and answer.revision:
            self.revision = answer.revision
        return answer

    def _exchange(
        self, body: RunnerPayload, attempt_id: str | None = None, *, behind_posts: bool = False
    ) -> RunnerReply:
        """Send one message and return its accepted reply as it came (no reference read).

        The posted messages are answered first (`flush`), unless `behind_posts`: then
        their answers are read, and checked, on the way to this one's."""
        if not behind_posts:
            self.flush()
        message = self._message(body, attempt_id)
        self._write(message)
        while True:
            answer = self._read_answer()
            if answer is None:
                continue
            if answer.reply_to in self._unanswered:
                self._settle_posted(answer)
                continue
            if answer.reply_to != message.message_id:
                continue
            return self._accepted(body.kind, answer)


@dataclass(frozen=True, slots=True)
class NodePlace:
    """Where one node attempt runs: the channel, the run and attempt, the folders."""

    channel: Channel
    run_id: str
    workflow: str
    """The compiled workflow's name (an agent step's contract names it)."""
    attempt_id: str
    origin_session_id: str | None = None
    """The Pi session an interactive run is bound to: its agent steps run there."""
    state_dir: Path | None = None
    """The server's state folder: agent steps keep pi's private files under it."""
    pi_agent_dir: Path | None = None
    """Pi's agent folder (`models.json`, `auth.json`, `settings.json`)."""
