"""Channel profiles: `<agent dir>/workflows/channels.json`, private or refused, never echoed.

Issue 15 item 2: the server refuses the file when others may read it; `channel status`
and `channel reload` show the profiles and never a token or a chat. These use the real
CLI against a real server; the profile points at an address nothing serves, so no
Telegram traffic happens here (the adapter child's own tests are elsewhere).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows import WorkflowServer
from tests.conftest import Processes
from tests.server.channel_rig import CHAT_ID, TOKEN, write_profiles

pytestmark = pytest.mark.timeout(120)

NOWHERE = "http://127.0.0.1:9"


@pytest.fixture
def started(state_dir: Path) -> Iterator[WorkflowServer]:
    instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=False)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown")


def _no_secret(*texts: str) -> None:
    for text in texts:
        assert TOKEN not in text
        assert TOKEN.split(":")[1] not in text
        assert str(CHAT_ID) not in text


def test_a_profiles_file_readable_by_others_is_refused_with_the_fix_and_no_contents(
    state_dir: Path, processes: Processes
) -> None:
    write_profiles(state_dir, NOWHERE, mode=0o644)
    server = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=False)
    server.start()
    try:
        shown = processes.cli(state_dir, "channel", "status")
        assert shown.returncode == 0, shown.stderr
        assert "refused" in shown.stdout
        assert "mode 0644" in shown.stdout and "chmod 600" in shown.stdout
        as_json = processes.cli(state_dir, "channel", "status", "--json")
        receipt = json.loads(as_json.stdout)
        assert receipt["config"] == "refused" and receipt["profiles"] == []
        _no_secret(shown.stdout, shown.stderr, as_json.stdout)
        assert str(state_dir) not in shown.stdout, "no user path in the error"

        # Fixed and reloaded: the profile is served (its child starts).
        os.chmod(state_dir / "channels.json", 0o600)
        reloaded = processes.cli(state_dir, "channel", "reload", "--json")
        assert reloaded.returncode == 0, reloaded.stderr
        receipt = json.loads(reloaded.stdout)
        assert receipt["config"] == "loaded"
        assert [item["profile"] for item in receipt["profiles"]] == ["ops"]
        assert receipt["profiles"][0]["workflows"] == ["deploy"]
        _no_secret(reloaded.stdout, reloaded.stderr)
    finally:
        server.stop("test teardown")


def test_no_profiles_file_means_no_channels(started: WorkflowServer, processes: Processes) -> None:
    shown = processes.cli(started.state_dir, "channel", "status")
    assert shown.returncode == 0, shown.stderr
    assert "no channel profiles" in shown.stdout


def test_a_malformed_profile_is_refused_by_place_and_rule_never_by_value(
    state_dir: Path, processes: Processes
) -> None:
    path = write_profiles(state_dir, NOWHERE)
    document = json.loads(path.read_text())
    document["profiles"]["ops"]["chatId"] = TOKEN  # a secret where a number belongs
    path.write_text(json.dumps(document))
    server = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=False)
    server.start()
    try:
        shown = processes.cli(state_dir, "channel", "status", "--json")
        receipt = json.loads(shown.stdout)
        assert receipt["config"] == "refused"
        assert "/profiles/*/chatId" in receipt["error"]
        assert "must be integer" in receipt["error"]
        _no_secret(shown.stdout, shown.stderr)
    finally:
        server.stop("test teardown")


def test_a_refused_reload_exits_1_with_the_refusal_on_stderr(
    state_dir: Path, processes: Processes
) -> None:
    """A reload the server refuses (a file readable by others, a file that is not JSON)
    is a failure a script can see: exit 1, the refusal on stderr, nothing else printed
    (`--json` still prints the receipt); the fixed file reloads with exit 0."""
    path = write_profiles(state_dir, NOWHERE)
    server = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=False)
    server.start()
    try:
        os.chmod(path, 0o644)
        readable = processes.cli(state_dir, "channel", "reload")
        assert readable.returncode == 1, (readable.stdout, readable.stderr)
        assert readable.stdout == ""
        assert "channel profiles refused" in readable.stderr
        assert "mode 0644" in readable.stderr and "chmod 600" in readable.stderr
        as_json = processes.cli(state_dir, "channel", "reload", "--json")
        assert as_json.returncode == 1, as_json.stderr
        receipt = json.loads(as_json.stdout)
        assert receipt["config"] == "refused" and receipt["profiles"] == []
        assert "chmod 600" in as_json.stderr

        os.chmod(path, 0o600)
        path.write_text("{not json")
        broken = processes.cli(state_dir, "channel", "reload")
        assert broken.returncode == 1, (broken.stdout, broken.stderr)
        assert "not valid JSON" in broken.stderr
        _no_secret(readable.stderr, as_json.stdout, as_json.stderr, broken.stderr)
        assert str(state_dir) not in readable.stderr + broken.stderr, "no user path"

        write_profiles(state_dir, NOWHERE)
        fixed = processes.cli(state_dir, "channel", "reload")
        assert fixed.returncode == 0, fixed.stderr
        assert fixed.stdout.startswith("ops") and fixed.stderr == ""
    finally:
        server.stop("test teardown")
