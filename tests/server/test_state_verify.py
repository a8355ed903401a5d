"""`pi-workflows state verify`: through a real server on the live database, and read-only
on an inactive backup that is never modified and never the live database by any path."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pi_workflows.cli._backup import LiveDatabaseError, refuse_live
from tests.conftest import Processes, write_workflow

pytestmark = pytest.mark.timeout(120)

CORRUPT = "UPDATE runs SET revision = revision + 1 WHERE run_id = (SELECT min(run_id) FROM runs)"


def _serve(processes: Processes, state_dir: Path) -> subprocess.Popen[str]:
    child = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0", "--no-execute")
    assert child.stdout is not None
    line = child.stdout.readline()
    assert "running" in line, f"server did not start: {line!r}"
    return child


def _stop(child: subprocess.Popen[str]) -> None:
    """A graceful stop (SIGTERM), waited for: the database is checkpointed and closed."""
    child.send_signal(signal.SIGTERM)
    assert child.wait(30) == 0


def _start_runs(processes: Processes, state_dir: Path, project: Path, count: int) -> None:
    for n in range(count):
        started = processes.cli(
            state_dir, "run", "start", "demo", "--project", str(project), "--input-json", str(n)
        )
        assert started.returncode == 0, started.stderr


def _verify(processes: Processes, state_dir: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = processes.cli(state_dir, "state", "verify", *args, "--json")
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _siblings(path: Path) -> set[str]:
    return {p.name for p in path.parent.iterdir()}


@pytest.fixture
def project(short_tmp: Path) -> Path:
    folder = short_tmp / "project"
    write_workflow(folder, "demo")
    return folder


@pytest.fixture
def stopped_state(processes: Processes, state_dir: Path, project: Path) -> Path:
    """A state folder whose server ran two runs (left queued) and stopped cleanly."""
    server = _serve(processes, state_dir)
    _start_runs(processes, state_dir, project, 2)
    _stop(server)
    return state_dir


def test_live_verify_through_a_real_server_is_clean(
    processes: Processes, state_dir: Path, project: Path
) -> None:
    _serve(processes, state_dir)
    _start_runs(processes, state_dir, project, 2)
    code, report = _verify(processes, state_dir)
    assert code == 0
    assert report == {
        "consistent": True,
        "findingCount": 0,
        "findings": [],
        "source": "server",
        "truncated": False,
    }
    text = processes.cli(state_dir, "state", "verify")
    assert text.returncode == 0, text.stderr
    assert "consistent" in text.stdout


def test_live_verify_reports_a_corrupted_row_with_exit_5(
    processes: Processes, stopped_state: Path
) -> None:
    live = stopped_state / "state.sqlite"
    with sqlite3.connect(live) as conn:  # the server is stopped: a test may edit the file
        conn.execute(CORRUPT)
    conn.close()
    _serve(processes, stopped_state)
    code, report = _verify(processes, stopped_state)
    assert code == 5
    assert report["consistent"] is False
    assert report["findingCount"] == len(report["findings"]) >= 1
    assert "run_revision_mismatch" in {f["code"] for f in report["findings"]}
    text = processes.cli(stopped_state, "state", "verify")
    assert text.returncode == 5
    assert "run_revision_mismatch" in text.stdout
    assert "inconsistent" in text.stdout


def test_backup_verify_finds_corruption_and_changes_nothing(
    processes: Processes, stopped_state: Path, short_tmp: Path
) -> None:
    backups = short_tmp / "backups"
    backups.mkdir()
    clean = backups / "clean.sqlite"
    shutil.copyfile(stopped_state / "state.sqlite", clean)
    broken = backups / "broken.sqlite"
    shutil.copyfile(clean, broken)
    with sqlite3.connect(broken) as conn:
        conn.execute(CORRUPT)
    conn.close()
    for leftover in backups.glob("*-*"):  # a clean close leaves no -wal or -shm
        leftover.unlink()
    before = {p.name: _digest(p) for p in backups.iterdir()}

    code, report = _verify(processes, stopped_state, "--backup", str(clean))
    assert (code, report["consistent"], report["source"]) == (0, True, "backup")
    code, report = _verify(processes, stopped_state, "--backup", str(broken))
    assert code == 5
    assert [f["code"] for f in report["findings"]] == ["run_revision_mismatch"]
    positional = processes.cli(stopped_state, "state", "verify", str(broken))
    assert positional.returncode == 5
    assert "run_revision_mismatch" in positional.stdout

    assert {p.name: _digest(p) for p in backups.iterdir()} == before, "no byte and no file"


WAL_WRITER = textwrap.dedent(
    """
    import shutil, sqlite3, sys
    source, target, sql = sys.argv[1], sys.argv[2], sys.argv[3]
    conn = sqlite3.connect(source, isolation_level=None)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute(sql)
    shutil.copyfile(source, target)                 # the main file, without the change
    shutil.copyfile(source + "-wal", target + "-wal")   # the change, only in the WAL
    """
)


def test_a_backup_with_its_wal_counts_the_wal_and_stays_unmodified(
    processes: Processes, stopped_state: Path, short_tmp: Path
) -> None:
    work = short_tmp / "work.sqlite"
    shutil.copyfile(stopped_state / "state.sqlite", work)
    backups = short_tmp / "backups"
    backups.mkdir()
    backup = backups / "with-wal.sqlite"
    subprocess.run(
        [sys.executable, "-c", WAL_WRITER, str(work), str(backup), CORRUPT],
        check=True,
        timeout=30,
    )
    assert (backups / "with-wal.sqlite-wal").stat().st_size > 0
    before = {p.name: _digest(p) for p in backups.iterdir()}

    code, report = _verify(processes, stopped_state, "--backup", str(backup))
    assert code == 5
    assert [f["code"] for f in report["findings"]] == ["run_revision_mismatch"]
    assert {p.name: _digest(p) for p in backups.iterdir()} == before


def test_backup_refuses_the_live_database_by_symlink_and_hardlink(
    processes: Processes, state_dir: Path, project: Path, short_tmp: Path
) -> None:
    server = _serve(processes, state_dir)
    _start_runs(processes, state_dir, project, 1)
    live = state_dir / "state.sqlite"
    elsewhere = short_tmp / "elsewhere"
    elsewhere.mkdir()
    symlink = elsewhere / "link.sqlite"
    symlink.symlink_to(live)
    hardlink = elsewhere / "hard.sqlite"
    os.link(live, hardlink)
    dotted = state_dir / ".." / "workflows" / "state.sqlite"

    for path in (live, symlink, hardlink, dotted):
        refused = processes.cli(state_dir, "state", "verify", "--backup", str(path))
        assert refused.returncode == 2, (path, refused.stdout, refused.stderr)
        assert "live database" in refused.stderr
        assert refused.stdout == ""
    # From another state folder the same file is still open by the live server.
    other = short_tmp / "other" / "workflows"
    for path in (symlink, hardlink):
        refused = processes.cli(other, "state", "verify", "--backup", str(path))
        assert refused.returncode == 2, refused.stderr
        assert "open as a database by a running process" in refused.stderr
    assert _siblings(symlink) == {"link.sqlite", "hard.sqlite"}, "nothing written beside them"

    _stop(server)
    # Stopped, it is still this folder's live database: the server owns it.
    for path in (symlink, hardlink):
        refused = processes.cli(state_dir, "state", "verify", "--backup", str(path))
        assert refused.returncode == 2
        assert "live database" in refused.stderr


HOLD_LOCK = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    sys.stdin.read()
    """
)


