"""The content store: content-addressed blobs and exact-key run view content."""

from __future__ import annotations

import os
import tracemalloc

import pytest

from pi_workflows.storage import (
    CONTENT_PART_BYTES,
    ContentRef,
    ContentUnavailableError,
    Database,
    blob_length,
    content_digest,
    iter_view_content_parts,
    put_blob,
    put_json_blob,
    put_view_content,
    read_blob,
    read_blob_part,
    read_json_blob,
    read_view_content,
    read_view_content_part,
    verify,
)
from tests.storage.storage_helpers import enqueue, raw_edit

BIG = os.urandom(CONTENT_PART_BYTES * 2 + 1234)


def test_blob_is_stored_once_under_its_digest(db: Database) -> None:
    with db.write() as tx:
        first = put_blob(tx, b"hello")
        second = put_blob(tx, b"hello")
    assert first == second == content_digest(b"hello")
    assert first.startswith("sha256:")
    assert db.fetch_value("SELECT count(*) FROM blobs", {}) == 1
    assert read_blob(db, first) == b"hello"


def test_large_blob_reads_in_bounded_parts(db: Database) -> None:
    with db.write() as tx:
        digest = put_blob(tx, BIG)
    assert blob_length(db, digest) == len(BIG)
    parts = [
        read_blob_part(db, digest, offset) for offset in range(0, len(BIG), CONTENT_PART_BYTES)
    ]
    assert [len(p) for p in parts] == [CONTENT_PART_BYTES, CONTENT_PART_BYTES, 1234]
    assert b"".join(parts) == BIG == read_blob(db, digest)
    assert read_blob_part(db, digest, 10, 5) == BIG[10:15]
    with pytest.raises(ValueError):
        read_blob_part(db, digest, 0, CONTENT_PART_BYTES + 1)
    with pytest.raises(ContentUnavailableError) as caught:
        read_blob_part(db, digest, len(BIG))
    assert caught.value.reason == "badRange"
    with pytest.raises(ContentUnavailableError):
        read_blob_part(db, digest, -1)


def test_empty_blob(db: Database) -> None:
    with db.write() as tx:
        digest = put_blob(tx, b"")
    assert read_blob(db, digest) == b""
    assert read_blob_part(db, digest, 0) == b""


def test_json_blob_round_trips_canonically(db: Database) -> None:
    with db.write() as tx:
        digest = put_json_blob(tx, {"b": [1, 2.5], "a": "é"})
    assert read_json_blob(db, digest) == {"a": "é", "b": [1, 2.5]}
    assert read_blob(db, digest) == '{"a":"é","b":[1,2.5]}'.encode()


def test_missing_blob_is_unavailable(db: Database) -> None:
    with pytest.raises(ContentUnavailableError) as caught:
        read_blob(db, content_digest(b"never stored"))
    assert caught.value.reason == "notFound"


def test_corrupted_blob_fails_digest_verification(db: Database) -> None:
    with db.write() as tx:
        digest = put_blob(tx, BIG)
    raw_edit(db, "UPDATE blobs SET content = :c", params={"c": BIG[:-1] + b"\x00"})
    with pytest.raises(ContentUnavailableError) as caught:
        read_blob(db, digest)
    assert caught.value.reason == "digestMismatch"


def test_view_content_is_readable_only_under_its_exact_key(db: Database) -> None:
    enqueue(db, "run-1")
    enqueue(db, "run-2")
    with db.write() as tx:
        ref = put_view_content(tx, "run-1", "application/json", BIG)
        put_view_content(tx, "run-2", "text/plain", b"other")
    assert ref == ContentRef("run-1", content_digest(BIG), "application/json", len(BIG))
    assert read_view_content(db, ref) == BIG
    parts = list(iter_view_content_parts(db, ref))
    assert max(len(p) for p in parts) <= CONTENT_PART_BYTES and len(parts) == 3
    assert read_view_content_part(db, ref, CONTENT_PART_BYTES * 2) == BIG[-1234:]
    for wrong in (
        ContentRef("run-2", ref.digest, ref.media_type, ref.byte_length),
        ContentRef("run-1", ref.digest, "text/plain", ref.byte_length),
        ContentRef("run-1", content_digest(b"other"), "text/plain", 5),
    ):
        with pytest.raises(ContentUnavailableError) as caught:
            read_view_content(db, wrong)
        assert caught.value.reason == "notFound"
        with pytest.raises(ContentUnavailableError):
            read_view_content_part(db, wrong, 0)


def test_view_content_shares_no_metadata_with_blobs(db: Database) -> None:
    enqueue(db)
    with db.write() as tx:
        ref = put_view_content(tx, "run-1", "text/plain", b"shared bytes")
        put_blob(tx, b"shared bytes")
    raw_edit(db, "DELETE FROM blobs")
    assert read_view_content(db, ref) == b"shared bytes"


def test_corrupted_view_content_fails_verification(db: Database) -> None:
    enqueue(db)
    with db.write() as tx:
        ref = put_view_content(tx, "run-1", "text/plain", b"abc")
    raw_edit(db, "UPDATE run_view_content SET content = x'616263'")  # same bytes: fine
    assert read_view_content(db, ref) == b"abc"
    raw_edit(db, "UPDATE run_view_content SET content = x'616264'")
    with pytest.raises(ContentUnavailableError) as caught:
        read_view_content(db, ref)
    assert caught.value.reason == "digestMismatch"
    assert [f.code.value for f in verify(db)] == ["view_content_digest_mismatch"]


def test_view_content_is_pruned_with_its_run(db: Database) -> None:
    enqueue(db)
    with db.write() as tx:
        ref = put_view_content(tx, "run-1", "text/plain", b"x")
        tx.execute("DELETE FROM runs WHERE run_id = 'run-1'")
    with pytest.raises(ContentUnavailableError):
        read_view_content(db, ref)


def test_reading_small_parts_does_not_grow_the_connection(db: Database) -> None:
    """CPython 3.11 keeps a dead weak reference per `blobopen` on the connection
    (python/cpython#144424); small content is read with `substr`, so a server that
    builds views all day keeps its memory."""
    with db.write() as tx:
        digest = put_blob(tx, b"small content " * 10)
    read_blob_part(db, digest, 0, 10)  # warm the statement cache
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(5_000):
            assert read_blob_part(db, digest, 3, 7) == b"ll cont"
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes kept after 5,000 reads"
