"""The command line is a light client: a client command imports the wire client and what
it needs, never the server, its actors, storage, the engine or the domain (issue 30).

Each case runs the real console script against a real server (`server run`) with
`PYTHONPROFILEIMPORTTIME=1`, reads the names of every module the process imported from
stderr and checks the set: module names, not times, so it holds on a loaded machine.
The defaults the command line copies from the server's floors are pinned to theirs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.conftest import Processes

pytestmark = pytest.mark.timeout(120)

BIN = Path(sys.executable).parent
HEAVY = (
    "pi_workflows.server",
    "pi_workflows.actors",
    "pi_workflows.storage",
    "pi_workflows.engine",
    "pi_workflows.domain",
    "pi_workflows.supervision",
    "pi_workflows.wire._listener",
    "jsonschema",
    "pykka",
)
"""Packages (with their submodules) that only `server run` and a few local commands load."""
IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| ( *)(\S+)$")


def imported_modules(
    program: str, args: list[str], state_dir: Path, env: Mapping[str, str] | None = None
) -> set[str]:
    """Run `program ARGS` (a console script) and return the names of the modules it
    imported."""
    environment = dict(
        os.environ, PI_CODING_AGENT_DIR=str(state_dir.parent), PYTHONPROFILEIMPORTTIME="1"
    )
    environment.update(env or {})
    done = subprocess.run(
        [str(BIN / program), *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    names = {m.group(2) for line in done.stderr.splitlines() if (m := IMPORT_LINE.match(line))}
    assert "click" in names, "no import profile was read"
    return names


def heavy(names: set[str]) -> list[str]:
    return sorted(
        name for name in names if any(name == h or name.startswith(h + ".") for h in HEAVY)
    )


@pytest.fixture
def server(processes: Processes, state_dir: Path) -> Path:
    """A running server (`server run`); its state folder."""
    child = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0", "--no-execute")
    assert child.stdout is not None
    line = child.stdout.readline()  # the banner comes once the socket accepts
    assert "running" in line, f"server did not start: {line!r}"
    return state_dir


@pytest.mark.parametrize(
    "args",
    [
        ["server", "status"],
        ["server", "status", "--json"],
        ["run", "list"],
        ["run", "list", "--json"],
    ],
    ids=" ".join,
)
def test_a_client_command_loads_no_server_part(server: Path, args: list[str]) -> None:
    names = imported_modules("pi-workflows", ["--state-dir", str(server), *args], server)
    assert "pi_workflows.wire.client" in names
    assert heavy(names) == []


def test_run_id_completion_loads_no_server_part(server: Path) -> None:
    line = f"pi-workflows --state-dir {server} run status "
    env = {
        "_PI_WORKFLOWS_COMPLETE": "bash_complete",
        "COMP_WORDS": line,
        "COMP_CWORD": str(line.count(" ")),
    }
    names = imported_modules("pi-workflows", [], server, env)
    assert "pi_workflows.wire.client" in names  # it asked the server for run IDs
    assert heavy(names) == []


def test_piw_help_loads_no_server_part_and_no_viewer(state_dir: Path) -> None:
    names = imported_modules("piw", ["--help"], state_dir)
    assert heavy(names) == []
    assert not any(name.startswith(("textual", "pi_workflows.viewer")) for name in names)


def test_the_copied_defaults_match_their_floors() -> None:
    from pi_workflows import server as server_floor  # noqa: PLC0415
    from pi_workflows import supervision  # noqa: PLC0415
    from pi_workflows.cli import _main, _resource_manager, _state_prune  # noqa: PLC0415
    from pi_workflows.domain import DEFAULT_OLDER_THAN_DAYS  # noqa: PLC0415
    from pi_workflows.engine import MAX_SPEC_BYTES  # noqa: PLC0415

    assert _main.DEFAULT_DRAIN_S == server_floor.DEFAULT_DRAIN_S
    assert _main.DEFAULT_IDLE_EXIT_S == server_floor.DEFAULT_IDLE_EXIT_S
    assert _main.DEFAULT_MAX_WORKERS == server_floor.DEFAULT_MAX_WORKERS
    assert _main.IDLE_EXIT_ENV == server_floor.IDLE_EXIT_ENV
    assert _main.MAX_WORKERS_ENV == server_floor.MAX_WORKERS_ENV
    assert _main.CRASH_ENV == supervision.CRASH_ENV
    assert _resource_manager.MAX_SPEC_BYTES == MAX_SPEC_BYTES
    assert _state_prune.DEFAULT_OLDER_THAN_DAYS == DEFAULT_OLDER_THAN_DAYS
