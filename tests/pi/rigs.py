"""The private root every real-pi test runs in, and how it starts a pi with the extension.

One test gets one root: the Pi agent dir (with the fake provider's models), the project,
pi's TMPDIR and its stderr log. Every child it starts is kept so that the fixture stops
each one by PID.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pi_workflows.engine._pi_child import PI_BINARY_ENV, PiChild, PiLaunch, PiOptions
from pi_workflows.pi import extension_path
from pi_workflows.testing import FAKE_MODEL, FAKE_PROVIDER, FakeProvider


@dataclass
class PiRoot:
    """A private root for one test's pi children."""

    root: Path
    provider: FakeProvider
    binary: Path
    children: list[PiChild]

    @property
    def agent_dir(self) -> Path:
        return self.root / "agent"

    @property
    def state_dir(self) -> Path:
        """The workflow server's state folder inside the Pi agent dir."""
        return self.agent_dir / "workflows"

    @property
    def project(self) -> Path:
        return self.root / "project"

    @property
    def stderr_path(self) -> Path:
        return self.root / "pi.stderr.log"

    def environ(self, **overrides: str) -> dict[str, str]:
        return {**os.environ, PI_BINARY_ENV: str(self.binary), **overrides}

    def spawn_extension(
        self, session: Path | None = None, extra_env: dict[str, str] | None = None
    ) -> PiChild:
        """`pi --mode rpc -e <the pi-workflows extension>`, ready; on the session file
        `session` (starting pi again on it is a Pi restart), else with no session file."""
        launch = PiLaunch.build(
            environ=self.environ(),
            bridge=extension_path(),
            cwd=self.project,
            options=PiOptions(provider=FAKE_PROVIDER, model=FAKE_MODEL),
            agent_dir=self.agent_dir,
            tmpdir=self.root / "tmp",
            extra_env=extra_env or {},
            stderr_path=self.stderr_path,
        )
        if session is not None:
            argv = list(launch.argv)
            at = argv.index("--no-session")
            argv[at : at + 1] = ["--session", str(session)]
            launch = PiLaunch(tuple(argv), launch.env, launch.cwd, launch.stderr_path)
        child = PiChild.spawn(launch)
        self.children.append(child)
        child.wait_ready(60)
        return child
