"""The typed views are what a type checker sees: mypy knows a run view's keys.

A Python user navigates `view["display"]["status"]` with the keys checked; a misspelt
key or a wrong status is an error before the code runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

pytestmark = pytest.mark.timeout(300)

GOOD = """
from pi_workflows import LiveViews, RunView, RunListPage, TraceItem

def summary(view: RunView) -> str:
    display = view["display"]
    node = display.get("currentNode") or display.get("waitingOn") or "-"
    last: TraceItem | None = view["trace"]["items"][-1] if view["trace"]["items"] else None
    outcome = last["outcome"] if last is not None else "-"
    return f"{display['status']} {node} {outcome} {view['lineage']['rootRunId']}"

def names(page: RunListPage) -> list[str]:
    return [item["runId"] + item["display"]["status"] for item in page["items"]]

def follow(live: LiveViews, run_id: str) -> None:
    for view in live.watch_run(run_id, timeout=10):
        if view["display"]["status"] == "completed":
            break
"""

BAD = """
from pi_workflows import RunView

def wrong(view: RunView) -> str:
    return view["display"]["statuz"]

def never(view: RunView) -> bool:
    return view["display"]["status"] == "finished"
"""


def _mypy(tmp: Path, source: str) -> tuple[str, int]:
    module = tmp / "snippet.py"
    module.write_text(source)
    out, err, code = api.run(
        [
            "--strict",
            "--strict-equality",
            "--no-incremental",
            "--cache-dir",
            str(tmp / "c"),
            str(module),
        ]
    )
    return out + err, code


def test_mypy_knows_the_keys_of_a_run_view(short_tmp: Path) -> None:
    out, code = _mypy(short_tmp, GOOD)
    assert code == 0, out
    out, code = _mypy(short_tmp, BAD)
    assert code == 1
    assert '"statuz"' in out, out
    assert "Non-overlapping equality check" in out, out
