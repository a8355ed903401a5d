"""`pi-workflows state backup DEST` (`state.backup`) against real server processes.

A backup taken while the server keeps committing verifies and a server starts on it; a
CLI killed mid-backup and retried with its key adopts the one result (one file, one
receipt); every bad destination gets one clear refusal; progress comes as stage lines
or JSON lines; a stored refusal is the answer of a retry.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient
from pi_workflows.cli._backup import verify_inactive_backup
from tests.conftest import Processes, write_workflow

pytestmark = pytest.mark.timeout(60)

BLOB_BYTES = 32 * 1024 * 1024
"""A blob that makes the database several copy steps long and its check take a while."""


def _serve(processes: Processes, state_dir: Path) -> subprocess.Popen[str]:
    child = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0", "--no-execute")
    assert child.stdout is not None
    line = child.stdout.readline()
    assert "running" in line, f"server did not start: {line!r}"
    return child


def _stop(child: subprocess.Popen[str]) -> None:
    child.send_signal(signal.SIGTERM)
    assert child.wait(30) == 0


def _rows(db: Path, sql: str, *params: object) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db.as_uri() + "?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _seed_large(processes: Processes, state_dir: Path) -> None:
    """A stopped state folder holding one large blob (a test may edit a stopped database)."""
    _stop(_serve(processes, state_dir))
    content = os.urandom(BLOB_BYTES)
    digest = "sha256:" + hashlib.sha256(content).hexdigest()
    with sqlite3.connect(state_dir / "state.sqlite") as conn:
        conn.execute(
            "INSERT INTO blobs (digest, byte_length, content, created_at) VALUES (?, ?, ?, ?)",
            (digest, len(content), content, int(time.time() * 1000)),
        )
    conn.close()


def _backup_receipts(state_dir: Path) -> list[tuple[Any, ...]]:
    return _rows(
        state_dir / "state.sqlite",
        "SELECT idempotency_key, outcome FROM host_commands WHERE operation = 'state.backup'",
    )


@pytest.fixture
def project(short_tmp: Path) -> Path:
    folder = short_tmp / "project"
    write_workflow(folder, "demo")
    return folder


def test_a_backup_while_the_server_writes_verifies_and_a_server_starts_on_it(
    processes: Processes, state_dir: Path, project: Path, short_tmp: Path
) -> None:
    _seed_large(processes, state_dir)
    server = _serve(processes, state_dir)
    stop, writing = threading.Event(), threading.Event()
    started: list[str] = []

    def keep_writing() -> None:  # commits through the server for the whole backup
        with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
            while not stop.is_set():
                payload = {"workflow": "demo", "input": len(started), "projectPath": str(project)}
                started.append(client.call("run.start", payload)["receipt"]["runId"])
                if len(started) >= 3:
                    writing.set()

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        assert writing.wait(30), "the writes are under way before the copy starts"
        before = len(started)
        dest = short_tmp / "backups" / "state.sqlite"
        dest.parent.mkdir()
        done = processes.cli(state_dir, "state", "backup", str(dest), "--json")
    finally:
        stop.set()
        writer.join(30)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines[0]["stage"] == "start" and lines[0]["idempotencyKey"].startswith("cli-backup-")
    copies = [line for line in lines if line["stage"] == "copy"]
    assert copies and copies[-1]["done"] == copies[-1]["total"] > BLOB_BYTES // 4096
    assert [line["stage"] for line in lines[-3:]] == ["verify", "verify", "done"]
    receipt = lines[-1]
    assert receipt["verified"] is True and receipt["outcome"] == "accepted"
    assert receipt["byteCount"] == dest.stat().st_size
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
    assert sorted(p.name for p in dest.parent.iterdir()) == ["state.sqlite"], "no partial file"
    assert verify_inactive_backup(dest, state_dir) == []
    copied = len(_rows(dest, "SELECT run_id FROM runs"))
    assert before <= copied <= len(started), "one snapshot, taken during the writes"
    _stop(server)
    # Restore: a server starts on the backup and serves what it holds.
    restored = short_tmp / "restored" / "workflows"
    restored.mkdir(parents=True)
    os.link(dest, restored / "state.sqlite")
    again = _serve(processes, restored)
    with WorkflowClient(restored, autostart=False, timeout=30) as client:
        assert len(client.list_runs().items) == copied
        assert client.call("state.verify")["receipt"]["consistent"] is True
    _stop(again)


def test_a_cli_killed_mid_backup_and_retried_with_its_key_adopts_the_one_result(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    _seed_large(processes, state_dir)
    server = _serve(processes, state_dir)
    dest = short_tmp / "backups" / "state.sqlite"
    dest.parent.mkdir()
    cli = processes.spawn_cli(state_dir, "state", "backup", str(dest), "--json")
    assert cli.stdout is not None
    key = json.loads(cli.stdout.readline())["idempotencyKey"]
    first = json.loads(cli.stdout.readline())  # the copy is under way
    assert first["stage"] in ("copy", "verify"), first
    os.kill(server.pid, signal.SIGSTOP)  # nothing more is answered until the CLI is gone
    try:
        cli.kill()
        cli.wait(10)
        rest = cli.stdout.read()
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert '"done"' not in rest, "the CLI was killed before its answer"
    retried = processes.cli(
        state_dir, "state", "backup", str(dest), "--json", "--idempotency-key", key
    )
    assert retried.returncode == 0, retried.stderr
    receipt = json.loads(retried.stdout.splitlines()[-1])
    assert receipt["stage"] == "done" and receipt["outcome"] == "adopted", receipt
    assert sorted(p.name for p in dest.parent.iterdir()) == ["state.sqlite"], "one file"
    assert _backup_receipts(state_dir) == [(key, "accepted")], "one receipt"
    assert receipt["byteCount"] == dest.stat().st_size
    assert verify_inactive_backup(dest, state_dir) == []
    again = processes.cli(state_dir, "state", "backup", str(dest), "--idempotency-key", key)
    assert again.returncode == 0 and "earlier attempt" in again.stdout, again.stderr
    fresh = processes.cli(state_dir, "state", "backup", str(dest))  # a new invocation
    assert fresh.returncode == 2 and "DEST exists" in fresh.stderr
    assert _backup_receipts(state_dir) == [(key, "accepted")]
    _stop(server)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("relative.sqlite", "DEST must be an absolute path"),
        ("exists", "DEST exists; name a new file"),
        ("missing/b.sqlite", "the folder of DEST does not exist"),
        ("folder", "DEST exists; name a new file"),
    ],
)
def test_a_bad_destination_gets_one_clear_refusal_and_starts_no_server(
    processes: Processes, state_dir: Path, short_tmp: Path, name: str, words: str
) -> None:
    (short_tmp / "exists").write_bytes(b"keep me")
    (short_tmp / "folder").mkdir()
    dest = name if name == "relative.sqlite" else str(short_tmp / name)
    refused = processes.cli(state_dir, "state", "backup", dest)
    assert refused.returncode == 2, refused.stderr
    assert words in refused.stderr and refused.stdout == ""
    assert not (state_dir / "state.sqlite").exists(), "refused before a server was started"
    assert (short_tmp / "exists").read_bytes() == b"keep me"


def test_a_stop_during_a_backup_waits_for_its_receipt_and_answer(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    _seed_large(processes, state_dir)
    server = _serve(processes, state_dir)
    dest = short_tmp / "stopped-during.sqlite"
    cli = processes.spawn_cli(state_dir, "state", "backup", str(dest), "--json")
    assert cli.stdout is not None
    key = json.loads(cli.stdout.readline())["idempotencyKey"]
    assert json.loads(cli.stdout.readline())["stage"] in ("copy", "verify")
    os.kill(server.pid, signal.SIGSTOP)  # the stop is asked while the backup is in flight
    server.send_signal(signal.SIGTERM)
    os.kill(server.pid, signal.SIGCONT)
    out, err = cli.communicate(timeout=30)
    assert cli.returncode == 0, err
    receipt = json.loads(out.splitlines()[-1])
    assert receipt["stage"] == "done" and receipt["outcome"] == "accepted"
    assert server.wait(30) == 0
    assert _backup_receipts(state_dir) == [(key, "accepted")]
    assert verify_inactive_backup(dest, state_dir) == []


def test_the_server_refuses_bad_payloads_and_stores_a_refused_backup(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    server = _serve(processes, state_dir)
    taken = short_tmp / "taken.sqlite"
    taken.write_bytes(b"keep me")
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        bad: list[tuple[dict[str, Any], str]] = [
            ({"path": "relative.sqlite"}, "backupPathInvalid"),
            ({}, "backupPathInvalid"),
            ({"path": str(taken), "extra": 1}, "payloadInvalid"),
            ({"path": str(short_tmp / "missing" / "b.sqlite")}, "backupPathInvalid"),
        ]
        for payload, code in bad:
            answer = client.request("state.backup", payload)
            assert answer["outcome"] == "rejected", answer
            assert answer["error"]["code"] == code, answer
            assert str(short_tmp) not in answer["error"]["message"], "no path in an error"
        key = "backup-refused-once"
        refused = client.request("state.backup", {"path": str(taken)}, idempotency_key=key)
        assert refused["error"]["code"] == "backupExists"
        taken.unlink()  # the stored refusal is the answer of this invocation's retry
        retried = client.request("state.backup", {"path": str(taken)}, idempotency_key=key)
        assert retried["outcome"] == "rejected" and retried["error"] == refused["error"]
        elsewhere = {"path": str(short_tmp / "elsewhere.sqlite")}  # the key, another payload
        conflict = client.request("state.backup", elsewhere, idempotency_key=key)
        assert conflict["outcome"] == "conflict", conflict
        assert not (short_tmp / "elsewhere.sqlite").exists()
        assert not taken.exists()
        fresh = client.call("state.backup", {"path": str(taken)})  # a new invocation copies
        assert fresh["receipt"]["verified"] is True
    assert verify_inactive_backup(taken, state_dir) == []
    _stop(server)


def test_without_a_terminal_the_cli_prints_one_line_a_stage(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    server = _serve(processes, state_dir)
    dest = short_tmp / "plain.sqlite"
    done = processes.cli(state_dir, "state", "backup", str(dest))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        line for line in done.stderr.splitlines() if line.startswith(("copying", "verifying"))
    ]
    assert [line.split()[0] for line in done.stderr.splitlines()] == ["copying", "verifying"]
    assert done.stdout.startswith("backup verified: ") and "mode 0600" in done.stdout
    _stop(server)
