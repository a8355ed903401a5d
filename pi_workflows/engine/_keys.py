"""Compiled node paths and engine-derived effect idempotency keys.

Implements python-port.md decision 6 and workflow-server.md § Effects and retry safety:
the key is the sha256 of the canonical JSON of (run ID, effect type, full compiled node
path, visit), so a crash rerun reuses its key and a loop revisit gets a new one.
"""

from __future__ import annotations

from collections.abc import Sequence

from pi_workflows.wire.canonical import sha256_digest

__all__ = ["EFFECT_KEY_SCHEMA", "compiled_node_path", "effect_idempotency_key"]

EFFECT_KEY_SCHEMA = "pi-workflows.effect-key.v1"
"""Domain tag hashed with the four key parts, so no other digest can collide with a key."""


def compiled_node_path(mounts: Sequence[str], node_id: str) -> str:
    """Return the flat compiled id of `node_id` inside nested include `mounts`.

    `compiled_node_path([], "a") == "a"`; `compiled_node_path(["m", "n"], "x") == "m/n/x"`.
    """
    if not node_id or any(not mount for mount in mounts):
        raise ValueError("mount names and the node id must be non-empty")
    return "/".join([*mounts, node_id])


def effect_idempotency_key(run_id: str, effect_type: str, node_path: str, visit: int) -> str:
    """Return `sha256:<hex>` of the canonical JSON object

    `{"schema": "pi-workflows.effect-key.v1", "runId": …, "effectType": …, "nodePath": …,
    "visit": …}`; `visit` is 1 + finished attempts of the node in the run.
    """
    if isinstance(visit, bool) or not isinstance(visit, int) or visit < 1:
        raise ValueError(f"visit must be an integer ≥ 1, got {visit!r}")
    parts = (("run_id", run_id), ("effect_type", effect_type), ("node_path", node_path))
    for label, value in parts:
        if not isinstance(value, str) or not value:
            raise ValueError(f"{label} must be a non-empty string")
    return sha256_digest(
        {
            "schema": EFFECT_KEY_SCHEMA,
            "runId": run_id,
            "effectType": effect_type,
            "nodePath": node_path,
            "visit": visit,
        }
    )
