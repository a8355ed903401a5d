"""Measured runner frames: oversized values travel as digest-bound content references.

Implements workflow-server.md § Process supervision ("Before the server sends a reply,
it measures the encoded response"): a reply's `result` or a command's `payload.state`
over `INLINE_FRAME_LIMIT` is stored in the blob store in the same transaction, and the
frame carries a `contentRef` the runner reads back in 512 KiB parts with `content.read`.
"""

from __future__ import annotations

import base64
from collections.abc import Collection
from typing import Any

from pi_workflows.storage import ContentUnavailableError, Database, Tx, put_blob, read_blob_part
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.framing import MAX_FRAME_BYTES

__all__ = ["CONTENT_MEDIA_TYPE", "INLINE_FRAME_LIMIT", "ContentPart", "bounded", "read_part"]

INLINE_FRAME_LIMIT = MAX_FRAME_BYTES - 64 * 1024
"""The largest encoded reply or command sent whole; a larger one carries its result (or
state) as a digest-bound blob reference that the runner reads with `content.read`."""

CONTENT_MEDIA_TYPE = "application/json"
"""The media type of every referenced value: the canonical JSON of the logical result."""

ContentPart = tuple[str, Any, tuple[str, str] | None]
"""A `content.read` answer: (outcome, result, error)."""


def _reference(tx: Tx, offered: set[str], value: Any) -> dict[str, Any]:
    data = dumps(value)
    digest = put_blob(tx, data)
    offered.add(digest)
    return {"mediaType": CONTENT_MEDIA_TYPE, "byteCount": len(data), "digest": digest}


def bounded(tx: Tx, offered: set[str], frame: dict[str, Any]) -> dict[str, Any]:
    """`frame` itself when it fits inline; else its large part replaced by a reference.

    A reply's `result` becomes `resultRef`; a command's `payload.state` becomes
    `payload.stateRef`. Each digest sent is added to `offered`: what the runner may read.
    """
    if len(dumps(frame)) <= INLINE_FRAME_LIMIT:
        return frame
    if frame["kind"] == "reply" and "result" in frame:
        smaller = {key: value for key, value in frame.items() if key != "result"}
        smaller["resultRef"] = _reference(tx, offered, frame["result"])
        return smaller
    payload = frame.get("payload")
    if frame["kind"] == "command" and isinstance(payload, dict) and "state" in payload:
        rest = {key: value for key, value in payload.items() if key != "state"}
        rest["stateRef"] = _reference(tx, offered, payload["state"])
        return {**frame, "payload": rest}
    return frame


def read_part(
    db: Database, offered: Collection[str], digest: str, offset: int, length: int
) -> ContentPart:
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
    return "accepted", {"offset": offset, "data": base64.b64encode(part).decode("ascii")}, None
