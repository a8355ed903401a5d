"""Shared fixtures: short private temp folders (Unix socket paths are short) and
child-process cleanup by PID, even when a test fails."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, settings

# Hypothesis times every example (200 ms by default) and calls data generation "too
# slow" past a wall-clock budget. On a loaded machine both fail tests that are correct:
# the suite checks behaviour, never speed.
settings.register_profile(
    "pi-workflows", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("pi-workflows")

ECHO_WORKFLOW = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="{name}",
    start_at="echo",
    nodes={{"echo": compute(lambda ctx: {{"echo": ctx.input}})}},
)
"""


SLEEPY_WORKFLOW = """
import time

from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="{name}",
    start_at="nap",
    nodes={{"nap": compute(lambda ctx: time.sleep(300) or {{}}, timeout=600)}},
)
"""


def write_workflow(project: Path, name: str, source: str | None = None) -> Path:
    """Write `<project>/.pi/workflows/NAME.workflow.py` (a one-node echo by default)."""
    folder = project / ".pi" / "workflows"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.workflow.py"
    path.write_text(source if source is not None else ECHO_WORKFLOW.format(name=name))
    return path


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh folder under /tmp with a short path (sun_path holds 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="piw-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def state_dir(short_tmp: Path) -> Path:
    """`<agent dir>/workflows` inside a short temp folder (not created yet)."""
    return short_tmp / "agent" / "workflows"


class Processes:
    """Starts child processes and kills every one of them (and their groups) at teardown."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []
        self._adopted: list[psutil.Process] = []

    def cli(
        self, state_dir: Path, *args: str, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run `pi-workflows --state-dir STATE ARGS` to completion."""
        env = dict(os.environ, PI_CODING_AGENT_DIR=str(state_dir.parent))
        return subprocess.run(
            [sys.executable, "-m", "pi_workflows.cli", "--state-dir", str(state_dir), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )

    def spawn_cli(self, state_dir: Path, *args: str) -> subprocess.Popen[str]:
        """Start `pi-workflows --state-dir STATE ARGS` in its own group; killed at teardown."""
        env = dict(os.environ, PI_CODING_AGENT_DIR=str(state_dir.parent))
        child = subprocess.Popen(
            [sys.executable, "-m", "pi_workflows.cli", "--state-dir", str(state_dir), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.started.append(child)
        return child

    def adopt(self, pid: int) -> None:
        """Kill this PID at teardown too (e.g. a detached server started by the CLI)."""
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            self._adopted.append(process)

    def cleanup(self) -> None:
        for child in self.started:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(10)
        for process in self._adopted:
            with contextlib.suppress(psutil.Error):
                process.kill()
                process.wait(10)
        self._adopted.clear()


@pytest.fixture
def processes() -> Iterator[Processes]:
    tracker = Processes()
    try:
        yield tracker
    finally:
        tracker.cleanup()


def wait_for_attempt(state_dir: Path, run_id: str, timeout: float = 30.0) -> None:
    """Wait until a node attempt of the run is committed (read from a WAL reader).

    A runner sends a pure node's start without waiting for it; a test that kills the
    server mid-node and then expects an interrupted attempt waits for that commit first.
    """
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        db = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
        try:
            found = db.execute(
                "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?", (run_id,)
            ).fetchone()[0]
        finally:
            db.close()
        if found:
            return
        assert time.monotonic() < deadline, f"no attempt of {run_id} was committed"
        pause.wait(0.05)
