"""View content: references in the run view and `view.content` chunks (issue 13 item 6).

A real SQLite file and the storage transitions the server uses. Each reference the
view advertises names bytes stored in `run_view_content` under the exact run ID,
digest and media type, written in the transaction that wrote the value; a read under
another run or media type is unavailable; chunks are at most 256 KiB; pruning a run
(deleting its row) removes its content through the foreign key cascade. Client-side
verification over a socket is in tests/server/test_large_run_view.py.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from pi_workflows.domain._run_view import build_run_view
from pi_workflows.domain._view_content import CHUNK_BYTES, ViewRequestError, view_content
from pi_workflows.storage import (
    Database,
    FailureClass,
    fail_node_attempt,
    fail_run,
    finish_node_attempt,
    put_json_blob,
    start_node_attempt,
)
from pi_workflows.wire import protocol
from pi_workflows.wire.canonical import dumps
from tests.storage.storage_helpers import enqueue, running

pytestmark = pytest.mark.timeout(60)

BIG_OUTPUT = {"text": "o" * 600_000}
BIG_REASON = "nodeFailed: big: " + "r" * 100_000
BIG_ERROR = "nodeFailed: " + "e" * 40_000


def _view(db: Database, run_id: str = "run-1") -> dict[str, Any]:
    built = build_run_view(db, run_id)
    assert built is not None
    protocol.validate("run-view.v1", built)
    return built


def _chunk(db: Database, run_id: str, **payload: Any) -> dict[str, Any]:
    with db.read():
        return view_content(db, run_id, payload)


def _assemble(db: Database, run_id: str, ref: dict[str, Any]) -> tuple[bytes, int]:
    parts, offset, chunks = [], 0, 0
    while True:
        receipt = _chunk(
            db, run_id, digest=ref["digest"], mediaType=ref["mediaType"], offset=offset
        )
        data = base64.b64decode(receipt["data"])
        assert len(data) <= CHUNK_BYTES and receipt["byteCount"] == ref["byteCount"]
        parts.append(data)
        chunks += 1
        if "nextOffset" not in receipt:
            return b"".join(parts), chunks
        offset = receipt["nextOffset"]


def _failed_run(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id="a1", node_path="big", node_type="compute")
    with db.write() as tx:
        finish_node_attempt(tx, claim, attempt_id="a1", output=BIG_OUTPUT, next_node_path="x")
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id="a2", node_path="x", node_type="compute")
    with db.write() as tx:
        fail_node_attempt(tx, claim, attempt_id="a2", error=BIG_ERROR)
    with db.write() as tx:
        fail_run(
            tx, "run-1", failure_class=FailureClass.NODE_FAILED, reason=BIG_REASON, claim=claim
        )


def test_a_large_output_is_a_stored_reference_read_back_in_bounded_chunks(db: Database) -> None:
    _failed_run(db)
    output = _view(db)["trace"]["items"][0]["output"]
    ref = output["ref"]
    data = dumps(BIG_OUTPUT)
    assert ref == {
        "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "mediaType": "application/json",
        "byteCount": len(data),
        "marker": "server",
    }
    assert output["preview"] == data[:1024].decode()
    assembled, chunks = _assemble(db, "run-1", ref)
    assert assembled == data and chunks == 3, "600 KB in 256 KiB chunks"


def test_a_long_reason_is_a_notice_plus_reason_content(db: Database) -> None:
    _failed_run(db)
    display = _view(db)["display"]
    ref = display["reasonContent"]
    assert ref["mediaType"] == "text/plain; charset=utf-8"
    assert ref["byteCount"] == len(BIG_REASON)
    assert display["reasonText"].startswith("The reason is 100017 bytes")
    assert len(display["reasonText"]) < 2048, "a small notice, not the reason"
    assert _assemble(db, "run-1", ref)[0] == BIG_REASON.encode()


def test_a_long_error_keeps_its_start_and_references_the_whole(db: Database) -> None:
    _failed_run(db)
    item = _view(db)["trace"]["items"][1]
    assert item["error"] == BIG_ERROR[:1024]
    assert _assemble(db, "run-1", item["errorContent"])[0] == BIG_ERROR.encode()


def test_a_large_input_and_the_definition_snapshot_are_references(db: Database) -> None:
    definition = {"schema": "pi-workflows.definition-snapshot.v1", "nodes": {"a": {}}}
    with db.write() as tx:
        digest = put_json_blob(tx, definition)
    big_input = {"notes": "i" * 20_000}
    enqueue(db, definition_digest=digest, input=big_input)
    view = _view(db)
    ref = view["state"]["input"]["ref"]
    assert _assemble(db, "run-1", ref)[0] == dumps(big_input)
    graph = view["graph"]
    assert graph["definition"]["digest"] == digest
    assert _assemble(db, "run-1", graph["definition"])[0] == dumps(definition)
    assert graph["nodes"] == {"count": 1, "items": [{"id": "a", "kind": ""}]}


def test_another_run_or_another_media_type_is_unavailable(db: Database) -> None:
    _failed_run(db)
    enqueue(db, "run-2")
    ref = _view(db)["trace"]["items"][0]["output"]["ref"]
    for run_id, media_type in (("run-2", ref["mediaType"]), ("run-1", "text/plain")):
        with pytest.raises(ViewRequestError) as refused:
            _chunk(db, run_id, digest=ref["digest"], mediaType=media_type)
        assert (refused.value.outcome, refused.value.code) == ("unavailable", "contentUnavailable")
    with pytest.raises(ViewRequestError) as missing:
        _chunk(db, "run-9", digest=ref["digest"], mediaType=ref["mediaType"])
    assert missing.value.code == "runNotFound"


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"digest": "sha256:xyz", "mediaType": "application/json"}, "invalidDigest"),
        ({"digest": "sha256:" + "0" * 64}, "invalidMediaType"),
        ({"digest": "sha256:" + "0" * 64, "mediaType": "a", "offset": -1}, "invalidOffset"),
    ],
)
def test_a_malformed_content_request_is_rejected(
    db: Database, payload: dict[str, Any], code: str
) -> None:
    enqueue(db)
    with pytest.raises(ViewRequestError) as refused:
        _chunk(db, "run-1", **payload)
    assert (refused.value.outcome, refused.value.code) == ("rejected", code)


def test_an_offset_past_the_end_is_rejected(db: Database) -> None:
    _failed_run(db)
    ref = _view(db)["display"]["reasonContent"]
    with pytest.raises(ViewRequestError) as refused:
        _chunk(db, "run-1", digest=ref["digest"], mediaType=ref["mediaType"], offset=10**6)
    assert refused.value.code == "invalidOffset"


def test_small_values_stay_inline_and_store_no_view_content(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id="a1", node_path="n", node_type="compute")
    with db.write() as tx:
        finish_node_attempt(tx, claim, attempt_id="a1", output={"ok": True})
    assert _view(db)["trace"]["items"][0]["output"] == {"value": {"ok": True}}
    stored = db.fetch_value("SELECT count(*) FROM run_view_content", {})
    assert stored == 0, "only values above 16 KiB (and a stored definition) are copied"


def test_pruning_a_run_removes_its_view_content(db: Database) -> None:
    """`state.prune` deletes the run row; the foreign key cascade removes its content."""
    _failed_run(db)
    enqueue(db, "run-2")
    count = "SELECT count(*) FROM run_view_content WHERE run_id = :run_id"
    assert db.fetch_value(count, {"run_id": "run-1"}) == 3  # output, error, reason
    with db.write() as tx:
        for table in ("events", "node_attempts", "run_queue", "run_bindings", "runner_epochs"):
            tx.execute(f"DELETE FROM {table} WHERE run_id = 'run-1'")
        tx.execute("DELETE FROM runs WHERE run_id = 'run-1'")
    assert db.fetch_value(count, {"run_id": "run-1"}) == 0
