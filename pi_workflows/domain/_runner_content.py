"""Measured runner frames: oversized values travel as digest-bound content references.

Implements workflow-server.md § Process supervision ("Before the server sends a reply,
it measures the encoded response"): a reply's `result` or a command's `payload.state`
over `INLINE_FRAME_LIMIT` is stored in the blob store in the same transaction, and the
frame carries a `contentRef` the runner reads back in 512 KiB parts with `content.read`.

The other way, a runner whose value is too large for one frame (a node output or error,
an effect request or result, a prompt) sends it first as `content.write` parts, each
stored as a blob, and then names it with an `uploadRef`: `resolve_upload` reads the
parts back and checks them (and the value cap, `PI_WORKFLOWS_MAX_VALUE_BYTES`) before
the value is used as if it had come inline.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Collection
from typing import Any

import msgspec
from msgspec import UNSET

from pi_workflows.storage import (
    CONTENT_PART_BYTES,
    ContentUnavailableError,
    Database,
    Tx,
    put_blob,
    read_blob,
    read_blob_part,
)
from pi_workflows.wire.canonical import CanonicalJSONError, dumps, loads
from pi_workflows.wire.framing import MAX_FRAME_BYTES
from pi_workflows.wire.runner import (
    MAX_VALUE_ENV,
    ContentPart,
    ContentRef,
    RunnerCommand,
    RunnerReply,
    ServerFrame,
    UploadRef,
    max_value_bytes,
)

__all__ = [
    "CONTENT_MEDIA_TYPE",
    "INLINE_FRAME_LIMIT",
    "PartAnswer",
    "UploadRejectedError",
    "bounded",
    "read_part",
    "resolve_upload",
    "write_part",
]

INLINE_FRAME_LIMIT = MAX_FRAME_BYTES - 64 * 1024
"""The largest encoded reply or command sent whole; a larger one carries its result (or
state) as a digest-bound blob reference that the runner reads with `content.read`."""

CONTENT_MEDIA_TYPE = "application/json"
"""The media type of every referenced value: the canonical JSON of the logical result."""

PartAnswer = tuple[str, ContentPart | None, tuple[str, str] | None]
"""A `content.read` answer: (outcome, result, error)."""


def _reference(tx: Tx, offered: set[str], value: Any) -> ContentRef:
    data = dumps(value)
    digest = put_blob(tx, data)
    offered.add(digest)
    return ContentRef(media_type=CONTENT_MEDIA_TYPE, byte_count=len(data), digest=digest)


def bounded(tx: Tx, offered: set[str], frame: ServerFrame) -> dict[str, Any]:
    """The wire form of `frame`, measured: whole when it fits inline; else its large part
    stored as a blob in this transaction and named by reference.

    A reply's `result` becomes `resultRef`; a command's `payload.state` becomes
    `payload.stateRef`. Each digest sent is added to `offered`: what the runner may read.
    """
    wire = frame.to_wire()
    if len(dumps(wire)) <= INLINE_FRAME_LIMIT:
        return wire
    if isinstance(frame, RunnerReply) and "result" in wire:
        ref = _reference(tx, offered, wire["result"])
        return msgspec.structs.replace(frame, result=UNSET, result_ref=ref).to_wire()
    if isinstance(frame, RunnerCommand) and "state" in wire["payload"]:
        return frame.with_state_ref(_reference(tx, offered, wire["payload"]["state"])).to_wire()
    return wire


def read_part(
    db: Database, offered: Collection[str], digest: str, offset: int, length: int
) -> PartAnswer:
    """One bounded part of a value this runner was sent by reference (base64)."""
    if digest not in offered:
        return (
            "notFound",
            None,
            (
                "contentUnavailable",
                f"content {digest} was not offered to this runner",
            ),
        )
    try:
        part = read_blob_part(db, digest, offset, length)
    except ContentUnavailableError as exc:
        outcome = "notFound" if exc.reason == "notFound" else "rejected"
        return outcome, None, ("contentUnavailable", str(exc))
    except ValueError as exc:  # a length outside 1..512 KiB
        return "rejected", None, ("contentUnavailable", str(exc))
    data = base64.b64encode(part).decode("ascii")
    return "accepted", ContentPart(offset=offset, data=data), None


class UploadRejectedError(ValueError):
    """An `uploadRef` names parts this runner did not write, or they do not add up to
    its byte count, digest and JSON. The message names the check, never the content."""


def write_part(tx: Tx, data: str) -> str:
    """Store one `content.write` part (base64) as a blob and return its digest.

    Each part is content-addressed and idempotent: a retried write stores nothing new.
    Parts that no value ever names stay as unreferenced transfer content.

    Raises:
        UploadRejectedError: the part is not base64, or not 1..512 KiB.
    """
    try:
        part = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise UploadRejectedError("the part is not base64") from None
    if not 0 < len(part) <= CONTENT_PART_BYTES:
        raise UploadRejectedError(f"a part is 1..{CONTENT_PART_BYTES} bytes, not {len(part)}")
    return put_blob(tx, part)


def resolve_upload(
    tx: Tx, offered: Collection[str], ref: UploadRef, max_bytes: int | None = None
) -> tuple[Any, bytes]:
    """The JSON value an `uploadRef` names, and its canonical bytes, read from its parts.

    Memory: the value's bytes (at most `max_bytes`, default the value cap) and the
    parsed value.

    Raises:
        UploadRejectedError: more bytes than the value cap, a part this runner did not
            write (`offered`), a part that is missing or of the wrong length, a byte
            count or digest that does not match, or bytes that are not canonical JSON.
    """
    cap = max_value_bytes() if max_bytes is None else max_bytes
    if not 0 < ref.byte_count <= cap:
        raise UploadRejectedError(
            f"a value of {ref.byte_count} bytes is over the cap of {cap} bytes ({MAX_VALUE_ENV})"
        )
    expected = -(-ref.byte_count // CONTENT_PART_BYTES)
    if len(ref.parts) != expected:
        raise UploadRejectedError(f"{len(ref.parts)} parts for {ref.byte_count} bytes")
    hasher = hashlib.sha256()
    chunks: list[bytes] = []
    for index, digest in enumerate(ref.parts):
        if digest not in offered:
            raise UploadRejectedError(f"part {index} was not written by this runner")
        try:
            part = read_blob(tx, digest)
        except ContentUnavailableError as exc:
            raise UploadRejectedError(f"part {index}: {exc.reason}") from None
        last = index == expected - 1
        size = ref.byte_count - CONTENT_PART_BYTES * index if last else CONTENT_PART_BYTES
        if len(part) != size:
            raise UploadRejectedError(f"part {index} has {len(part)} bytes, not {size}")
        hasher.update(part)
        chunks.append(part)
    if "sha256:" + hasher.hexdigest() != ref.digest:
        raise UploadRejectedError("the parts do not match the digest")
    data = b"".join(chunks)
    try:
        return loads(data), data
    except CanonicalJSONError:
        raise UploadRejectedError("the value is not canonical JSON") from None
