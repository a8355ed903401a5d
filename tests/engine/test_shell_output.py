"""A finished shell command's result always fits one runner frame (issue 11, item 3).

Its stdout and stderr are cut, never the result: output that escapes to more JSON than a
frame holds (NUL bytes are six characters each) must not fail the node or leave its
effect ambiguous.
"""

from __future__ import annotations

import pytest

from pi_workflows.engine.runner import MAX_OUTPUT_BYTES, SHELL_OUTPUT_BUDGET, fit_shell_output
from pi_workflows.wire.canonical import dumps

pytestmark = pytest.mark.timeout(60)


def _result(stdout: str, stderr: str = "") -> dict[str, object]:
    return {
        "exitCode": 0,
        "signal": None,
        "timedOut": False,
        "stdout": stdout,
        "stderr": stderr,
        "truncated": False,
    }


@pytest.mark.parametrize(
    ("stdout", "stderr"),
    [
        ("x" * 990_000, ""),  # the default cap, over what a node output may hold
        ("x" * 600_000, "y" * 600_000),  # both streams together
        ("\x00" * 200_000, ""),  # 200 KB of NUL bytes: 1.2 MB of JSON
        ("é\x01" * 300_000, "\x1f" * 100_000),
    ],
    ids=["990k", "600k-each", "nul", "mixed"],
)
def test_oversized_output_is_cut_to_fit_and_marked_truncated(stdout: str, stderr: str) -> None:
    fitted = fit_shell_output(_result(stdout, stderr))
    assert len(dumps(fitted)) <= SHELL_OUTPUT_BUDGET < MAX_OUTPUT_BYTES
    assert fitted["truncated"] is True
    assert fitted["exitCode"] == 0, "the command's result itself is never cut"
    assert stdout.startswith(str(fitted["stdout"])) and stderr.startswith(str(fitted["stderr"]))
    assert len(dumps(fitted)) > SHELL_OUTPUT_BUDGET - 64 * 1024, "it keeps what fits"


def test_output_that_fits_is_left_as_it_is() -> None:
    small = _result("hello\n", "warning\n")
    assert fit_shell_output(small) == small
