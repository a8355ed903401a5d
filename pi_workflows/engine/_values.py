"""Values by reference, runner side: the value cap, uploads, and verified reads.

Implements workflow-server.md § Runner protocol: no frame over 1 MiB. A larger value is
written first as `content.write` parts and named by an `uploadRef`; one over the value
cap (`PI_WORKFLOWS_MAX_VALUE_BYTES`) is refused before anything is sent."""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from typing import Any, Final

import msgspec

from pi_workflows.wire.canonical import CanonicalJSONError, dumps, loads
from pi_workflows.wire.protocol import ProtocolViolation
from pi_workflows.wire.runner import (
    INLINE_VALUE_BYTES,
    MAX_VALUE_ENV,
    UNSET,
    UPLOAD_PART_BYTES,
    ContentPart,
    ContentRef,
    RunnerError,
    RunnerPayload,
    RunnerReply,
    UploadRef,
    result_as,
)

__all__ = [
    "CONTENT_MEDIA_TYPE",
    "CONTENT_PARK_REASON",
    "CONTENT_PART_BYTES",
    "MAX_CONTENT_BYTES",
    "MAX_ERROR_TEXT",
    "ContentFailed",
    "OutputTooLarge",
    "ValueTooLarge",
    "checked_output",
    "encode_part",
    "fit_error",
    "part_digest",
    "read_reference",
    "upload_ref",
    "values_by_reference",
]

CONTENT_MEDIA_TYPE: Final = "application/json"
CONTENT_PART_BYTES: Final = UPLOAD_PART_BYTES
"""The most bytes one `content.read` asks for, and one `content.write` carries."""
MAX_CONTENT_BYTES: Final = 256 * 1024 * 1024
"""The largest referenced value a runner reads; a larger reference is refused unread."""
CONTENT_PARK_REASON: Final = "contentUnavailable"
MAX_ERROR_TEXT: Final = 4000
"""The bound of a runner's own short texts: a park detail, a routing failure."""
INLINE_ERROR_CHARS: Final = 16384
"""runner.v1 bounds an inline error's `message` and `traceback` to this many characters."""


