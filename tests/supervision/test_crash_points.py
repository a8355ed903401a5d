"""Named crash points: parsing `PI_WORKFLOWS_CRASH`, the declarations, a real child
process that SIGKILLs itself at exactly the n-th hit, and `debug crash-points`."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import timeit
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows.supervision import (
    CRASH_ENV,
    CRASH_POINTS,
    CrashSpec,
    InvalidCrashSpecError,
    UnknownCrashPointError,
    armed_crash,
    configure_crash,
    crash_point,
    parse_crash_spec,
)
from pi_workflows.supervision._crash import PROCESS_KINDS
from tests.conftest import Processes

pytestmark = pytest.mark.timeout(60)

POINT = "runner.effect.after_apply"
OTHER = "server.receipt.after_commit"

# What issues 6 and 10 require a point for, by name: each lifecycle transition, each
# runner message kind and each effect step has its own.
REQUIRED = {
    *(
        f"server.lifecycle.{t}.{w}"
        for t in (
            "enqueue",
            "launch",
            "ready",
            "node_start",
            "node_finish",
            "node_fail",
            "park",
            "wait",
            "pause",
            "resume",
            "requeue",
            "complete",
            "fail",
            "time_out",
            "cancel",
            "recover",
        )
        for w in ("before_commit", "after_commit")
    ),
    *(
        f"server.runner_message.{k}.after_commit"
        for k in (
            "runner_ready",
            "runner_progress",
            "node_started",
            "node_finished",
            "node_failed",
            "effect_reserve",
            "effect_settle",
            "notification_requested",
            "run_parked",
            "run_finished",
        )
    ),
    "server.group_commit.before_commit",
    "server.group_commit.after_commit",
    "server.drain.started",
    "server.drain.after_hand_back",
    "runner.effect.after_settle",
    "runner.effect.after_read_back",
    "server.receipt.after_commit",
    "server.launch.after_commit",
    "server.launch.after_spawn",
    "server.ready.before_command",
    "server.lifecycle.cancel.before_fence",
    "server.recovery.after_epoch",
    "server.recovery.after_first_run",
    "runner.ready.before_send",
    "runner.effect.after_reserve",
    "runner.effect.after_apply",
    "runner.message.after_send",
}


@pytest.fixture(autouse=True)
def disarmed() -> Iterator[None]:
    """Every test starts and ends with this (pytest) process disarmed."""
    configure_crash("")
    try:
        yield
    finally:
        configure_crash("")


# --- parsing -------------------------------------------------------------------------


def test_a_point_alone_crashes_on_the_first_hit() -> None:
    assert parse_crash_spec(POINT) == CrashSpec(POINT, 1)
    assert parse_crash_spec(f"  {POINT}\n") == CrashSpec(POINT, 1)


@pytest.mark.parametrize(("suffix", "hit"), [("@1", 1), ("@2", 2), ("@17", 17), ("@007", 7)])
def test_at_n_names_the_hit(suffix: str, hit: int) -> None:
    assert parse_crash_spec(POINT + suffix) == CrashSpec(POINT, hit)


@pytest.mark.parametrize(
    "value",
    [
        "server.no_such_point",
        "server",
        "SERVER.RECEIPT.AFTER_COMMIT",
        f"{POINT}@0",
        f"{POINT}@-1",
        f"{POINT}@",
        f"{POINT}@x",
        f"{POINT}@1.5",
        f"{POINT}@ 2",
        f"{POINT}@2@3",
        f"{POINT}@\u0663",  # ARABIC-INDIC DIGIT THREE: decimal, but not ASCII
        f"@{POINT}",
    ],
)
def test_invalid_values_are_refused(value: str) -> None:
    with pytest.raises(InvalidCrashSpecError) as caught:
        parse_crash_spec(value)
    assert CRASH_ENV in str(caught.value)


def test_configure_arms_disarms_and_reports_an_invalid_value_once() -> None:
    assert configure_crash(f"{OTHER}@3") == CrashSpec(OTHER, 3)
    assert armed_crash() == CrashSpec(OTHER, 3)
    assert configure_crash("") is None
    assert armed_crash() is None

    report = io.StringIO()
    assert configure_crash(f"{OTHER}@zero", report=report) is None
    assert armed_crash() is None
    lines = report.getvalue().splitlines()
    assert len(lines) == 1
    assert "ignoring" in lines[0] and f"{OTHER}@zero" in lines[0]
    crash_point(OTHER)  # disarmed: returns


def test_configure_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CRASH_ENV, f"{OTHER}@4")
    assert configure_crash() == CrashSpec(OTHER, 4)
    monkeypatch.delenv(CRASH_ENV)
    assert configure_crash() is None


def test_an_undeclared_name_is_a_programming_error_armed_or_not() -> None:
    with pytest.raises(UnknownCrashPointError):
        crash_point("server.not.declared")
    configure_crash(f"{OTHER}@1000")
    with pytest.raises(UnknownCrashPointError):
        crash_point("server.not.declared")
    crash_point(POINT)  # declared, but not the armed one: nothing happens


# --- declarations --------------------------------------------------------------------


def test_every_point_issue_6_needs_is_declared_once_with_process_and_sentence() -> None:
    assert set(CRASH_POINTS) >= REQUIRED
    assert len(CRASH_POINTS) >= 40
    for name, point in CRASH_POINTS.items():
        assert point.name == name
        assert point.process in PROCESS_KINDS
        assert name.split(".")[0] == point.process
        assert len(name.split(".")) >= 3
        sentence = point.interrupts
        assert sentence.endswith(".") and sentence.count(". ") == 0 and "\n" not in sentence
        assert 20 < len(sentence) < 200


def test_the_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        CRASH_POINTS["server.extra"] = CRASH_POINTS[POINT]  # type: ignore[index]


# --- a real process kills itself -------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    from pi_workflows.supervision import crash_point

    name, times = sys.argv[1], int(sys.argv[2])
    for hit in range(1, times + 1):
        crash_point(name)
        print(f"passed {hit}", flush=True)
    print("done", flush=True)
    """
)