def test_the_state_file_of_a_folder_whose_server_lock_is_held_is_refused(
    stopped_state: Path, short_tmp: Path
) -> None:
    folder = short_tmp / "another" / "workflows"
    (folder / "host").mkdir(parents=True)
    shutil.copyfile(stopped_state / "state.sqlite", folder / "state.sqlite")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(folder / "host" / "server.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(LiveDatabaseError, match="running server"):
            refuse_live(folder / "state.sqlite", stopped_state)
    finally:
        holder.kill()
        holder.wait(10)
    assert (
        refuse_live(folder / "state.sqlite", stopped_state) == (folder / "state.sqlite").resolve()
    )


def test_a_missing_or_unusable_backup_is_a_usage_error(
    processes: Processes, state_dir: Path, short_tmp: Path
) -> None:
    missing = processes.cli(state_dir, "state", "verify", "--backup", str(short_tmp / "nope"))
    assert missing.returncode == 2
    assert "cannot read the backup" in missing.stderr
    garbage = short_tmp / "garbage.sqlite"
    garbage.write_bytes(b"not a database" * 100)
    code, report = _verify(processes, state_dir, "--backup", str(garbage))
    assert code == 5
    assert report["findings"][0]["code"] == "check_failed"
    both = processes.cli(
        state_dir, "state", "verify", str(garbage), "--backup", str(short_tmp / "x")
    )
    assert both.returncode == 2
    assert not state_dir.exists(), "a backup check starts no server"


def _verify_through_inherited_fd(state_dir: Path, target: Path) -> subprocess.CompletedProcess[str]:
    """`state verify /proc/self/fd/N`, where N is the CLI's inherited descriptor of `target`."""
    fd = os.open(target, os.O_RDONLY)
    try:
        env = dict(os.environ, PI_CODING_AGENT_DIR=str(state_dir.parent))
        argv = [sys.executable, "-m", "pi_workflows.cli", "--state-dir", str(state_dir)]
        return subprocess.run(
            [*argv, "state", "verify", f"/proc/self/fd/{fd}"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            pass_fds=(fd,),
            check=False,
        )
    finally:
        os.close(fd)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_backup_refuses_the_live_database_through_proc_self_fd(
    processes: Processes, state_dir: Path, project: Path, short_tmp: Path
) -> None:
    server = _serve(processes, state_dir)
    _start_runs(processes, state_dir, project, 1)
    live = state_dir / "state.sqlite"
    refused = _verify_through_inherited_fd(state_dir, live)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "live database" in refused.stderr and refused.stdout == ""
    other = short_tmp / "other" / "workflows"  # not its folder: still open by the server
    refused = _verify_through_inherited_fd(other, live)
    assert refused.returncode == 2, refused.stderr
    assert "open as a database by a running process" in refused.stderr
    _stop(server)
    refused = _verify_through_inherited_fd(state_dir, live)  # stopped, still this folder's
    assert refused.returncode == 2 and "live database" in refused.stderr
    copy = short_tmp / "copy.sqlite"
    shutil.copyfile(live, copy)  # a copy is another file: it verifies, by any name
    checked = _verify_through_inherited_fd(state_dir, copy)
    assert checked.returncode == 0, (checked.stdout, checked.stderr)
    assert "consistent" in checked.stdout
    assert _siblings(copy) >= {"copy.sqlite"} and not any(
        name.startswith("copy.sqlite-") for name in _siblings(copy)
    ), "nothing written beside it"
