"""The widget and status line in the real `pi --mode rpc` (issue 14, "a widget and status
line projected from the session view, scrollable with Shift+Up and Shift+Down").

The extension projects the session view its coordinator subscribes to: the active run,
else the retained terminal run, else nothing. RPC mode cannot send keys, so this proves
the first scroll window (the shortcuts' handlers move it; tests/node/widget.test.ts
proves the window logic and that pi's own loader takes both keys without a conflict).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from pi_workflows import WorkflowServer
from pi_workflows.testing import text_turn
from tests.conftest import write_workflow
from tests.pi.origin_pi import OriginPi, OriginRig, origin_rig, origin_server, wait_until

pytestmark = pytest.mark.timeout(180)
__all__ = ["origin_rig", "origin_server"]

WINDOW_LINES = 8  # widget.ts WINDOW_LINES
HINT = re.compile(r"^lines 1-8 of (\d+) \(Shift\+Up/Shift\+Down to scroll\)$")

BROKEN = """
from pi_workflows import compute, define_workflow

def fail(ctx):
    raise ValueError("\\n".join(f"detail {i}" for i in range(12)))

workflow = define_workflow(name="broken", start_at="go", nodes={"go": compute(fail)}, edges=[])
"""


def _ui(origin: OriginPi, method: str, matches: Any, what: str, since: int) -> dict[str, Any]:
    return origin.wait_event(
        lambda e: (
            e.get("type") == "extension_ui_request" and e.get("method") == method and matches(e)
        ),
        what,
        since=since,
    )


def test_a_finished_run_is_shown_in_a_scroll_window_while_retained_and_cleared_with_the_view(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    write_workflow(origin_rig.project, "broken", BROKEN)
    origin_rig.provider.script(text_turn("It failed."))  # the terminal message's turn
    origin = origin_rig.spawn()
    notice = origin.notice("/workflow start broken")
    found = re.match(r"Started workflow broken: (run-[0-9a-f]+)$", notice, re.M)
    assert found is not None, notice
    run_id = found.group(1)
    session = origin_rig.origin_session(run_id)
    wait_until(lambda: origin_rig.status(run_id) == "failed", "the run to fail")
    [(terminal, *_)] = wait_until(
        lambda: [m for m in origin_rig.messages(run_id) if m[1] == "terminal" and m[3] == "sent"],
        "the terminal message sent",
    )
    wait_until(
        lambda: [s for _, m, s in origin_rig.turns(run_id) if m == terminal and s != "open"],
        "the terminal message's turn to end",
    )
    # The session view retains the failed run, and the widget shows its first window.
    retained = origin_rig.session_view(session)["activeRun"]
    assert retained["runId"] == run_id
    display = retained["display"]
    assert display["status"] == "failed"
    shown = _ui(
        origin,
        "setWidget",
        lambda e: f"{run_id}: failed" in " ".join(e.get("widgetLines") or []),
        "the failed run in the widget",
        0,
    )
    lines = list(shown["widgetLines"])
    assert len(lines) == WINDOW_LINES + 1, lines
    assert lines[0] == f"workflow broken {run_id}: failed"
    # Each allowed control as the /workflow command that performs it, in the first window.
    for control in display["controls"]:
        assert f"  /workflow {control} {run_id}" in lines[:WINDOW_LINES], lines
    hint = HINT.match(lines[-1])
    assert hint is not None and int(hint.group(1)) > WINDOW_LINES, lines[-1]
    assert any("detail" in line for line in lines), "the stored reason, copied"
    status = _ui(origin, "setStatus", lambda e: "failed" in str(e.get("statusText")), "status", 0)
    assert status["statusText"] == "workflow broken: failed"
    # Registering Shift+Up / Shift+Down raised nothing and pi logged no shortcut problem.
    assert "shortcut" not in origin_rig.stderr_path.read_text(errors="replace").lower()

    mark = len(origin.events)
    assert origin.notice("/workflow clear") == f"Cleared {run_id} from this session's view."
    assert origin_rig.session_view(session)["activeRun"] is None
    cleared = _ui(origin, "setWidget", lambda e: not e.get("widgetLines"), "a cleared widget", mark)
    assert cleared["widgetKey"] == "pi-workflows"
    _ui(origin, "setStatus", lambda e: not e.get("statusText"), "a cleared status line", mark)
