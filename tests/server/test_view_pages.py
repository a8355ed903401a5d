"""`view.page` (`pi-workflows.run-page.v1`) and the run view's trace window.

Built on a real SQLite file with the storage transitions the server uses; the
operation itself (routing, envelopes) is exercised over a socket in
tests/server/test_large_run_view.py. Each test names the issue 13 item 5 rule it
proves: at most 256 items and a byte budget, the echoed cursor and current
revision, a step-centred request that selects the exact stored attempt, and reads of
only the selected range.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pi_workflows.domain._run_view import build_run_view
from pi_workflows.domain._view_content import ViewRequestError
from pi_workflows.domain._view_pages import PAGE_BYTES, run_page
from pi_workflows.storage import (
    Claim,
    Database,
    fail_node_attempt,
    finish_node_attempt,
    put_traceback,
    start_node_attempt,
)
from pi_workflows.wire import protocol
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.framing import MAX_FRAME_BYTES
from tests.storage.storage_helpers import running

pytestmark = pytest.mark.timeout(60)


def _view(db: Database) -> dict[str, Any]:
    built = build_run_view(db, "run-1")
    assert built is not None
    protocol.validate("run-view.v1", built)
    return built


def _page(db: Database, **payload: Any) -> dict[str, Any]:
    with db.read():
        page = run_page(db, "run-1", payload)
    protocol.validate("run-page.v1", page)
    assert len(page["items"]) <= 256
    assert len(json.dumps(page["items"]).encode()) <= PAGE_BYTES + 64 * 1024
    return page


def _step(db: Database, claim: Claim, attempt: str, node: str, output: Any) -> None:
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id=attempt, node_path=node, node_type="compute")
    with db.write() as tx:
        finish_node_attempt(tx, claim, attempt_id=attempt, output=output, next_node_path="n")


def _large_history(db: Database, steps: int = 300) -> Claim:
    """`steps` attempts, each with a 16,000-character output or a 4,000-character error
    and a 16 KiB traceback: too many, and too large, for one view."""
    claim = running(db)
    for number in range(steps):
        attempt = f"a{number}"
        with db.write() as tx:
            start_node_attempt(
                tx, claim, attempt_id=attempt, node_path=f"n{number % 5}", node_type="compute"
            )
        with db.write() as tx:
            if number % 2:
                ref = put_traceback(tx, "run-1", f"Traceback {number}\n" + "t" * 16_000)
                error = f"nodeFailed: {number} " + "e" * 4_000
                fail_node_attempt(
                    tx, claim, attempt_id=attempt, error=error, payload={"traceback": ref}
                )
            else:
                finish_node_attempt(tx, claim, attempt_id=attempt, output={"v": "o" * 16_000})
    return claim


def test_the_view_holds_the_newest_window_and_pages_hold_the_rest(db: Database) -> None:
    """A view stays below one frame whatever the history; following `trace.cursors`
    through `view.page` yields every attempt once, in start order, each page echoing
    its cursor and the current revision."""
    _large_history(db)
    view = _view(db)
    trace = view["trace"]
    assert len(dumps(view)) < MAX_FRAME_BYTES - 64 * 1024
    shown = len(trace["items"])
    assert 0 < shown < 256 and trace["count"] == 300 and trace["omitted"] == 300 - shown
    assert [i["attemptId"] for i in trace["items"]][-1] == "a299", "the newest window"
    assert trace["cursors"] == {"older": f"trace<{300 - shown}"}
    newest = trace["items"][-1]
    assert newest["traceback"]["text"].startswith("Traceback 299")
    assert newest["error"].startswith("nodeFailed: 299 ") and "errorContent" not in newest

    collected = list(trace["items"])
    cursor: str | None = trace["cursors"]["older"]
    pages = 0
    while cursor is not None:
        page = _page(db, list="trace", cursor=cursor, revision=view["revision"])
        assert (page["cursor"], page["revision"], page["count"]) == (cursor, view["revision"], 300)
        collected[:0] = page["items"]
        cursor = page.get("nextCursor")
        pages += 1
    assert pages >= 2, "a 512 KiB page budget splits 300 attempts of ~16 KiB"
    assert [i["attemptId"] for i in collected] == [f"a{n}" for n in range(300)]
    numbers = [item["attempt"] for item in collected if item["node"] == "n0"]
    assert numbers == [1] * len(numbers), "each attempt is the first of its own visit"


def test_the_first_page_is_the_newest_window_and_cursors_go_both_ways(db: Database) -> None:
    _large_history(db, steps=60)
    first = _page(db, list="trace", revision=1)
    assert first["cursor"] is None, "the first page echoes no cursor"
    assert first["items"][-1]["attemptId"] == "a59" and "previousCursor" not in first
    older = _page(db, list="trace", cursor=first["nextCursor"], revision=1)
    assert older["items"][-1]["attemptId"] == f"a{first['first'] - 1}"
    newer = _page(db, list="trace", cursor=older["previousCursor"], revision=1)
    assert newer["items"][0]["attemptId"] == first["items"][0]["attemptId"]


def test_a_page_echoes_the_current_revision_not_the_requested_one(db: Database) -> None:
    """The client compares: a page of another revision is not applied."""
    claim = running(db)
    _step(db, claim, "a0", "n0", {"i": 0})
    page = _page(db, list="trace", revision=1)
    view = _view(db)
    assert page["revision"] == view["revision"] != 1


def test_a_step_centred_request_selects_the_exact_stored_attempt(db: Database) -> None:
    """Of 600 attempts of two nodes, the request names the 401st: its window starts at
    that exact attempt, not at another attempt of the same node."""
    claim = running(db)
    for number in range(600):
        _step(db, claim, f"s{number}", f"node{number % 2}", {"i": number})
    page = _page(db, list="trace", attemptId="s400", revision=1)
    assert page["first"] == 400 and page["items"][0]["attemptId"] == "s400"
    assert page["items"][0]["output"] == {"value": {"i": 400}}
    assert page["nextCursor"] == "trace<400"
    assert page["items"][-1]["attemptId"] == "s599" and "previousCursor" not in page
    steps = _page(db, list="graphSteps", attemptId="s401", revision=1)
    assert steps["items"][0] == {
        "attemptId": "s401",
        "node": "node1",
        "kind": "compute",
        "visit": 201,
        "attempt": 1,
        "outcome": "completed",
        "next": "n",
    }
    assert len(steps["items"]) == 199 and "previousCursor" not in steps
    with pytest.raises(ViewRequestError) as missing:
        _page(db, list="trace", attemptId="nope", revision=1)
    assert missing.value.code == "attemptNotFound"


def test_transitions_and_graph_steps_are_paged_too(db: Database) -> None:
    claim = running(db)
    for number in range(300):
        _step(db, claim, f"s{number}", f"node{number % 3}", {"i": number})
    view = _view(db)
    assert view["graph"]["steps"] == {"count": 300}
    transitions = _page(db, list="transitions", revision=1)
    assert transitions["count"] == 300 and len(transitions["items"]) == 256
    assert transitions["items"][-1] == {
        "attemptId": "s299",
        "from": "node2",
        "to": "n",
        "visit": 100,
        "outcome": "completed",
        "at": transitions["items"][-1]["at"],
    }
    rest = _page(db, list="transitions", cursor=transitions["nextCursor"], revision=1)
    assert [t["attemptId"] for t in rest["items"]] == [f"s{n}" for n in range(44)]


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"list": "events", "revision": 1}, "unknownList"),
        ({"list": "trace"}, "invalidRevision"),
        ({"list": "trace", "revision": 1, "cursor": "transitions<3"}, "invalidCursor"),
        ({"list": "trace", "revision": 1, "cursor": "trace<-3"}, "invalidCursor"),
        ({"list": "trace", "revision": 1, "cursor": "trace<3", "attemptId": "a"}, "invalidCursor"),
    ],
)
def test_a_malformed_page_request_is_rejected_by_name(
    db: Database, payload: dict[str, Any], code: str
) -> None:
    running(db)
    with pytest.raises(ViewRequestError) as refused, db.read():
        run_page(db, "run-1", payload)
    assert (refused.value.outcome, refused.value.code) == ("rejected", code)


def test_a_page_reads_only_its_range_never_the_whole_history(db: Database) -> None:
    """The server counts first and reads the selected window with LIMIT/OFFSET: no
    statement of a page reads every attempt of the run."""
    claim = running(db)
    for number in range(400):
        _step(db, claim, f"s{number}", "node", {"i": number})
    statements: list[str] = []
    db.connection.set_trace_callback(statements.append)
    try:
        _page(db, list="trace", cursor="trace<300", revision=1)
        _view(db)
    finally:
        db.connection.set_trace_callback(None)
    attempt_reads = [s for s in statements if "FROM node_attempts a WHERE" in s]
    assert attempt_reads and all("LIMIT" in s for s in attempt_reads)
    assert not [
        s
        for s in statements
        if "FROM node_attempts WHERE run_id" in s and "ORDER BY rowid" in s and "LIMIT" not in s
    ], "no full list of attempts"
