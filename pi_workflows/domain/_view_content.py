"""View content: digest-bound references in the run view, and `view.content` chunks.

Implements workflow-server.md § Live run view and client-protocol.md § Run and session
views for referenced content. A value above the 16 KiB inline threshold is shown as
`{"ref": ContentRef, "preview": str}`; the reference names bytes stored in
`run_view_content` under the exact run ID, digest and media type. Those bytes are
written in the same transaction as the value they copy (storage `store_view_blob`,
`store_view_text`), so a view built from any later snapshot finds them; a builder
that does not find them says `unavailable` and never advertises the reference.

`view.content` returns one base64 chunk of at most 256 KiB per request, read from the
stored row and not verified here: the client assembles the chunks and verifies them
against the response digest and the advertised reference (wire/hydrate.py), so a
damaged row is detected where it would be shown.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from pi_workflows.storage import (
    VIEW_INLINE_BYTES,
    VIEW_JSON_MEDIA_TYPE,
    VIEW_TEXT_MEDIA_TYPE,
    ContentRef,
    ContentUnavailableError,
    Reader,
    blob_length,
    content_digest,
    get_run,
    read_blob,
    read_blob_part,
    read_view_content_part,
    view_content_length,
)

__all__ = [
    "CHUNK_BYTES",
    "PREVIEW_BYTES",
    "ViewRequestError",
    "json_blob_value",
    "json_text_value",
    "long_text",
    "stored_ref",
    "view_content",
    "wire_ref",
]

CHUNK_BYTES: Final = 256 * 1024
"""The most content bytes one `view.content` response carries (before base64)."""
PREVIEW_BYTES: Final = 1024
"""How much of a referenced value the view previews."""
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_MEDIA_TYPE_CHARS: Final = 256


class ViewRequestError(Exception):
    """A `view.page` or `view.content` request the server answers with an error."""

    def __init__(self, outcome: str, code: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.code = code


def wire_ref(ref: ContentRef) -> dict[str, Any]:
    """The wire form of a server-created reference (client-protocol.md: media type,
    byte count, SHA-256 digest and the opaque server marker)."""
    return {
        "digest": ref.digest,
        "mediaType": ref.media_type,
        "byteCount": ref.byte_length,
        "marker": "server",
    }


def stored_ref(reader: Reader, run_id: str, digest: str, media_type: str) -> dict[str, Any] | None:
    """The reference to exactly this run's stored content, or None when it is not
    stored (one primary-key lookup): a view names only content it found."""
    ref = ContentRef(run_id, digest, media_type, 0)
    try:
        length = view_content_length(reader, ref)
    except ContentUnavailableError:
        return None
    return wire_ref(ContentRef(run_id, digest, media_type, length))


def _preview(data: bytes) -> str:
    return data[:PREVIEW_BYTES].decode("utf-8", "ignore")


def _referenced(
    reader: Reader, run_id: str, digest: str, media_type: str, preview: str
) -> dict[str, Any]:
    ref = stored_ref(reader, run_id, digest, media_type)
    if ref is None:
        return {"unavailable": "notStored"}
    return {"ref": ref, "preview": preview}


def json_blob_value(reader: Reader, run_id: str, digest: str) -> dict[str, Any]:
    """A JSON blob (an attempt's or run's output): inline up to the threshold, else a
    reference to its copy in the run's view content."""
    try:
        length = blob_length(reader, digest)
        if length <= VIEW_INLINE_BYTES:
            return {"value": json.loads(read_blob(reader, digest))}
        preview = _preview(read_blob_part(reader, digest, 0, min(length, PREVIEW_BYTES)))
    except ContentUnavailableError as exc:
        return {"unavailable": exc.reason}
    return _referenced(reader, run_id, digest, VIEW_JSON_MEDIA_TYPE, preview)


def json_text_value(reader: Reader, run_id: str, text: str) -> dict[str, Any]:
    """A JSON value held as text (the run's input, an inline run output), the same way;
    its stored bytes are exactly `text` in UTF-8."""
    data = text.encode("utf-8")
    if len(data) <= VIEW_INLINE_BYTES:
        return {"value": json.loads(text)}
    return _referenced(reader, run_id, content_digest(data), VIEW_JSON_MEDIA_TYPE, _preview(data))


def long_text(
    reader: Reader, run_id: str, text: str, media_type: str = VIEW_TEXT_MEDIA_TYPE
) -> tuple[str, dict[str, Any] | None]:
    """A text (a reason, an error): `(text, None)` inline up to the threshold, else
    `(its first 1 KiB, reference)`; the reference is None only if it is not stored."""
    data = text.encode("utf-8")
    if len(data) <= VIEW_INLINE_BYTES:
        return text, None
    return _preview(data), stored_ref(reader, run_id, content_digest(data), media_type)


# --- view.content ------------------------------------------------------------------------


def _content_request(payload: Mapping[str, Any]) -> tuple[str, str, int]:
    digest, media_type, offset = (
        payload.get("digest"),
        payload.get("mediaType"),
        payload.get("offset", 0),
    )
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise ViewRequestError("rejected", "invalidDigest", "payload.digest is sha256:<64 hex>")
    if not isinstance(media_type, str) or not 0 < len(media_type) <= _MEDIA_TYPE_CHARS:
        raise ViewRequestError(
            "rejected", "invalidMediaType", "payload.mediaType is 1 to 256 characters"
        )
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ViewRequestError("rejected", "invalidOffset", "payload.offset is an integer >= 0")
    return digest, media_type, offset


def view_content(reader: Reader, run_id: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """`view.content`: one chunk of this run's stored content from `offset`.

    Raises:
        ViewRequestError: `runNotFound`; `contentUnavailable` (not this run's content,
            or not under this media type); a malformed request or offset.
    """
    digest, media_type, offset = _content_request(payload)
    if get_run(reader, run_id) is None:
        raise ViewRequestError("notFound", "runNotFound", f"no run {run_id}")
    ref = ContentRef(run_id, digest, media_type, 0)
    try:
        total = view_content_length(reader, ref)
        if offset > total or (offset == total and total > 0):
            raise ViewRequestError("rejected", "invalidOffset", f"offset past the {total} bytes")
        data = read_view_content_part(reader, ref, offset, CHUNK_BYTES) if total else b""
    except ContentUnavailableError:
        raise ViewRequestError(
            "unavailable",
            "contentUnavailable",
            "this run has no content under that digest and media type",
        ) from None
    receipt: dict[str, Any] = {
        "digest": digest,
        "mediaType": media_type,
        "byteCount": total,
        "offset": offset,
        "data": base64.b64encode(data).decode("ascii"),
    }
    if offset + len(data) < total:
        receipt["nextOffset"] = offset + len(data)
    return receipt
