"""A run with a 5 MiB output, a 100 KiB failure reason and 3,000 steps (issue 13).

- every frame stays under 1 MiB;
- `run show` shows it all through pages and content;
- a tampered chunk is detected and reported, never shown.

A runner bounds a node's error to 16 KiB and a node's output to one frame, so no real
workflow can make this run; the test writes it into a real SQLite file with the
storage transitions the server itself uses (the same claim, attempt and failure
writes, in batched transactions), then starts a real server on that file and reads
it over its Unix socket with `WorkflowClient` and the CLI as a child process.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.storage import (
    Database,
    FailureClass,
    ensure_private_dir,
    fail_node_attempt,
    fail_run,
    finish_node_attempt,
    mark_runner_live,
    open_database,
    park_run,
    put_json_blob,
    put_traceback,
    start_node_attempt,
)
from pi_workflows.wire import protocol
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.client import RequestFailedError
from pi_workflows.wire.framing import MAX_FRAME_BYTES
from pi_workflows.wire.hydrate import ContentVerificationError, hydrate_run_view
from tests.conftest import Processes
from tests.storage.storage_helpers import enqueue, launch

pytestmark = pytest.mark.timeout(300)

RUN = "run-1"
PARKED = "run-2"
STEPS = 3_000
BIG = 5 * 1024 * 1024
REASON = "nodeFailed: last: RuntimeError: " + "why " * 25_600  # 100 KiB and a bit
OPAQUE = {
    "ref": {"digest": "sha256:" + "0" * 64, "mediaType": "application/json", "byteCount": 1,
            "marker": "server"},
    "preview": "a user value that looks like a reference",
}  # fmt: skip
DEFINITION = {
    "schema": "pi-workflows.definition-snapshot.v1",
    "name": "large",
    "startAt": "step",
    "nodes": {"step": {"kind": "compute"}, "big": {"kind": "compute"}},
    "edges": [{"from": "step", "to": "big"}],
}


def _big_output() -> dict[str, Any]:
    return {"text": "b" * BIG}


def _build(db_path: Path) -> None:
    """The run, written as the server writes it; terminal, so no recovery touches it."""
    db = open_database(db_path)
    try:
        with db.write() as tx:
            definition = put_json_blob(tx, DEFINITION)
        enqueue(db, RUN, definition_digest=definition, input={"steps": STEPS})
        claim = launch(db, RUN, epoch="e1")
        with db.write() as tx:
            mark_runner_live(tx, claim, runner_epoch="e1", pid=4242, process_start_time=7)
        for first in range(0, STEPS - 2, 500):
            with db.write() as tx:
                for number in range(first, min(first + 500, STEPS - 2)):
                    attempt = f"s{number:04d}"
                    start_node_attempt(
                        tx, claim, attempt_id=attempt, node_path="step", node_type="compute"
                    )
                    output = OPAQUE if number == 7 else {"i": number}
                    finish_node_attempt(
                        tx, claim, attempt_id=attempt, output=output, next_node_path="step"
                    )
        with db.write() as tx:
            start_node_attempt(tx, claim, attempt_id="big", node_path="big", node_type="compute")
            finish_node_attempt(
                tx, claim, attempt_id="big", output=_big_output(), next_node_path="last"
            )
        with db.write() as tx:
            start_node_attempt(tx, claim, attempt_id="last", node_path="last", node_type="compute")
            ref = put_traceback(tx, RUN, "Traceback (most recent call last):\n  boom\n")
            fail_node_attempt(
                tx, claim, attempt_id="last", error=REASON[:16_000], payload={"traceback": ref}
            )
        with db.write() as tx:
            fail_run(tx, RUN, failure_class=FailureClass.NODE_FAILED, reason=REASON, claim=claim)
        _parked_run(db)
    finally:
        db.close()


def _parked_run(db: Database) -> None:
    """`PARKED`: 600 small steps, then parked (resumable, so a pause changes it)."""
    enqueue(db, PARKED)
    claim = launch(db, PARKED, epoch="e2")
    with db.write() as tx:
        mark_runner_live(tx, claim, runner_epoch="e2", pid=4242, process_start_time=7)
        for number in range(600):
            attempt = f"p{number:03d}"
            start_node_attempt(tx, claim, attempt_id=attempt, node_path="p", node_type="compute")
            finish_node_attempt(tx, claim, attempt_id=attempt, output={"p": "v" * 2_000})
        park_run(tx, claim, reason="test")


@pytest.fixture(scope="module")
def large_state() -> Iterator[Path]:
    """A state folder holding the run (built once for the module)."""
    root = Path(tempfile.mkdtemp(prefix="piw-large-", dir="/tmp"))
    state_dir = root / "agent" / "workflows"
    ensure_private_dir(state_dir)
    try:
        _build(state_dir / "state.sqlite")
        yield state_dir
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def large_server(large_state: Path) -> Iterator[WorkflowServer]:
    """A fresh copy of the state for each test (one test tampers with it)."""
    state_dir = Path(tempfile.mkdtemp(prefix="piw-", dir="/tmp")) / "agent" / "workflows"
    ensure_private_dir(state_dir)
    source = sqlite3.connect(large_state / "state.sqlite")
    target = sqlite3.connect(state_dir / "state.sqlite")
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=False)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown")
        shutil.rmtree(state_dir.parent.parent, ignore_errors=True)


@dataclass
class Measured:
    """`WorkflowClient.call`, recording the encoded size of every answer it receives."""

    client: WorkflowClient
    sizes: dict[str, list[int]] = field(default_factory=dict)

    def call(
        self, operation: str, payload: Mapping[str, Any] | None = None, **options: Any
    ) -> Mapping[str, Any]:
        response = self.client.call(operation, payload, **options)
        self.sizes.setdefault(operation, []).append(len(dumps(dict(response))))
        return response


def test_every_frame_stays_under_one_mebibyte(large_server: WorkflowServer) -> None:
    with WorkflowClient(large_server.state_dir, autostart=False, timeout=60) as client:
        measured = Measured(client)
        whole = hydrate_run_view(measured, RUN)
    sizes = measured.sizes
    assert len(sizes["run.get"]) == 1 and len(sizes["view.page"]) >= 11, "3,000 in pages"
    assert len(sizes["view.content"]) >= 20, "5 MiB in 256 KiB chunks"
    largest = max(size for answers in sizes.values() for size in answers)
    assert largest < MAX_FRAME_BYTES, f"an answer of {largest} bytes"
    items = whole["trace"]["items"]
    assert [item["attemptId"] for item in items][:2] == ["s0000", "s0001"]
    assert len(items) == whole["trace"]["count"] == STEPS
    assert items[-2]["output"]["value"] == _big_output()
    assert whole["display"]["reasonText"] == REASON
    assert whole["graph"]["definitionSnapshot"] == DEFINITION


def test_the_view_and_its_pages_are_bounded_and_valid(large_server: WorkflowServer) -> None:
    with WorkflowClient(large_server.state_dir, autostart=False, timeout=60) as client:
        view = client.call("run.get", run_id=RUN)["receipt"]
        protocol.validate("run-view.v1", view)
        trace = view["trace"]
        assert trace["count"] == STEPS and trace["omitted"] == STEPS - len(trace["items"])
        assert len(trace["items"]) <= 256 and "older" in trace["cursors"]
        display = view["display"]
        assert len(display["reasonText"]) < 2048 and display["reasonContent"]["byteCount"] > 100_000
        big = trace["items"][-2]["output"]
        assert big["ref"]["byteCount"] == len(dumps(_big_output())) and len(big["preview"]) <= 1024
        step = client.run_page(RUN, "trace", revision=view["revision"], attempt_id="s1234")
        protocol.validate("run-page.v1", step)
        assert step["items"][0]["attemptId"] == "s1234" and step["revision"] == view["revision"]
        data = client.run_content(RUN, big["ref"])
        assert hashlib.sha256(data).hexdigest() == big["ref"]["digest"].removeprefix("sha256:")
        other = client.request(
            "view.content", {"digest": big["ref"]["digest"], "mediaType": "text/plain"}, run_id=RUN
        )
        assert (other["outcome"], other["error"]["code"]) == ("unavailable", "contentUnavailable")


def test_opaque_content_is_data_never_a_reference(large_server: WorkflowServer) -> None:
    """A user output shaped like a reference stays the user's value after hydration."""
    with WorkflowClient(large_server.state_dir, autostart=False, timeout=60) as client:
        whole = client.hydrated_run_view(RUN)
    assert whole["trace"]["items"][7]["output"] == {"value": OPAQUE}


