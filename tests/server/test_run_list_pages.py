"""`run.list` pages (`pi-workflows.run-list-page.v1`) through a real server.

Revision-bound, cursor-paged pages with filters; `WorkflowClient.list_runs` collects
the pages of one revision and starts again when the revision changes between pages.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.domain._run_list import DISPLAY_STATUSES
from pi_workflows.wire.client import RequestFailedError
from tests.conftest import write_workflow

pytestmark = pytest.mark.timeout(120)

RUNS = 300
SCHEMA_PATH = (
    Path(__file__).parents[2] / "pi_workflows" / "wire" / "schemas" / "run-list-page.v1.schema.json"
)


def _start_many(client: WorkflowClient, project: Path, name: str, count: int) -> list[str]:
    return [
        str(
            client.call(
                "run.start", {"workflow": name, "input": {"i": i}, "projectPath": str(project)}
            )["receipt"]["runId"]
        )
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def many() -> Iterator[dict[str, Any]]:
    """One server (no execution) with RUNS runs of two workflows in two projects."""
    root = Path(tempfile.mkdtemp(prefix="piw-", dir="/tmp"))
    alpha, beta = root / "alpha", root / "beta"
    write_workflow(alpha, "hello")
    write_workflow(beta, "other")
    state_dir = root / "agent" / "workflows"
    server = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=False)
    server.start()
    try:
        with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
            hello = _start_many(client, alpha, "hello", RUNS - 50)
            other = _start_many(client, beta, "other", 50)
            cancelled = hello[:7]
            paused = hello[7:12]
            for run_id in cancelled:
                client.call("run.cancel", run_id=run_id)
            for run_id in paused:
                client.call("run.pause", run_id=run_id)
            yield {
                "server": server,
                "state_dir": state_dir,
                "alpha": alpha,
                "beta": beta,
                "project": alpha,
                "hello": hello,
                "other": other,
                "cancelled": cancelled,
                "paused": paused,
            }
    finally:
        server.stop("test teardown")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def client(many: dict[str, Any]) -> Iterator[WorkflowClient]:
    with WorkflowClient(many["state_dir"], autostart=False, timeout=30) as connected:
        yield connected


def _ids(items: list[Any]) -> list[str]:
    return [item["runId"] for item in items]


def _all(many: dict[str, Any]) -> list[str]:
    return [*many["hello"], *many["other"]]


def test_pages_have_at_most_limit_items_a_cursor_and_one_revision(
    many: dict[str, Any], client: WorkflowClient
) -> None:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    seen: list[str] = []
    cursor: str | None = None
    revisions = set()
    pages = 0
    while True:
        payload: dict[str, Any] = {"limit": 100}
        if cursor is not None:
            payload["cursor"] = cursor
        answer = client.call("run.list", payload)
        page = answer["receipt"]
        validator.validate(page)
        assert page["cursor"] == cursor and answer["revision"] == page["revision"]
        assert len(page["items"]) <= 100
        revisions.add(page["revision"])
        seen.extend(_ids(page["items"]))
        pages += 1
        cursor = page.get("nextCursor")
        if cursor is None:
            break
    assert pages == 3 and len(revisions) == 1
    assert sorted(seen) == sorted(_all(many)) and len(set(seen)) == len(seen)
    # Newest first: the last run started heads the list.
    assert seen[0] == many["other"][-1]
    default = client.call("run.list")["receipt"]
    assert len(default["items"]) == 100 and "nextCursor" in default


def test_items_carry_status_and_source_facts_only(client: WorkflowClient) -> None:
    items = client.call("run.list", {"limit": 256})["receipt"]["items"]
    allowed = {
        "runId", "workflow", "title", "revision", "createdAt", "updatedAt", "finishedAt",
        "display", "executionMode",
    }  # fmt: skip
    for item in items:
        assert set(item) <= allowed, set(item) - allowed


def test_client_collects_every_page_of_one_revision(
    many: dict[str, Any], client: WorkflowClient
) -> None:
    pages: list[Mapping[str, Any]] = []
    listed = client.list_runs(on_page=pages.append)
    assert listed.restarts == 0 and listed.pages == 2 and not listed.truncated
    assert sorted(_ids(listed.items)) == sorted(_all(many))
    assert {page["revision"] for page in pages} == {listed.revision}
    limited = client.list_runs(limit=10)
    assert _ids(limited.items) == _ids(listed.items)[:10] and limited.truncated


def test_a_revision_change_between_pages_discards_the_partial_list(
    many: dict[str, Any], client: WorkflowClient
) -> None:
    started: list[str] = []
    revisions: list[int] = []

    def between_pages(page: Mapping[str, Any]) -> None:
        revisions.append(page["revision"])
        if not started:  # a run starts after the first page of the first pass
            with WorkflowClient(many["state_dir"], autostart=False, timeout=30) as other:
                started.extend(_start_many(other, many["beta"], "other", 1))

    listed = client.list_runs(page_items=100, on_page=between_pages)
    many["other"].extend(started)
    # Page 1 of pass 1 had the old revision, page 2 the new one (that pass is
    # discarded); pass 2 read only the new revision, page by page.
    pages = -(-len(_all(many)) // 100)
    assert listed.restarts == 1 and listed.pages == pages
    assert revisions[0] != listed.revision
    assert revisions[1:] == [listed.revision] * (pages + 1)
    assert _ids(listed.items)[0] == started[0]
    assert sorted(_ids(listed.items)) == sorted(_all(many))


def test_a_small_page_size_still_collects_a_changing_list(
    many: dict[str, Any], client: WorkflowClient
) -> None:
    """The raw pages: a run started between pages changes the second page's revision."""
    first = client.call("run.list", {"limit": 5, "workflow": "other"})["receipt"]
    added = _start_many(client, many["beta"], "other", 1)
    many["other"].extend(added)
    second = client.call(
        "run.list", {"limit": 5, "workflow": "other", "cursor": first["nextCursor"]}
    )
    assert second["receipt"]["revision"] != first["revision"]
    assert second["receipt"]["cursor"] == first["nextCursor"]


