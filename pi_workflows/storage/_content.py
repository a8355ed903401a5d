"""Content-addressed blobs and run view content, read in bounded, verified parts.

Implements workflow-server.md § Process supervision (digest-bound references read in
512 KiB parts) and § Live run view (`run_view_content` keyed by exact run ID, digest
and media type; a read under any other run or media type is unavailable).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pi_workflows.storage import _queries as q
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._errors import ContentUnavailableError
from pi_workflows.wire.canonical import InvalidJSONError, NonCanonicalError, dumps, loads

__all__ = [
    "BLOB_REFRESH_MS",
    "CONTENT_PART_BYTES",
    "SELECT_CONTENT_PART",
    "ContentRef",
    "blob_length",
    "content_digest",
    "iter_blob_parts",
    "iter_view_content_parts",
    "put_blob",
    "put_json_blob",
    "put_view_content",
    "read_blob",
    "read_blob_part",
    "read_json_blob",
    "read_view_content",
    "read_view_content_part",
    "view_content_length",
]

CONTENT_PART_BYTES = 512 * 1024
"""The largest part one read returns (and the size of every part but the last)."""


_JSON_MEDIA_TYPE = "application/json"
"""The media type of a run's JSON view content (and of its session record's entries)."""


@dataclass(frozen=True, slots=True)
class ContentRef:
    """A digest-bound reference to stored view content of one run."""

    run_id: str
    digest: str
    media_type: str
    byte_length: int


@dataclass(frozen=True, slots=True)
class _Location:
    """Where stored bytes are: the row for incremental blob I/O, and their length."""

    row_id: int
    byte_length: int
    table: str = "run_view_content"


def content_digest(data: bytes) -> str:
    """Return `sha256:<hex>` of `data`."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _read_part(
    reader: Reader, table: str, digest: str, where: _Location, *, offset: int, length: int
) -> bytes:
    """Read one bounded range with incremental blob I/O: memory stays at `length` bytes."""
    if not 0 < length <= CONTENT_PART_BYTES:
        raise ValueError(f"a part is 1..{CONTENT_PART_BYTES} bytes, not {length}")
    total = where.byte_length
    if offset < 0 or offset > total or (offset == total and total > 0):
        raise ContentUnavailableError(digest, "badRange")
    if total == 0:
        return b""
    if total <= SMALL_CONTENT_BYTES:
        wanted = min(length, total - offset)
        return _read_small(reader, table, digest, where, offset=offset, length=wanted)
    with reader.connection.blobopen(table, "content", where.row_id, readonly=True) as blob:
        if len(blob) != total:
            raise ContentUnavailableError(digest, "digestMismatch")
        blob.seek(offset)
        return blob.read(min(length, total - offset))


SMALL_CONTENT_BYTES = 1024 * 1024
"""Content up to this size is read with `substr`, not `blobopen`: in CPython 3.11 every
`Connection.blobopen` leaves a dead weak reference on the connection (python/cpython
#144424), so the reader's memory grew with every view that read a few hundred parts."""

# Table names come from this package's callers, never from input.
SELECT_CONTENT_PART = {
    table: f"SELECT substr(content, :start, :length) FROM {table} WHERE rowid = :row_id"
    for table in ("blobs", "run_view_content")
}


def _read_small(
    reader: Reader, table: str, digest: str, where: _Location, *, offset: int, length: int
) -> bytes:
    part = reader.fetch_value(
        SELECT_CONTENT_PART[table], {"start": offset + 1, "length": length, "row_id": where.row_id}
    )
    if not isinstance(part, bytes) or len(part) != length:
        raise ContentUnavailableError(digest, "digestMismatch")
    return part


def _verified_parts(digest: str, total: int, read: Callable[[int], bytes]) -> Iterator[bytes]:
    hasher = hashlib.sha256()
    offset = 0
    while offset < total:
        part = read(offset)
        hasher.update(part)
        offset += len(part)
        yield part
    if "sha256:" + hasher.hexdigest() != digest:
        raise ContentUnavailableError(digest, "digestMismatch")


# --- Blobs --------------------------------------------------------------------------


BLOB_REFRESH_MS = 10 * 60 * 1000
"""A blob stored again finds its `created_at` moved to now when it is older than this:
the unnamed-blob sweep's grace period counts from the latest write, to within this much
(`collect_unnamed_blobs`), at the cost of one row rewrite per blob per interval."""


def put_blob(tx: Tx, data: bytes) -> str:
    """Store `data` once under its digest and return the digest (idempotent)."""
    digest = content_digest(data)
    tx.execute(
        q.INSERT_BLOB,
        {
            "digest": digest,
            "byte_length": len(data),
            "content": data,
            "now": tx.now,
            "refresh_before": tx.now - BLOB_REFRESH_MS,
        },
    )
    return digest


def put_json_blob(tx: Tx, value: Any) -> str:
    """Store the canonical JSON bytes of `value` and return their digest.

    Raises:
        pi_workflows.wire.canonical.NotSerializableError: no canonical form.
    """
    return put_blob(tx, dumps(value))


def _blob_location(reader: Reader, digest: str) -> _Location:
    where = reader.fetch_one(q.SELECT_BLOB_LOCATION, {"digest": digest}, _Location)
    if where is None:
        raise ContentUnavailableError(digest, "notFound")
    return where