def test_run_show_shows_it_all_through_pages_and_content(
    processes: Processes, large_server: WorkflowServer
) -> None:
    state_dir = large_server.state_dir
    as_json = processes.cli(state_dir, "run", "show", RUN, "--json", timeout=120)
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    assert document["hydrated"] is True and len(document["trace"]["items"]) == STEPS
    assert document["trace"]["items"][-2]["output"]["value"] == _big_output()
    assert document["display"]["reasonText"] == REASON

    plain = processes.cli(state_dir, "run", "show", RUN, timeout=120)
    assert plain.returncode == 0, plain.stderr
    out = plain.stdout
    assert f"attempts: {STEPS}\n" in out
    assert "  1. step  compute  visit 1 attempt 1" in out and '     output: {"i": 0}' in out
    assert f"  {STEPS - 2}. step  compute  visit {STEPS - 2} attempt 1" in out
    assert f"  {STEPS}. last  compute" in out and "Traceback (most recent call last):" in out
    assert "bytes in all; --full prints everything)" in out, "a bounded head of 5 MiB"
    assert len(out) < 2 * 1024 * 1024
    assert "reason:      nodeFailed: last: RuntimeError: why why" in out

    full = processes.cli(state_dir, "run", "show", RUN, "--full", timeout=120)
    assert full.returncode == 0, full.stderr
    assert "b" * BIG in full.stdout and REASON in full.stdout


