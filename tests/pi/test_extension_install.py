"""`pi-workflows pi-extension path|install`, and the extension shipped as package data.

The install links `<agent dir>/extensions/pi-workflows` to the package's extension
folder, the place Pi's docs/extensions.md § Extension Locations auto-discovers
(`~/.pi/agent/extensions/*/index.ts`, `~/.pi/agent` being `$PI_CODING_AGENT_DIR`).
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pi_workflows.engine._pi_child import PiChild, PiLaunch, pi_environment
from pi_workflows.pi import extension_dir, extension_path
from pi_workflows.testing import FakeProvider
from tests.pi.conftest import REPO

pytestmark = pytest.mark.timeout(120)


def _cli(agent_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PI_CODING_AGENT_DIR": str(agent_dir)}
    return subprocess.run(
        [sys.executable, "-m", "pi_workflows.cli", "pi-extension", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_path_prints_the_extension_folder_whose_imports_ship_beside_it(tmp_path: Path) -> None:
    result = _cli(tmp_path / "agent", "path")
    assert result.returncode == 0, result.stderr
    folder = Path(result.stdout.strip())
    assert folder == extension_dir() and folder.is_absolute()
    assert (folder / "index.ts").is_file() and extension_path() == folder / "index.ts"
    # What index.ts imports: the shared protocol client and the wire schemas.
    for shared in ("canonical.ts", "protocol.ts", "schema.ts", "transport.ts"):
        assert (folder.parent / "common" / shared).is_file()
    assert (folder.parent.parent / "wire" / "schemas" / "client.v1.schema.json").is_file()


def test_every_typescript_file_is_package_data() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["pi_workflows"]
    package = REPO / "pi_workflows"
    files = sorted(str(p.relative_to(package)) for p in (package / "pi").rglob("*.ts"))
    assert any(f.startswith("pi/extension/") for f in files)
    missing = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert missing == [], f"not in the wheel: {missing}"


def test_install_links_the_folder_and_is_idempotent(tmp_path: Path) -> None:
    agent = tmp_path / "agent"
    link = agent / "extensions" / "pi-workflows"
    first = _cli(agent, "install")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"installed: {link} -> {extension_dir()}\n"), first.stdout
    assert link.is_symlink() and link.resolve() == extension_dir().resolve()
    again = _cli(agent, "install")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"already installed: {link} -> {extension_dir()}"
    assert link.is_symlink() and link.resolve() == extension_dir().resolve()
    assert sorted(p.name for p in link.parent.iterdir()) == ["pi-workflows"]


def test_install_replaces_a_link_to_another_installation_but_never_a_file(tmp_path: Path) -> None:
    agent = tmp_path / "agent"
    link = agent / "extensions" / "pi-workflows"
    link.parent.mkdir(parents=True)
    old = tmp_path / "old-venv-extension"
    old.mkdir()
    link.symlink_to(old, target_is_directory=True)
    relinked = _cli(agent, "install")
    assert relinked.returncode == 0, relinked.stderr
    assert relinked.stdout.startswith("relinked: ")
    assert link.resolve() == extension_dir().resolve()
    link.unlink()
    link.mkdir()
    (link / "index.ts").write_text("// the user's own\n")
    refused = _cli(agent, "install")
    assert refused.returncode == 1
    assert "exists and is not a link" in refused.stderr
    assert (link / "index.ts").read_text() == "// the user's own\n", "left untouched"


def test_real_pi_discovers_the_installed_extension(
    pi_binary: Path, pi_slot: None, tmp_path: Path
) -> None:
    agent = tmp_path / "agent"
    with FakeProvider() as provider:
        provider.write_agent_dir(agent)
    assert _cli(agent, "install").returncode == 0
    (tmp_path / "project").mkdir()
    (tmp_path / "tmp").mkdir()
    # pi's auto-discovery, so no --no-extensions and no -e.
    argv = (
        str(pi_binary),
        "--mode",
        "rpc",
        "--no-session",
        "--offline",
        "--no-skills",
        "--no-prompt-templates",
        "--no-themes",
        "--no-context-files",
    )
    env = pi_environment(os.environ, agent_dir=agent, tmpdir=tmp_path / "tmp")
    child = PiChild.spawn(PiLaunch(argv, env, tmp_path / "project", tmp_path / "pi.log"))
    try:
        child.wait_ready(60)
        commands = child.command({"type": "get_commands"}, 30)["commands"]
    finally:
        child.stop()
    ours = {c["name"]: c["sourceInfo"] for c in commands if c["source"] == "extension"}
    assert set(ours) == {"workflow", "piw", "resource-manager"}, commands
    assert ours["workflow"]["path"] == str(agent / "extensions" / "pi-workflows" / "index.ts")
    assert ours["workflow"]["scope"] == "user"
