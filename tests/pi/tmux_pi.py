"""The real `pi` in its interactive terminal UI, driven through tmux, for the tests that
need Pi as a person uses it: `/new`, commands typed at the editor, a SIGKILL, and the
command a notice prints to reopen a session.

Each test gets a private tmux server (its own socket in the test's root), so nothing
touches another tmux. Pi runs as the pane's one process (exec'd by tmux, no shell), with
an environment built from scratch: the test's agent dir, HOME and TMPDIR. Waits poll the
screen for a condition with a bound; cleanup kills pi and the tmux server by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from pi_workflows.testing import FAKE_MODEL, FAKE_PROVIDER

WAIT_S = 60.0
COLUMNS = 320
"""Wide enough that a notice naming a session file stays on one screen line."""
TMUX_HINT = "install tmux (e.g. `apt-get install -y tmux`); .ci/run does on a fresh machine"


def require_tmux() -> str:
    """The tmux binary; fail (never skip) without it."""
    found = shutil.which("tmux")
    if found is None:
        pytest.fail(f"the interactive pi tests need tmux: {TMUX_HINT}")
    return found


def use_fake_model(agent_dir: Path) -> None:
    """Make the fake provider Pi's default model, so `pi --session FILE` (the command a
    notice prints) runs as it is, with no model flags."""
    settings_file = agent_dir / "settings.json"
    settings = json.loads(settings_file.read_text()) if settings_file.exists() else {}
    settings |= {"defaultProvider": FAKE_PROVIDER, "defaultModel": FAKE_MODEL}
    settings_file.write_text(json.dumps(settings, indent=2))


@dataclass
class TmuxPi:
    """Interactive pi sessions, one at a time, in a private tmux server."""

    root: Path
    pi_binary: Path
    agent_dir: Path
    project: Path
    tmux: str = field(default_factory=require_tmux)
    pids: list[psutil.Process] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.root / "tmux.sock"

    def environ(self) -> dict[str, str]:
        home = self.root / "home"
        tmp = self.root / "tmp"
        home.mkdir(exist_ok=True)
        tmp.mkdir(exist_ok=True)
        return {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": str(home),
            "TMPDIR": str(tmp),
            "TERM": "xterm-256color",
            "LANG": "C.UTF-8",
            "PI_CODING_AGENT_DIR": str(self.agent_dir),
            "PI_OFFLINE": "1",
            "PI_SKIP_VERSION_CHECK": "1",
            "PI_TELEMETRY": "0",
            "NO_COLOR": "1",
        }

    def _tmux(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            [self.tmux, "-S", str(self.socket), "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            env=self.environ(),
            timeout=30,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"tmux {args[0]} failed: {done.stderr.strip()}")
        return done.stdout

    def launch(self, args: Sequence[str] = ()) -> psutil.Process:
        """Start `pi ARGS` in the project and wait for its editor; its process."""
        self._tmux(
            "new-session", "-d", "-s", "pi", "-x", str(COLUMNS), "-y", "60",
            "-c", str(self.project), str(self.pi_binary), *args,
        )  # fmt: skip
        for name in ("remain-on-exit", "history-limit"):
            value = "off" if name == "remain-on-exit" else "5000"
            self._tmux("set-option", "-t", "pi", name, value, check=False)
        pid = int(self._tmux("display-message", "-p", "-t", "pi", "#{pane_pid}").strip())
        process = psutil.Process(pid)
        self.pids.append(process)
        server = int(self._tmux("display-message", "-p", "#{pid}").strip())
        self.pids.append(psutil.Process(server))
        self.wait_screen(lambda text: FAKE_MODEL in text, "pi's editor and footer")
        return process

    def screen(self) -> str:
        """The pane's text, history included."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-5000", "-t", "pi", check=False)

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
                raise AssertionError(f"pi never showed {what}; the screen:\n{text[-3000:]}")
            time.sleep(0.1)

    def type(self, text: str) -> None:
        """Type `text` at the editor, wait until it shows, then press Enter."""
        before = self.screen().count(text)
        self._tmux("send-keys", "-t", "pi", "-l", text)
        self.wait_screen(lambda screen: screen.count(text) > before, f"the typed {text!r}")
        self._tmux("send-keys", "-t", "pi", "Enter")

    def find(self, pattern: str, what: str, timeout: float = WAIT_S) -> re.Match[str]:
        """Wait for a screen line matching `pattern`; the newest match."""
        compiled = re.compile(pattern)
        text = self.wait_screen(compiled.search, what, timeout)
        return list(compiled.finditer(text))[-1]

    def kill(self, process: psutil.Process) -> None:
        """SIGKILL pi (no shutdown of any kind) and wait until it is gone."""
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        self._tmux("kill-server", check=False)

    def close(self) -> None:
        for process in self.pids:
            with contextlib.suppress(psutil.Error):
                process.kill()
                process.wait(10)
        self._tmux("kill-server", check=False)
