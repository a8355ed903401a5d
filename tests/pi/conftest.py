"""Fixtures for tests that run the real `pi` binary (npm-installed by `make node_modules`).

Without node, npm or the installed package these tests fail, saying what to install;
they never skip. At most two real pi children run at once across every test process on
the machine (about 1 s and 150 MB each): each test takes one of two file-lock slots.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from pi_workflows.engine._pi_child import PiChild, PiLaunch, PiOptions
from pi_workflows.pi import BridgeConfig, bridge_extension_path, write_bridge_config
from pi_workflows.testing import FAKE_MODEL, FAKE_PROVIDER, FakeProvider
from tests.pi.rigs import PiRoot

REPO = Path(__file__).resolve().parents[2]
PI_BIN = REPO / "node_modules" / ".bin" / "pi"
PI_SLOTS = 2
INSTALL_HINT = (
    "install Node.js >= 20.6 with npm (e.g. `apt-get install nodejs npm`), then run "
    "`make node_modules` (npm ci --ignore-scripts) in the repository"
)

OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {"summary": {"type": "string"}},
    "required": ["summary"],
}


def require_node_tools() -> None:
    """Fail (never skip) when node, npm or the installed pi package is missing."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"the real-pi tests need {' and '.join(missing)}: {INSTALL_HINT}")
    if not PI_BIN.exists():
        pytest.fail(f"node_modules/.bin/pi is missing: {INSTALL_HINT}")


@pytest.fixture(scope="session")
def pi_binary() -> Path:
    require_node_tools()
    return PI_BIN


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    """One fake provider per test module; each test scripts it afresh."""
    with FakeProvider() as fake:
        yield fake


@pytest.fixture
def pi_slot() -> Iterator[None]:
    """Hold one of PI_SLOTS machine-wide slots while the test runs real pi children."""
    folder = Path(tempfile.gettempdir())
    handles = [(folder / f"pi-workflows-real-pi-{i}.lock").open("a") for i in range(PI_SLOTS)]
    try:
        if not any(_try_lock(handle) for handle in handles):
            # Every slot is taken: wait for one (another test's child ends soon).
            fcntl.flock(handles[os.getpid() % PI_SLOTS], fcntl.LOCK_EX)
        yield
    finally:
        for handle in handles:
            handle.close()  # closing releases the lock


def _try_lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@dataclass
class PiHarness(PiRoot):
    """A private root for one test's pi child: agent dir, project, TMPDIR, stderr log."""

    def bridge_config(self, **fields: object) -> BridgeConfig:
        values: dict[str, object] = {
            "run_id": "run-1",
            "interaction_id": "request-1",
            "step": "plan",
            "attempt": "attempt-1",
            "client_id": "bridge-test",
            "output_schema": OUTPUT_SCHEMA,
        }
        values.update(fields)
        return BridgeConfig(**values)  # type: ignore[arg-type]

    def launch(
        self, *, config: BridgeConfig | None = None, options: PiOptions | None = None
    ) -> PiLaunch:
        extra = write_bridge_config(self.root / "bridge.json", config or self.bridge_config())
        return PiLaunch.build(
            environ=self.environ(),
            bridge=bridge_extension_path(),
            cwd=self.project,
            options=options or PiOptions(provider=FAKE_PROVIDER, model=FAKE_MODEL),
            agent_dir=self.agent_dir,
            tmpdir=self.root / "tmp",
            extra_env=extra,
            stderr_path=self.stderr_path,
        )

    def spawn(self, launch: PiLaunch | None = None, *, ready_timeout: float = 60) -> PiChild:
        child = PiChild.spawn(launch or self.launch())
        self.children.append(child)
        child.wait_ready(ready_timeout)
        return child


@pytest.fixture
def harness(pi_binary: Path, provider: FakeProvider, pi_slot: None) -> Iterator[PiHarness]:
    root = Path(tempfile.mkdtemp(prefix="piw-pi-", dir="/tmp"))
    for folder in ("project", "tmp"):
        (root / folder).mkdir()
    provider.write_agent_dir(root / "agent")
    provider.script()
    rig = PiHarness(root, provider, pi_binary, [])
    try:
        yield rig
    finally:
        for child in rig.children:
            child.stop()  # by PID: the child's own group and its snapshotted tools
        shutil.rmtree(root, ignore_errors=True)