def test_filters_by_status_workflow_project_and_time(
    many: dict[str, Any], client: WorkflowClient
) -> None:
    cancelled = client.list_runs(status=["cancelled"])
    assert sorted(_ids(cancelled.items)) == sorted(many["cancelled"])
    paused_or_cancelled = client.list_runs(status=["paused", "cancelled"])
    assert sorted(_ids(paused_or_cancelled.items)) == sorted(many["cancelled"] + many["paused"])
    others = client.list_runs(workflow="other")
    assert sorted(_ids(others.items)) == sorted(many["other"])
    in_beta = client.list_runs(project=str(many["beta"]))
    assert sorted(_ids(in_beta.items)) == sorted(many["other"])
    assert client.list_runs(workflow="hello", project=str(many["beta"])).items == []
    everything = client.list_runs().items
    times = sorted({item["createdAt"] for item in everything})
    middle = times[len(times) // 2]
    newer = client.list_runs(since_ms=middle).items
    older = client.list_runs(until_ms=middle).items
    assert {item["runId"] for item in newer} == {
        item["runId"] for item in everything if item["createdAt"] >= middle
    }
    assert {item["runId"] for item in older} == {
        item["runId"] for item in everything if item["createdAt"] < middle
    }
    assert len(newer) + len(older) == len(everything)


def test_the_status_filter_agrees_with_the_display_status(client: WorkflowClient) -> None:
    everything = client.list_runs().items
    by_filter: dict[str, set[str]] = {}
    for status in DISPLAY_STATUSES:
        by_filter[status] = set(_ids(client.list_runs(status=[status]).items))
    for item in everything:
        matches = [status for status, ids in by_filter.items() if item["runId"] in ids]
        assert matches == [item["display"]["status"]]


# The SQL filter and the item's status agree: tests/server/test_display_status.py.


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"limit": 0}, "payloadInvalid"),
        ({"limit": 257}, "payloadInvalid"),
        ({"limit": True}, "payloadInvalid"),
        ({"cursor": "x"}, "cursorInvalid"),
        ({"cursor": "c1.12.", "limit": 3}, "cursorInvalid"),
        ({"status": ["parked"]}, "payloadInvalid"),
        ({"status": []}, "payloadInvalid"),
        ({"since": -1}, "payloadInvalid"),
        ({"workflow": ""}, "payloadInvalid"),
        ({"bogus": 1}, "payloadInvalid"),
    ],
)
def test_a_bad_page_request_is_rejected_with_its_reason(
    client: WorkflowClient, payload: dict[str, Any], code: str
) -> None:
    with pytest.raises(RequestFailedError) as failed:
        client.call("run.list", payload)
    assert failed.value.outcome == "rejected" and failed.value.code == code


def test_the_subscription_page_points_at_the_rest(client: WorkflowClient) -> None:
    client.call("view.subscribe", {"kind": "runList"})
    while True:
        event = client.read_message()
        assert event is not None
        if event["type"] == "event":
            break
    page = event["payload"]
    assert len(page["items"]) == 256 and page["revision"] == event["revision"]
    rest = client.call("run.list", {"cursor": page["nextCursor"], "limit": 256})["receipt"]
    if rest["revision"] == page["revision"]:
        assert len(page["items"]) + len(rest["items"]) == len(client.list_runs().items)
