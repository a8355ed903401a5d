"""`run-view.v1.schema.json` accepts a complete view and refuses what the design forbids.

A live view of every display rule is validated in tests/server/test_run_view_rules.py;
here one hand-written view is changed one field at a time.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from pi_workflows.wire import protocol
from pi_workflows.wire.protocol import ProtocolViolation

DIGEST = "sha256:" + "ab" * 32

VIEW: dict[str, Any] = {
    "schema": "pi-workflows.run-view.v1",
    "revision": 9,
    "runId": "run-1",
    "workflow": "failing",
    "status": "failed",
    "paused": False,
    "generation": 1,
    "createdAt": 1,
    "updatedAt": 5,
    "finishedAt": 5,
    "executionMode": "headless",
    "failureClass": "nodeFailed",
    "failureReason": "nodeFailed: explode: RuntimeError: boom",
    "display": {
        "status": "failed",
        "activity": None,
        "controls": ["restart"],
        "reasonCode": "nodeFailed",
        "reasonText": "nodeFailed: explode: RuntimeError: boom",
        "action": "Read the failed attempt's error and traceback, fix the workflow, then restart.",
        "next": ["show", "restart"],
    },
    "lineage": {"rootRunId": "run-0", "restartOf": "run-0", "restartedBy": ["run-2"]},
    "queue": {"state": "failed", "kind": "workflow", "priority": 0, "enqueuedAt": 1},
    "state": {"input": {"value": {"n": 41}}},
    "graph": {
        "definition": {
            "digest": DIGEST,
            "mediaType": "application/json",
            "byteCount": 900,
            "marker": "server",
        },
        "startAt": "first",
        "nodes": {"count": 2, "items": [{"id": "explode", "kind": "compute"}]},
        "edges": {"count": 1, "items": [{"from": "first", "to": "explode"}]},
        "steps": {"count": 2},
    },
    "trace": {
        "count": 2,
        "omitted": 0,
        "cursors": {},
        "items": [
            {
                "attemptId": "a1",
                "node": "first",
                "kind": "compute",
                "visit": 1,
                "attempt": 1,
                "generation": 1,
                "startedAt": 2,
                "finishedAt": 3,
                "outcome": "completed",
                "next": "explode",
                "output": {
                    "ref": {
                        "digest": DIGEST,
                        "mediaType": "application/json",
                        "byteCount": 40011,
                        "marker": "server",
                    },
                    "preview": "{",
                },
            },
            {
                "attemptId": "a2",
                "node": "explode",
                "kind": "compute",
                "visit": 1,
                "attempt": 1,
                "generation": 1,
                "startedAt": 3,
                "finishedAt": 4,
                "outcome": "failed",
                "error": "nodeFailed: RuntimeError: boom",
                "traceback": {
                    "ref": {
                        "mediaType": "text/plain",
                        "byteCount": 10,
                        "digest": DIGEST,
                        "marker": "server",
                    },
                    "text": "Traceback…",
                },
            },
        ],
    },
}


def _changed(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    view = copy.deepcopy(VIEW)
    change(view)
    return view


def test_a_complete_view_is_valid() -> None:
    protocol.validate("run-view.v1", VIEW)


def test_a_parked_run_and_a_waiting_decision_are_valid() -> None:
    """`parked` qualifies `queued`; a waiting decision carries its question and choices."""

    def parked(view: dict[str, Any]) -> None:
        view["display"] = {
            "status": "queued",
            "activity": None,
            "controls": ["resume", "pause", "cancel"],
            "parked": True,
            "reason": "workflowSourceChanged",
            "next": ["resume", "cancel"],
        }

    def decision(view: dict[str, Any]) -> None:
        view["display"] = {
            "status": "waiting",
            "activity": None,
            "controls": ["human-answer", "pause", "cancel"],
            "waitingOn": "ask",
            "question": "Ship it?",
            "choices": [
                {"id": "approve", "label": "Approve"},
                {"id": "no", "label": "No", "input": "why"},
            ],
            "next": ["human-answer", "cancel"],
        }

    protocol.validate("run-view.v1", _changed(parked))
    protocol.validate("run-view.v1", _changed(decision))


@pytest.mark.parametrize(
    ("label", "change"),
    [
        ("a parked status", lambda v: v["display"].update(status="parked")),
        ("no controls", lambda v: v["display"].pop("controls")),
        ("an unknown control", lambda v: v["display"].update(controls=["delete"])),
        ("a repeated control", lambda v: v["display"].update(controls=["pause", "pause"])),
        ("an unknown display field", lambda v: v["display"].update(claim="x")),
        ("an unknown advised step", lambda v: v["display"].update(next=["rm -rf"])),
        ("parked false", lambda v: v["display"].update(parked=False)),
        ("a choice without a label", lambda v: v["display"].update(choices=[{"id": "a"}])),
        ("the input in the queue", lambda v: v["queue"].update(input={"n": 41})),
        ("a claim in the lineage", lambda v: v["lineage"].update(claim="x")),
        ("no trace", lambda v: v.pop("trace")),
        ("a value and a reference at once", lambda v: v["state"]["input"].update(preview="{")),
        (
            "a reference without its marker",
            lambda v: v["trace"]["items"][0]["output"]["ref"].pop("marker"),
        ),
        (
            "a client-made marker",
            lambda v: v["trace"]["items"][0]["output"]["ref"].update(marker="x"),
        ),
        (
            "the old truncated notice",
            lambda v: v["trace"]["items"][0].update(
                output={"truncated": True, "byteLength": 1, "preview": ""}
            ),
        ),
        ("an unknown trace cursor", lambda v: v["trace"].update(cursors={"newest": "trace<1"})),
        ("an attempt number zero", lambda v: v["trace"]["items"][0].update(attempt=0)),
        ("an unknown outcome", lambda v: v["trace"]["items"][0].update(outcome="parked")),
        ("a bad digest", lambda v: v["trace"]["items"][1]["traceback"]["ref"].update(digest="x")),
        ("257 trace items", lambda v: v["trace"].update(items=v["trace"]["items"] * 129)),
    ],
)
def test_a_view_breaking_the_design_is_refused(
    label: str, change: Callable[[dict[str, Any]], None]
) -> None:
    with pytest.raises(ProtocolViolation):
        protocol.validate("run-view.v1", _changed(change))