class ContentFailed(Exception):  # noqa: N818
    """A value the server sent by reference could not be read and verified.

    `code` is one of `invalidMediaType`, `wrongLength`, `contentTooLarge`,
    `contentUnavailable` (the server refused the read: missing content, bad range),
    `badPart`, `digestMismatch` or `malformedJson`. The message is bounded.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}"[:MAX_ERROR_TEXT])
        self.code = code


class ValueTooLarge(ValueError):  # noqa: N818 - the failure code, valueTooLarge
    """A value is over the value cap: it cannot be sent at all; its node fails."""

    code = "valueTooLarge"


class OutputTooLarge(ValueTooLarge):
    """A node output over the value cap; the node fails with `outputTooLarge`."""

    code = "outputTooLarge"


def _over_cap(what: str, size: int, cap: int) -> str:
    return (
        f"the {what} is {size} bytes of JSON; at most {cap} bytes may be sent "
        f"(the value cap, {MAX_VALUE_ENV})"
    )


def checked_output(output: Any, cap: int) -> bytes:
    """The canonical JSON of a node output of at most `cap` bytes (the value cap).

    Raises:
        NotSerializableError: the output is not plain JSON.
        OutputTooLarge: more than `cap` bytes of canonical JSON.
    """
    data = dumps(output)
    if len(data) > cap:
        raise OutputTooLarge(_over_cap("node output", len(data), cap))
    return data


# --- sending --------------------------------------------------------------------------------


def values_by_reference(
    body: RunnerPayload, cap: int, upload: Callable[[bytes], UploadRef]
) -> RunnerPayload:
    """`body` with every value too large for one frame uploaded and named by reference.

    Raises:
        ValueTooLarge: a value (not an error: that is cut to fit) is over `cap`.
    """
    changes: dict[str, Any] = {}
    for name in body.referable:
        value = getattr(body, name)
        if value is UNSET:
            continue
        if isinstance(value, RunnerError):
            if _error_fits_inline(value):
                continue
            ref = upload(dumps(msgspec.to_builtins(fit_error(value, cap))))
        else:
            data = dumps(value)
            if len(data) > cap:
                error = OutputTooLarge if name == "output" else ValueTooLarge
                raise error(_over_cap(f"{body.kind} {name}", len(data), cap))
            if len(data) <= INLINE_VALUE_BYTES:
                continue
            ref = upload(data)
        changes[name] = UNSET
        changes[f"{name}_ref"] = ref
    return msgspec.structs.replace(body, **changes) if changes else body


def _error_fits_inline(error: RunnerError) -> bool:
    traceback = error.traceback if isinstance(error.traceback, str) else ""
    return len(error.message) <= INLINE_ERROR_CHARS and len(traceback) <= INLINE_ERROR_CHARS


def fit_error(error: RunnerError, cap: int) -> RunnerError:
    """`error` itself, or (over the value cap) with its message and traceback cut until
    its JSON fits, each cut named: a node that failed still reports why."""
    size = len(dumps(msgspec.to_builtins(error)))
    while size > cap:
        traceback = error.traceback if isinstance(error.traceback, str) else ""
        name = "message" if len(error.message) >= len(traceback) else "traceback"
        text: str = getattr(error, name)
        keep = len(text) // 2
        note = f" … ({len(text) - keep} characters cut: over {cap} bytes, {MAX_VALUE_ENV})"
        cut = text[:keep] + note if name == "message" else "…" + text[-keep:]
        error = msgspec.structs.replace(error, **{name: cut})
        size = len(dumps(msgspec.to_builtins(error)))
    return error


def upload_ref(
    data: bytes, uploaded: dict[str, UploadRef], write_part: Callable[[bytes], str]
) -> UploadRef:
    """Write `data` as parts of at most 512 KiB (`write_part` returns each part's digest)
    and name it; the last value uploaded (`uploaded`, by digest) is not written again."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    known = uploaded.get(digest)
    if known is not None:
        return known
    parts = tuple(
        write_part(data[offset : offset + CONTENT_PART_BYTES])
        for offset in range(0, len(data), CONTENT_PART_BYTES)
    )
    ref = UploadRef(byte_count=len(data), digest=digest, parts=parts)
    uploaded.clear()
    uploaded[digest] = ref
    return ref


def part_digest(part: bytes) -> str:
    return "sha256:" + hashlib.sha256(part).hexdigest()


def encode_part(part: bytes) -> str:
    return base64.b64encode(part).decode("ascii")


# --- reading ----------------------------------------------------------------------------------


def read_reference(ref: ContentRef, read_part: Callable[[str, int, int], RunnerReply]) -> Any:
    """Read a referenced JSON value in parts of at most 512 KiB and verify it.

    Every part must start where the last ended and have the length asked for; the
    whole must have the reference's byte count and SHA-256 digest, and be canonical JSON.

    Raises:
        ContentFailed: a bounded failure (see its codes); nothing is half-used.
    """
    if ref.media_type != CONTENT_MEDIA_TYPE:
        raise ContentFailed("invalidMediaType", f"{ref.media_type[:128]!r} is not JSON")
    total = ref.byte_count
    if total > MAX_CONTENT_BYTES:
        raise ContentFailed(
            "contentTooLarge", f"{total} bytes is more than {MAX_CONTENT_BYTES} bytes"
        )
    hasher = hashlib.sha256()
    parts: list[bytes] = []
    offset = 0
    while offset < total:
        length = min(CONTENT_PART_BYTES, total - offset)
        part = _decoded_part(read_part(ref.digest, offset, length), offset)
        if len(part) != length:
            raise ContentFailed(
                "wrongLength", f"the part at {offset} has {len(part)} bytes, not {length}"
            )
        hasher.update(part)
        parts.append(part)
        offset += length
    if "sha256:" + hasher.hexdigest() != ref.digest:
        raise ContentFailed("digestMismatch", f"the {total} bytes read do not match {ref.digest}")
    try:
        return loads(b"".join(parts))
    except CanonicalJSONError as exc:
        raise ContentFailed("malformedJson", str(exc)[:200]) from None


def _decoded_part(reply: RunnerReply, offset: int) -> bytes:
    """The bytes of one `content.read` result: `{"offset": offset, "data": base64}`."""
    try:
        part = result_as(reply, ContentPart)
    except ProtocolViolation:
        raise ContentFailed("badPart", f"the reply to the read at {offset} is no part") from None
    if part.offset != offset:
        raise ContentFailed("badPart", f"the reply to the read at {offset} is not that part")
    try:
        return base64.b64decode(part.data, validate=True)
    except (binascii.Error, ValueError):
        raise ContentFailed("badPart", f"the part at {offset} is not base64") from None
