"""The stop sequence's escalation, against a stand-in for a pi that will not stop.

The real pi exits on stdin EOF or SIGTERM (test_pi_child.py), so the SIGKILL path and
the ending of tool processes left behind need a child that ignores both: a small Python
program that answers `get_state`, starts a tool in a session of its own that also
ignores SIGTERM, and then waits forever. Real processes, real signals.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from pi_workflows.engine._pi_child import PI_BINARY_ENV, PiChild, PiLaunch, PiTimeout
from pi_workflows.pi import bridge_extension_path
from pi_workflows.supervision import identity_of, is_alive

STUBBORN_PI = textwrap.dedent(
    """\
    #!{python}
    import json, os, signal, subprocess, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    tool = subprocess.Popen(
        [sys.executable, "-c",
         "import os, signal; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
         " os.write(1, b'up'); signal.pause()"],
        stdout=subprocess.PIPE, start_new_session={tool_session},
    )
    tool.stdout.read(2)  # the tool runs and ignores SIGTERM
    for line in sys.stdin:
        command = json.loads(line)
        reply = {{"id": command["id"], "type": "response", "command": command["type"],
                  "success": True, "data": {{"toolPid": tool.pid}}}}
        print(json.dumps(reply), flush=True)
    while True:  # stdin closed: hang on, as a pi stuck in cleanup would
        signal.pause()
    """
)


def stubborn_pi(tmp_path: Path, *, tool_session: bool) -> PiLaunch:
    script = tmp_path / "stubborn-pi"
    script.write_text(STUBBORN_PI.format(python=sys.executable, tool_session=tool_session))
    script.chmod(0o700)
    return PiLaunch.build(
        environ={PI_BINARY_ENV: str(script), "PATH": os.defpath, "HOME": str(tmp_path)},
        bridge=bridge_extension_path(),
        cwd=tmp_path,
    )


@pytest.mark.parametrize("tool_session", [True, False], ids=["tool-own-session", "tool-in-group"])
def test_a_pi_that_ignores_eof_and_sigterm_is_killed_with_its_tools(
    tmp_path: Path, tool_session: bool
) -> None:
    child = PiChild.spawn(stubborn_pi(tmp_path, tool_session=tool_session))
    try:
        tool_pid = child.wait_ready(30)["toolPid"]
        tool = identity_of(tool_pid)
        assert tool is not None and is_alive(tool)
        assert (os.getpgid(tool_pid) == child.pid) is not tool_session

        report = child.stop(eof_grace_s=0.5, term_grace_s=0.5)

        assert report.how == "sigkill" and report.returncode == -9
        assert not is_alive(tool), "the tool outlived the stop"
        assert report.survivors == ()
        assert child.returncode == -9, "pi is reaped"
    finally:
        child.stop()


def test_waiting_for_an_answer_pi_never_sends_times_out(tmp_path: Path) -> None:
    child = PiChild.spawn(stubborn_pi(tmp_path, tool_session=True))
    try:
        child.wait_ready(30)
        command_id = child.send({"type": "prompt", "message": "x"})
        child.wait_response(command_id, 30)  # the stand-in answers every command
        with pytest.raises(PiTimeout):
            child.next_event(0.2)  # but it never streams an event
    finally:
        report = child.stop(eof_grace_s=0.5, term_grace_s=0.5)
    assert report.how == "sigkill"
