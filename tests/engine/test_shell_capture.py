"""How the runner runs a shell command: streamed capture, the exit, the environment.

Issue 11, items 2, 4 and 13a, with real commands (no server: `run_shell` with no
channel registers nothing). Output is read as it comes and only `max_output_bytes` of
each stream is kept; the command's exit ends the wait even when a background process
keeps its pipes open; the command sees only the documented pi-workflows variables.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pi_workflows.engine._shell import run_shell
from pi_workflows.engine.runner import (
    AGENT_DIR_ENV,
    EFFECT_KEY_ENV,
    LAUNCH_ENV,
    RUN_ID_ENV,
    RUNNER_FD_ENV,
)

pytestmark = pytest.mark.timeout(60)


def test_each_stream_keeps_its_cap_and_counts_the_rest() -> None:
    script = "head -c 5000000 /dev/zero | tr '\\0' o; head -c 70000 /dev/zero | tr '\\0' e >&2"
    result = run_shell(["sh", "-c", script], 30_000, 1000)
    assert result["exitCode"] == 0 and result["timedOut"] is False
    assert result["stdout"] == "o" * 1000 and result["stdoutTruncatedBytes"] == 4_999_000
    assert result["stderr"] == "e" * 1000 and result["stderrTruncatedBytes"] == 69_000
    assert result["truncated"] is True


def test_output_under_the_cap_is_whole() -> None:
    result = run_shell(["sh", "-c", "echo out; echo err >&2; exit 3"], 30_000, 1000)
    assert result == {
        "exitCode": 3,
        "signal": None,
        "timedOut": False,
        "stdout": "out\n",
        "stderr": "err\n",
        "stdoutTruncatedBytes": 0,
        "stderrTruncatedBytes": 0,
        "truncated": False,
    }


@pytest.fixture
def pid_file(tmp_path: Path) -> Iterator[Path]:
    """Where a command writes the PID of what it leaves behind; killed by PID after."""
    path = tmp_path / "background.pid"
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, psutil.Error):
            leftover = psutil.Process(int(path.read_text()))
            if leftover.name() == "sleep":
                leftover.kill()
                leftover.wait(10)


@pytest.mark.parametrize("background", ["sleep 60 &", "setsid sleep 60 &"])
def test_the_commands_exit_ends_the_wait_though_a_background_process_keeps_stdout(
    background: str, pid_file: Path
) -> None:
    """`sleep 60 &` (same group) or `setsid sleep 60 &` (a session of its own) keeps the
    pipes open; the command itself exits at once, so it is neither held nor timed out."""
    script = f"{background} echo $! > {pid_file}; echo finished; sleep 0.2"
    started = time.monotonic()
    result = run_shell(["sh", "-c", script], 8_000, 1000)
    elapsed = time.monotonic() - started
    assert result["timedOut"] is False, "it exited 0 long before its timeout"
    assert result["exitCode"] == 0
    assert result["stdout"] == "finished\n"
    assert elapsed < 8.0, "the background process did not hold the result"
    assert psutil.Process(int(pid_file.read_text())).is_running(), "it really kept the pipe"


def test_output_written_just_before_the_exit_is_kept() -> None:
    """The drain after the exit reads what is already in the pipes."""
    script = "head -c 200000 /dev/zero | tr '\\0' z; exec 1>&-; sleep 0.1"
    result = run_shell(["sh", "-c", script], 30_000, 1_000_000)
    assert result["stdout"] == "z" * 200_000


def test_a_command_past_its_deadline_is_stopped_and_reported_timed_out() -> None:
    started = time.monotonic()
    result = run_shell(["sh", "-c", "echo started; exec sleep 30"], 300, 1000)
    assert result["timedOut"] is True
    assert result["signal"] == signal.SIGTERM and result["exitCode"] is None
    assert result["stdout"] == "started\n"
    assert time.monotonic() - started < 20


def test_a_command_sees_the_documented_variables_and_no_runner_internals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (LAUNCH_ENV, RUNNER_FD_ENV, AGENT_DIR_ENV, "PI_WORKFLOWS_ZYGOTE_FD"):
        monkeypatch.setenv(name, "private")
    monkeypatch.setenv("SOME_USER_SETTING", "kept")
    result = run_shell(["env"], 30_000, 100_000, effect_key="sha256:abc", run_id="run-7")
    env = dict(line.split("=", 1) for line in result["stdout"].splitlines() if "=" in line)
    assert env[EFFECT_KEY_ENV] == "sha256:abc"
    assert env[RUN_ID_ENV] == "run-7"
    assert env["SOME_USER_SETTING"] == "kept", "the user's own environment is inherited"
    private = {LAUNCH_ENV, RUNNER_FD_ENV, AGENT_DIR_ENV, "PI_WORKFLOWS_ZYGOTE_FD"}
    assert not private & set(env), "no launch envelope, descriptor or agent folder"
