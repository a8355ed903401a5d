"""Checkpoint continuation chains read as one workflow in `run show`, `run status`, `run wait`.

A run whose checkpoint is answered completes with no output of its own, and the
workflow goes on in its continuation (`lineage.continuedBy`), perhaps several times.
These helpers follow the links from the asked run down to the chain's last run (its
leaf) and say where the chain is now and what it returned. Each hop is that run's own
view, consistent in itself: a parent's completion and its continuation are one commit,
so a completed run that was continued always names its continuation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pi_workflows.cli._advice import advice
from pi_workflows.wire.client import RequestFailedError

__all__ = [
    "MAX_HOPS",
    "Chain",
    "chain_path",
    "chain_rows",
    "follow_chain",
    "next_run",
    "value_text",
]

MAX_HOPS: Final = 100_000
"""A bound on the links followed (a chain is a list; the bound only guards a loop)."""
PATH_RUNS_SHOWN: Final = 4
"""A longer chain's path names its first two runs and its leaf."""
VALUE_CHARS: Final = 4000
"""How much of the chain's output one line shows (`run show --full` shows it whole)."""


@dataclass(frozen=True, slots=True)
class Chain:
    """The runs from the asked one down to the leaf, and the leaf's view."""

    run_ids: tuple[str, ...]
    """The asked run first, the leaf last; at least two runs."""
    leaf: Mapping[str, Any]
    """The leaf's run view (`pi-workflows.run-view.v1`, hydrated for `run show`)."""
    missing: bool = False
    """The last link named a run that is no longer stored (pruned meanwhile)."""


def next_run(view: Mapping[str, Any]) -> str | None:
    """The run that continues this one after its checkpoint, if any (the newest)."""
    continued = view.get("lineage", {}).get("continuedBy") or []
    return str(continued[-1]) if continued else None


def follow_chain(view: Mapping[str, Any], read: Callable[[str], Mapping[str, Any]]) -> Chain | None:
    """Follow `view`'s continuations to the leaf with `read(run_id)`; None if none.

    `read` is `run.get` (or the hydrated view); a link to a run that is gone ends the
    chain there (`missing`), and any other refusal is raised.
    """
    following = next_run(view)
    if following is None:
        return None
    run_ids = [str(view["runId"])]
    leaf = view
    while following is not None and len(run_ids) <= MAX_HOPS:
        try:
            leaf = read(following)
        except RequestFailedError as exc:
            if exc.outcome != "notFound":
                raise
            return Chain((*run_ids, following), leaf, missing=True)
        run_ids.append(following)
        following = next_run(leaf)
    return Chain(tuple(run_ids), leaf)


def chain_path(run_ids: Sequence[str]) -> str:
    """`run-a -> run-b -> run-c`; a long chain as `run-a -> run-b -> ... -> run-z (N runs)`."""
    if len(run_ids) <= PATH_RUNS_SHOWN:
        return " -> ".join(run_ids)
    return f"{run_ids[0]} -> {run_ids[1]} -> ... -> {run_ids[-1]} ({len(run_ids)} runs)"


def value_text(
    shown: Mapping[str, Any] | None, run_id: str, chars: int | None = VALUE_CHARS
) -> str:
    """One value of run `run_id`'s view as text: inline JSON, or what is known of a
    content reference; longer than `chars` (None: no bound), its head and its size."""
    if shown is None:
        return "-"
    full = f"`pi-workflows run show {run_id} --full` prints it"
    if "value" in shown:
        text = json.dumps(shown["value"], sort_keys=True, ensure_ascii=False)
        if chars is None or len(text) <= chars:
            return text
        return f"{text[:chars]} ... ({len(text.encode('utf-8'))} bytes in all; {full})"
    if "unavailable" in shown:
        return f"<unavailable: {shown['unavailable']}>"
    size = shown.get("ref", {}).get("byteCount", "?")
    return f"<{size} bytes; {full}; it begins: {shown.get('preview', '')}>"


def chain_rows(
    chain: Chain | None, chars: int | None = VALUE_CHARS, prefix: str = "pi-workflows"
) -> list[tuple[str, str]]:
    """(label, text) rows that say where the chain is now and what it returned; the
    action's text holds the leaf's advised commands, one a line."""
    if chain is None:
        return []
    if chain.missing:
        return [("chain", f"{chain_path(chain.run_ids)}; the last run is no longer stored")]
    leaf = chain.leaf
    display = leaf["display"]
    now = f"{chain_path(chain.run_ids)}; now at {leaf['runId']}: {display['status']}"
    if display.get("currentNode"):
        now += f" at node {display['currentNode']}"
    elif display.get("waitingOn"):
        now += f", waiting on {display['waitingOn']}"
    rows = [("chain", now)]
    if display.get("reasonText"):
        rows.append(("chain reason", str(display["reasonText"])))
    shown = advice(leaf, prefix)  # about the last run: its commands name it
    if shown.action or shown.commands:
        words = [shown.action] if shown.action else []
        notes = [f"({note})" for note in shown.notes]
        rows.append(("chain action", "\n".join([*words, *shown.commands, *notes])))
    if "result" in leaf:
        output = leaf["result"].get("output")
        rows.append(("chain output", value_text(output, str(leaf["runId"]), chars)))
    return rows
