"""A finished shell command's result always fits what can carry it (issue 11, items 2-3).

A result larger than one runner frame goes by reference; `fit_shell_output` is the last
rule, for what even a reference cannot hold: its stdout and stderr are cut, never the
result, so a finished command can always settle. Output within the caps is never cut
for its JSON escaping (NUL bytes are six characters each): it travels by reference.
"""

from __future__ import annotations

import pytest

from pi_workflows.engine import DEFAULT_SHELL_MAX_OUTPUT_BYTES
from pi_workflows.engine._shell import SHELL_OUTPUT_BUDGET, fit_shell_output
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.runner import DEFAULT_MAX_VALUE_BYTES, INLINE_VALUE_BYTES

pytestmark = pytest.mark.timeout(60)

BUDGET = 200_000
"""A small budget for the cutting rule; the real one is `SHELL_OUTPUT_BUDGET`."""


def _result(stdout: str, stderr: str = "") -> dict[str, object]:
    return {
        "exitCode": 0,
        "signal": None,
        "timedOut": False,
        "stdout": stdout,
        "stderr": stderr,
        "stdoutTruncatedBytes": 0,
        "stderrTruncatedBytes": 0,
        "truncated": False,
    }


@pytest.mark.parametrize(
    ("stdout", "stderr"),
    [
        ("x" * 400_000, ""),
        ("x" * 150_000, "y" * 150_000),  # both streams together
        ("\x00" * 50_000, ""),  # 50 KB of NUL bytes: 300 KB of JSON
        ("é\x01" * 30_000, "\x1f" * 10_000),
    ],
    ids=["one-stream", "both", "nul", "mixed"],
)
def test_a_result_over_the_budget_is_cut_to_fit_and_counts_what_was_cut(
    stdout: str, stderr: str
) -> None:
    fitted = fit_shell_output(_result(stdout, stderr), BUDGET)
    assert len(dumps(fitted)) <= BUDGET
    assert fitted["truncated"] is True
    assert fitted["exitCode"] == 0, "the command's result itself is never cut"
    assert stdout.startswith(str(fitted["stdout"])) and stderr.startswith(str(fitted["stderr"]))
    assert len(dumps(fitted)) > BUDGET - 64 * 1024, "it keeps what fits"
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        cut = len(text.encode()) - len(str(fitted[name]).encode())
        assert fitted[f"{name}TruncatedBytes"] == cut


def test_output_that_fits_is_left_as_it_is() -> None:
    small = _result("hello\n", "warning\n")
    assert fit_shell_output(small) == small


def test_the_default_caps_keep_two_full_streams_of_plain_text_inline() -> None:
    """The default comes from the frame budget: both streams at the cap, as text that
    needs no escape, fit one frame; the reference budget is far above the frame."""
    full = _result("x" * DEFAULT_SHELL_MAX_OUTPUT_BYTES, "y" * DEFAULT_SHELL_MAX_OUTPUT_BYTES)
    assert len(dumps(full)) <= INLINE_VALUE_BYTES
    assert fit_shell_output(full) == full
    nul = _result("\x00" * DEFAULT_SHELL_MAX_OUTPUT_BYTES)  # 6x in JSON: by reference
    assert INLINE_VALUE_BYTES < len(dumps(nul)) <= SHELL_OUTPUT_BUDGET
    assert fit_shell_output(nul) == nul, "never cut for its escaping"
    assert SHELL_OUTPUT_BUDGET < DEFAULT_MAX_VALUE_BYTES
