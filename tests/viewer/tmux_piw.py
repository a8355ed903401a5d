"""`piw` in a real terminal: a private tmux server with one pane running one command.

The tmux tests and the piw benchmarks use it. The pane's process is the command itself
(exec'd by tmux, no shell), with the caller's environment; waits poll the screen with a
bound; `close` kills the command and the tmux server by PID.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

WAIT_S = 60.0
TMUX_HINT = "install tmux (e.g. `apt-get install -y tmux`); .ci/run does on a fresh machine"


def tmux_binary() -> str:
    """The tmux binary, or an AssertionError saying what to install."""
    found = shutil.which("tmux")
    if found is None:
        raise AssertionError(f"piw's terminal tests need tmux: {TMUX_HINT}")
    return found


@dataclass
class TmuxPane:
    """One command in a pane of a private tmux server (socket under `root`)."""

    root: Path
    columns: int = 120
    lines: int = 40
    tmux: str = field(default_factory=tmux_binary)
    processes: list[psutil.Process] = field(default_factory=list)
    environment: dict[str, str] = field(
        default_factory=lambda: {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8"}
    )
    """The tmux server's own environment, built from scratch: the caller's may hold
    `COLUMNS`/`LINES` (pytest's), which would pin the pane's program to that size."""

    @property
    def socket(self) -> Path:
        return self.root / "tmux.sock"

    def run_tmux(self, *args: str, check: bool = True) -> str:
        """`tmux -S SOCKET ARGS`; its output."""
        done = subprocess.run(
            [self.tmux, "-S", str(self.socket), "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env=self.environment,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"tmux {args[0]} failed: {done.stderr.strip()}")
        return done.stdout

    def launch(self, command: Sequence[str], env: Mapping[str, str]) -> psutil.Process:
        """Start `command` as the pane's process; that process."""
        environment = [f"{name}={value}" for name, value in env.items()]
        self.run_tmux(
            "new-session", "-d", "-s", "piw", "-x", str(self.columns), "-y", str(self.lines),
            *[arg for pair in (("-e", item) for item in environment) for arg in pair],
            *command,
        )  # fmt: skip
        self.run_tmux("set-option", "-t", "piw", "remain-on-exit", "on", check=False)
        server = int(self.run_tmux("display-message", "-p", "#{pid}").strip())
        self.processes.append(psutil.Process(server))
        pid = int(self.run_tmux("display-message", "-p", "-t", "piw", "#{pane_pid}").strip())
        process = psutil.Process(pid)
        self.processes.insert(0, process)
        return process

    def screen(self) -> str:
        """The pane's visible text."""
        return self.run_tmux("capture-pane", "-p", "-t", "piw", check=False)

    def wait_screen(
        self, ready: Callable[[str], object], what: str, timeout: float = WAIT_S
    ) -> str:
        """Poll the screen until `ready(text)` holds; the text."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if ready(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"piw never showed {what}; the screen:\n{text}")
            time.sleep(0.1)

    def keys(self, *keys: str) -> None:
        """Press `keys` (tmux key names: `q`, `Enter`, `C-c`)."""
        self.run_tmux("send-keys", "-t", "piw", *keys)

    def pane_dead(self) -> bool:
        """True once the pane's command exited."""
        return self.run_tmux("display-message", "-p", "-t", "piw", "#{pane_dead}").strip() == "1"

    def close(self) -> None:
        """Kill the command, its children and the tmux server; wait for each."""
        for process in self.processes:
            with contextlib.suppress(psutil.Error):
                for child in process.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        child.kill()
                process.kill()
                process.wait(10)
        self.run_tmux("kill-server", check=False)
        self.socket.unlink(missing_ok=True)
