"""Which `pi` runs, with which argv and environment (no pi child is started here).

Issue 12 § Headless Pi children: `PI_WORKFLOWS_PI`, else `pi` on PATH, else a clear
`piUnavailable` naming both; the isolation flags of pi-rpc.md; an environment built from
scratch with no proxy variables.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from pi_workflows.engine._pi_child import (
    PI_BINARY_ENV,
    PiChild,
    PiLaunch,
    PiOptions,
    PiUnavailable,
    pi_argv,
    pi_environment,
    resolve_pi_binary,
)
from pi_workflows.pi import bridge_extension_path


def executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_pi_workflows_pi_names_the_binary(tmp_path: Path) -> None:
    binary = executable(tmp_path / "my-pi")
    assert resolve_pi_binary({PI_BINARY_ENV: str(binary), "PATH": ""}) == binary


def test_a_bare_name_in_pi_workflows_pi_is_looked_up_on_path(tmp_path: Path) -> None:
    binary = executable(tmp_path / "pi-nightly")
    found = resolve_pi_binary({PI_BINARY_ENV: "pi-nightly", "PATH": str(tmp_path)})
    assert found == binary


def test_without_the_variable_pi_on_path_is_used(tmp_path: Path) -> None:
    binary = executable(tmp_path / "pi")
    assert resolve_pi_binary({"PATH": f"/nonexistent:{tmp_path}"}) == binary


@pytest.mark.parametrize(
    "environ",
    [
        {PI_BINARY_ENV: "/nonexistent/pi", "PATH": ""},
        {PI_BINARY_ENV: "no-such-pi-binary", "PATH": "/nonexistent"},
        {"PATH": "/nonexistent"},
        {PI_BINARY_ENV: "  ", "PATH": "/nonexistent"},
    ],
    ids=["missing-path", "missing-name", "not-on-path", "blank-variable"],
)
def test_a_missing_binary_gives_pi_unavailable_naming_both_ways(environ: dict[str, str]) -> None:
    with pytest.raises(PiUnavailable) as caught:
        resolve_pi_binary(environ)
    message = str(caught.value)
    assert PI_BINARY_ENV in message and "PATH" in message
    assert "/nonexistent" not in message, "errors name no user path"
    assert caught.value.code == "piUnavailable"


def test_a_file_that_is_not_executable_is_unavailable(tmp_path: Path) -> None:
    plain = tmp_path / "pi"
    plain.write_text("not a program")
    with pytest.raises(PiUnavailable):
        resolve_pi_binary({PI_BINARY_ENV: str(plain), "PATH": ""})


def test_a_node_script_without_node_on_path_is_unavailable(tmp_path: Path) -> None:
    script = executable(tmp_path / "pi", "#!/usr/bin/env node\n")
    with pytest.raises(PiUnavailable, match=r"Node\.js"):
        PiLaunch.build(
            environ={PI_BINARY_ENV: str(script), "PATH": str(tmp_path), "HOME": str(tmp_path)},
            bridge=bridge_extension_path(),
            cwd=tmp_path,
        )


def test_spawning_a_binary_that_vanished_gives_pi_unavailable(tmp_path: Path) -> None:
    binary = executable(tmp_path / "pi")
    launch = PiLaunch.build(
        environ={PI_BINARY_ENV: str(binary), "PATH": os.defpath, "HOME": str(tmp_path)},
        bridge=bridge_extension_path(),
        cwd=tmp_path,
    )
    binary.unlink()
    with pytest.raises(PiUnavailable):
        PiChild.spawn(launch)


def test_the_argv_isolates_pi_and_loads_only_the_bridge() -> None:
    bridge = bridge_extension_path()
    argv = pi_argv(Path("/opt/pi"), bridge, PiOptions(provider="fake", model="m", thinking="low"))
    assert argv == [
        "/opt/pi",
        "--mode",
        "rpc",
        "--no-session",
        "--offline",
        "--no-extensions",
        "--no-skills",
        "--no-prompt-templates",
        "--no-themes",
        "--no-context-files",
        "-e",
        str(bridge),
        "--provider",
        "fake",
        "--model",
        "m",
        "--thinking",
        "low",
    ]
    assert bridge.is_absolute() and bridge.is_file() and bridge.suffix == ".ts"


def test_without_model_options_pi_uses_its_settings() -> None:
    argv = pi_argv(Path("/opt/pi"), Path("/b.ts"))
    assert not {"--provider", "--model", "--thinking", "--tools"} & set(argv)


def test_a_tool_allow_list_always_keeps_the_workflow_tool() -> None:
    argv = pi_argv(Path("/opt/pi"), Path("/b.ts"), PiOptions(tools=("read", "bash", "read")))
    assert argv[argv.index("--tools") + 1] == "read,bash,workflow"
    only = pi_argv(Path("/opt/pi"), Path("/b.ts"), PiOptions(tools=()))
    assert "--no-builtin-tools" in only and "--tools" not in only


def test_the_environment_is_built_from_scratch(tmp_path: Path) -> None:
    environ = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/someone",
        "HTTPS_PROXY": "http://proxy:3128",
        "http_proxy": "http://proxy:3128",
        "OPENAI_API_KEY": "sk-secret",
        "PI_CODING_AGENT_DIR": "/home/someone/.pi/agent",
        "PYTHONPATH": "/x",
    }
    env = pi_environment(environ, tmpdir=tmp_path, extra={"PI_WORKFLOWS_BRIDGE_CONFIG": "/c"})
    assert env == {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/someone",
        "PI_CODING_AGENT_DIR": "/home/someone/.pi/agent",
        "PI_OFFLINE": "1",
        "PI_SKIP_VERSION_CHECK": "1",
        "PI_TELEMETRY": "0",
        "NO_COLOR": "1",
        "TMPDIR": str(tmp_path),
        "PI_WORKFLOWS_BRIDGE_CONFIG": "/c",
    }


def test_the_agent_dir_defaults_to_the_users_pi_agent_dir() -> None:
    env = pi_environment({"PATH": "/bin", "HOME": "/home/someone"})
    assert env["PI_CODING_AGENT_DIR"] == str(Path.home() / ".pi" / "agent")
    chosen = pi_environment({"PATH": "/bin"}, agent_dir=Path("/srv/agent"))
    assert chosen["PI_CODING_AGENT_DIR"] == "/srv/agent"


def test_extra_variables_cannot_override_the_fixed_ones() -> None:
    with pytest.raises(ValueError, match="PI_OFFLINE"):
        pi_environment({"PATH": "/bin"}, extra={"PI_OFFLINE": "0"})


def test_a_launch_repr_shows_no_environment(tmp_path: Path) -> None:
    launch = PiLaunch.build(
        environ={PI_BINARY_ENV: sys.executable, "PATH": os.defpath, "HOME": str(tmp_path)},
        bridge=bridge_extension_path(),
        cwd=tmp_path,
        extra_env={"PI_WORKFLOWS_BRIDGE_CONFIG": "/private/config.json"},
        stderr_path=tmp_path / "err.log",
    )
    assert "PI_WORKFLOWS_BRIDGE_CONFIG" not in repr(launch) and "err.log" not in repr(launch)
