"""A realistic message mix shared by the wire benchmarks: small envelopes and 64 KiB run views."""

from __future__ import annotations

import random
from typing import Any

RUN_VIEW_BYTES = 64 * 1024


def envelopes(rng: random.Random, count: int) -> list[dict[str, Any]]:
    """Requests, responses, hellos and small events as the client protocol sends them."""
    operations = ["server.status", "run.pause", "run.cancel", "run.get", "run.list", "run.start"]
    result: list[dict[str, Any]] = []
    for index in range(count):
        kind = index % 4
        if kind == 0:
            result.append(
                {
                    "schema": "pi-workflows.client.v1",
                    "type": "request",
                    "requestId": f"req-{index}",
                    "clientId": "cli-7f3a",
                    "operation": rng.choice(operations),
                    "idempotencyKey": f"key-{rng.getrandbits(64):016x}",
                    "runId": f"run-{index % 97}",
                    "expectedRevision": rng.randint(1, 500),
                    "payload": {"reason": "operator request"},
                }
            )
        elif kind == 1:
            result.append(
                {
                    "schema": "pi-workflows.client.v1",
                    "type": "response",
                    "requestId": f"req-{index}",
                    "outcome": rng.choice(["accepted", "adopted", "conflict"]),
                    "revision": rng.randint(1, 500),
                    "receipt": {"runId": f"run-{index % 97}", "state": "paused", "generation": 3},
                }
            )
        elif kind == 2:
            result.append(
                {
                    "schema": "pi-workflows.client.v1",
                    "type": "hello",
                    "connectionId": f"connection-{index}",
                    "packageVersion": "0.1.0",
                }
            )
        else:
            result.append(
                {
                    "schema": "pi-workflows.client.v1",
                    "type": "event",
                    "subscriptionId": f"sub-{index}",
                    "kind": "runPatch",
                    "revision": index,
                    "payload": {
                        "display": {
                            "status": "running",
                            "activity": "worker",
                            "controls": ["pause", "cancel"],
                        }
                    },
                }
            )
    return result


def run_view(rng: random.Random, index: int) -> dict[str, Any]:
    """A run view of about 64 KiB: graph, trace and step outputs, with nulls and some non-ASCII."""
    steps: list[dict[str, Any]] = []
    view: dict[str, Any] = {
        "schema": "pi-workflows.run-view.v1",
        "revision": index,
        "runId": f"run-{index}",
        "display": {
            "status": "running",
            "activity": "worker",
            "controls": ["pause", "cancel"],
            "reason": None,
            "currentNode": "build",
        },
        "graph": {
            "nodes": [
                {"id": f"node-{n}", "kind": "compute", "label": f"Step {n}"} for n in range(40)
            ],
            "edges": [{"from": f"node-{n}", "to": f"node-{n + 1}"} for n in range(39)],
        },
        "steps": steps,
        "cursors": {"trace": None, "steps": f"cursor-{index}"},
    }
    size = 2000
    while size < RUN_VIEW_BYTES:
        text = "".join(
            rng.choice("abcdefghij klmnopqrstuvwxyz.,é—") for _ in range(rng.randint(20, 200))
        )
        step = {
            "attemptId": f"att-{len(steps)}",
            "nodeId": f"node-{len(steps) % 40}",
            "status": "completed",
            "startedAt": 1_764_000_000_000 + len(steps),
            "finishedAt": None if len(steps) % 5 else 1_764_000_000_500,
            "output": {"summary": text, "exitCode": 0, "lines": rng.randint(0, 10_000)},
        }
        steps.append(step)
        size += len(text) + 200
    return view