def _run_child(spec: str | None, name: str, times: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if spec is not None:
        env[CRASH_ENV] = spec
    return subprocess.run(
        [sys.executable, "-c", CHILD, name, str(times)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize("hit", [1, 2, 5])
def test_a_child_dies_by_sigkill_exactly_at_the_nth_hit(hit: int) -> None:
    child = _run_child(f"{POINT}@{hit}", POINT, 8)
    assert child.returncode == -signal.SIGKILL
    assert child.stdout.splitlines() == [f"passed {n}" for n in range(1, hit)]
    assert f"crash point {POINT} hit {hit}: SIGKILL" in child.stderr


def test_without_at_n_the_first_hit_kills() -> None:
    child = _run_child(POINT, POINT, 3)
    assert child.returncode == -signal.SIGKILL
    assert child.stdout == ""


def test_a_child_that_never_reaches_the_hit_or_the_point_lives() -> None:
    fewer = _run_child(f"{POINT}@4", POINT, 3)
    assert fewer.returncode == 0, fewer.stderr
    assert fewer.stdout.splitlines()[-1] == "done"
    elsewhere = _run_child(OTHER, POINT, 3)
    assert elsewhere.returncode == 0, elsewhere.stderr
    unset = _run_child(None, POINT, 3)
    assert unset.returncode == 0 and unset.stderr == ""


@pytest.mark.parametrize("value", ["server.no_such_point", f"{POINT}@0", f"{POINT}@two"])
def test_an_invalid_value_is_reported_once_and_the_child_carries_on(value: str) -> None:
    child = _run_child(value, POINT, 3)
    assert child.returncode == 0
    assert child.stdout.splitlines()[-1] == "done"
    errors = [line for line in child.stderr.splitlines() if line]
    assert len(errors) == 1
    assert errors[0].startswith("pi-workflows: ignoring") and CRASH_ENV in errors[0]


FORKING_CHILD = textwrap.dedent(
    """
    import os, sys
    from pi_workflows.supervision import CRASH_ENV, crash_point

    point, other = sys.argv[1], sys.argv[2]

    def fork(body):
        pid = os.fork()
        if pid == 0:
            body()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        print(f"child signal {signum}", flush=True)

    def counts_its_own_hits():
        crash_point(point)                  # hit 1 of @2 in this child
        print("child passed its first hit", flush=True)

    def reads_its_own_environment():        # as a zygote's child does before it runs
        os.environ[CRASH_ENV] = other
        crash_point(point)
        crash_point(point)
        print("child passed the parent's point twice", flush=True)
        crash_point(other)

    crash_point(point)                      # hit 1 of @2 in the parent
    fork(counts_its_own_hits)
    fork(reads_its_own_environment)
    crash_point(point)                      # hit 2 in the parent
    print("parent survived", flush=True)
    """
)


def test_hits_are_counted_per_process_and_a_forked_child_rereads_the_variable() -> None:
    env = dict(os.environ, **{CRASH_ENV: f"{POINT}@2"})
    child = subprocess.run(
        [sys.executable, "-c", FORKING_CHILD, POINT, OTHER],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert child.stdout.splitlines() == [
        "child passed its first hit",
        "child signal 0",
        "child passed the parent's point twice",
        f"child signal {int(signal.SIGKILL)}",
    ]
    assert child.returncode == -signal.SIGKILL


def test_disarmed_cost_is_a_lookup() -> None:
    # Not a benchmark: a generous bound that only an accidental slow path would break.
    # CPU time, not wall time: a loaded machine that keeps this process waiting for a
    # core does not make the lookup slower.
    seconds = timeit.timeit(lambda: crash_point(POINT), number=100_000, timer=time.process_time)
    assert seconds < 0.5


# --- the CLI -------------------------------------------------------------------------


def test_debug_crash_points_lists_every_point_offline(
    processes: Processes, state_dir: Path
) -> None:
    listed = processes.cli(state_dir, "debug", "crash-points", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert rows == [
        {"name": p.name, "process": p.process, "interrupts": p.interrupts}
        for p in CRASH_POINTS.values()
    ]
    text = processes.cli(state_dir, "debug", "crash-points")
    assert text.returncode == 0, text.stderr
    for name in CRASH_POINTS:
        assert name in text.stdout
    assert not state_dir.exists(), "listing needs no server and no state"


def test_the_user_guide_lists_every_point_as_declared() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "crash-points.md").read_text()
    rows = {line for line in guide.splitlines() if line.startswith("| `")}
    for point in CRASH_POINTS.values():
        assert f"| `{point.name}` | {point.process} | {point.interrupts} |" in rows, point.name
    assert len([r for r in rows if r.split("`")[1] in CRASH_POINTS]) == len(CRASH_POINTS)