def test_a_tampered_chunk_is_detected_and_reported_never_shown(
    processes: Processes, large_server: WorkflowServer
) -> None:
    """One byte of the 5 MiB output's stored copy changes in the SQLite file (same
    length, in its 11th chunk): the client's digest check refuses it."""
    state_dir = large_server.state_dir
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        view = client.call("run.get", run_id=RUN)["receipt"]
    ref = view["trace"]["items"][-2]["output"]["ref"]
    position = 10 * 256 * 1024 + 5
    with sqlite3.connect(state_dir / "state.sqlite") as db:
        (content,) = db.execute(
            "SELECT content FROM run_view_content WHERE run_id = ? AND digest = ?",
            (RUN, ref["digest"]),
        ).fetchone()
        tampered = bytearray(content)
        tampered[position] = ord("X")
        db.execute(
            "UPDATE run_view_content SET content = ? WHERE run_id = ? AND digest = ?",
            (bytes(tampered), RUN, ref["digest"]),
        )
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        with pytest.raises(ContentVerificationError) as refused:
            client.run_content(RUN, ref)
        assert ref["digest"] in str(refused.value) and "X" not in str(refused.value)
        with pytest.raises(ContentVerificationError):
            client.hydrated_run_view(RUN)
    for args in ((), ("--json",), ("--full",)):
        shown = processes.cli(state_dir, "run", "show", RUN, *args, timeout=120)
        assert shown.returncode == 1, (args, shown.stderr)
        assert shown.stdout == "", "nothing of a damaged run view is shown"
        assert "content failed verification" in shown.stderr and ref["digest"] in shown.stderr


def test_a_missing_run_reports_not_found_through_pages_and_content(
    large_server: WorkflowServer,
) -> None:
    with WorkflowClient(large_server.state_dir, autostart=False, timeout=60) as client:
        page = client.request("view.page", {"list": "trace", "revision": 1}, run_id="run-none")
        assert (page["outcome"], page["error"]["code"]) == ("notFound", "runNotFound")
        with pytest.raises(RequestFailedError) as missing:
            client.hydrated_run_view("run-none")
        assert missing.value.code == "runNotFound"


@dataclass
class PausingOnce:
    """`WorkflowClient.call`, pausing the run once right after the first trace page:
    the run changes between the pages of one collection."""

    client: WorkflowClient
    calls: list[str] = field(default_factory=list)

    def call(
        self, operation: str, payload: Mapping[str, Any] | None = None, **options: Any
    ) -> Mapping[str, Any]:
        response = self.client.call(operation, payload, **options)
        self.calls.append(operation)
        if operation == "view.page" and "run.pause" not in self.calls:
            self.calls.append("run.pause")
            self.client.call("run.pause", run_id=PARKED)
        return response


def test_a_page_of_another_revision_is_not_applied(large_server: WorkflowServer) -> None:
    """The pause lands between two pages: the page after it echoes a newer revision,
    the partial history is dropped, and collection starts again from a fresh view."""
    with WorkflowClient(large_server.state_dir, autostart=False, timeout=60) as client:
        pausing = PausingOnce(client)
        whole = hydrate_run_view(pausing, PARKED)
    assert pausing.calls.count("run.get") == 2, pausing.calls
    assert whole["display"]["status"] == "paused", "the view of the newer revision"
    assert [i["attemptId"] for i in whole["trace"]["items"]] == [f"p{n:03d}" for n in range(600)]
