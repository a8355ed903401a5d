"""`run-page.v1.schema.json`: its shared definitions stay those of `run-view.v1`, and it
refuses what issue 13 item 5 forbids (more than 256 items, a page of no list)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from pi_workflows.wire import protocol
from pi_workflows.wire.protocol import ProtocolViolation

SHARED = ["revision", "count", "time", "runId", "digest", "contentRef", "value", "attempt"]

PAGE: dict[str, Any] = {
    "schema": "pi-workflows.run-page.v1",
    "runId": "run-1",
    "list": "graphSteps",
    "revision": 40,
    "cursor": "graphSteps<300",
    "items": [
        {
            "attemptId": "a1",
            "node": "n",
            "kind": "compute",
            "visit": 3,
            "attempt": 1,
            "outcome": "completed",
        }
    ],
    "count": 900,
    "first": 299,
    "nextCursor": "graphSteps<299",
    "previousCursor": "graphSteps>300",
}


def _schema(name: str) -> dict[str, Any]:
    text = resources.files("pi_workflows.wire").joinpath(f"schemas/{name}.schema.json")
    return dict(json.loads(text.read_text("utf-8")))


def test_the_shared_definitions_are_those_of_the_run_view() -> None:
    page, view = _schema("run-page.v1")["$defs"], _schema("run-view.v1")["$defs"]
    assert {name: page[name] for name in SHARED} == {name: view[name] for name in SHARED}


def test_a_page_is_valid() -> None:
    protocol.validate("run-page.v1", PAGE)


@pytest.mark.parametrize(
    ("label", "change"),
    [
        ("257 items", {"items": PAGE["items"] * 257}),
        ("another list", {"list": "events"}),
        ("a trace item without its generation", {"list": "trace"}),
        ("no echoed cursor", {"cursor": 3}),
        ("an unknown field", {"claim": "x"}),
    ],
)
def test_a_page_breaking_the_design_is_refused(label: str, change: dict[str, Any]) -> None:
    with pytest.raises(ProtocolViolation):
        protocol.validate("run-page.v1", {**PAGE, **change})