def blob_length(reader: Reader, digest: str) -> int:
    """Return the byte length of a blob.

    Raises:
        ContentUnavailableError: `notFound`.
    """
    return _blob_location(reader, digest).byte_length


def read_blob_part(
    reader: Reader, digest: str, offset: int, length: int = CONTENT_PART_BYTES
) -> bytes:
    """Return at most `length` (≤ 512 KiB) bytes of a blob from `offset`, unverified.

    Raises:
        ContentUnavailableError: `notFound`, or `badRange` for an offset past the end.
        ValueError: `length` is not 1..512 KiB.
    """
    where = _blob_location(reader, digest)
    return _read_part(reader, "blobs", digest, where, offset=offset, length=length)


def iter_blob_parts(reader: Reader, digest: str) -> Iterator[bytes]:
    """Yield a blob in 512 KiB parts, then verify the whole against its digest.

    Raises:
        ContentUnavailableError: `notFound`; or `digestMismatch` after the last part.
    """
    where = _blob_location(reader, digest)
    yield from _verified_parts(
        digest,
        where.byte_length,
        lambda offset: _read_part(
            reader, "blobs", digest, where, offset=offset, length=CONTENT_PART_BYTES
        ),
    )


def read_blob(reader: Reader, digest: str) -> bytes:
    """Return a whole blob, assembled from bounded parts and verified.

    Raises:
        ContentUnavailableError: `notFound` or `digestMismatch`.
    """
    return b"".join(iter_blob_parts(reader, digest))


def read_json_blob(reader: Reader, digest: str) -> Any:
    """Return the JSON value of a canonical JSON blob.

    Raises:
        ContentUnavailableError: `notFound`, `digestMismatch`, or `malformedJson`.
    """
    data = read_blob(reader, digest)
    try:
        return loads(data)
    except (InvalidJSONError, NonCanonicalError):
        raise ContentUnavailableError(digest, "malformedJson") from None


# --- Run view content ---------------------------------------------------------------


def put_view_content(tx: Tx, run_id: str, media_type: str, data: bytes) -> ContentRef:
    """Store generated view content under its exact run, digest and media type.

    **Durability:** store and commit before advertising the reference; the bytes then
    stay readable until the run is pruned (no cache eviction can lose them).
    """
    digest = content_digest(data)
    tx.execute(
        q.INSERT_VIEW_CONTENT,
        {
            "run_id": run_id,
            "digest": digest,
            "media_type": media_type,
            "byte_length": len(data),
            "content": data,
            "now": tx.now,
        },
    )
    return ContentRef(run_id, digest, media_type, len(data))


def _view_location(reader: Reader, ref: ContentRef) -> _Location:
    params = {"run_id": ref.run_id, "digest": ref.digest, "media_type": ref.media_type}
    where = reader.fetch_one(q.SELECT_VIEW_CONTENT_LOCATION, params, _Location)
    if where is None and ref.media_type == _JSON_MEDIA_TYPE:
        # The run's definition snapshot, or a verbatim Pi entry of its session record:
        # read in place, never copied.
        where = reader.fetch_one(q.SELECT_DEFINITION_LOCATION, params, _Location)
        if where is None:
            where = reader.fetch_one(q.SELECT_SESSION_ENTRY_LOCATION, params, _Location)
    if where is None:
        raise ContentUnavailableError(ref.digest, "notFound")
    return where


def view_content_length(reader: Reader, ref: ContentRef) -> int:
    """Return the stored byte length of exactly `ref`'s run, digest and media type.

    Raises:
        ContentUnavailableError: `notFound` (including another run or media type).
    """
    return _view_location(reader, ref).byte_length


def read_view_content_part(
    reader: Reader, ref: ContentRef, offset: int, length: int = CONTENT_PART_BYTES
) -> bytes:
    """Return at most `length` (≤ 512 KiB) bytes of `ref`'s content from `offset`.

    The client verifies the assembled parts against the digest; `read_view_content`
    does that here.

    Raises:
        ContentUnavailableError: `notFound` (another run or media type included) or
            `badRange`.
        ValueError: `length` is not 1..512 KiB.
    """
    where = _view_location(reader, ref)
    return _read_part(reader, where.table, ref.digest, where, offset=offset, length=length)


def iter_view_content_parts(reader: Reader, ref: ContentRef) -> Iterator[bytes]:
    """Yield `ref`'s content in 512 KiB parts, then verify it against `ref.digest`.

    Raises:
        ContentUnavailableError: `notFound`, or `digestMismatch` after the last part.
    """
    where = _view_location(reader, ref)
    yield from _verified_parts(
        ref.digest,
        where.byte_length,
        lambda offset: _read_part(
            reader, where.table, ref.digest, where, offset=offset, length=CONTENT_PART_BYTES
        ),
    )


def read_view_content(reader: Reader, ref: ContentRef) -> bytes:
    """Return `ref`'s whole content, assembled from bounded parts and verified.

    Raises:
        ContentUnavailableError: `notFound` or `digestMismatch`.
    """
    return b"".join(iter_view_content_parts(reader, ref))
