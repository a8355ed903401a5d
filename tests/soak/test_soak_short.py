"""The short random-kill soak, part of the regular suite (the long one is documented in
docs/crash-points.md § Random-kill soak).

Seeded from `PI_WORKFLOWS_SOAK_SEED`, or at random; the seed is printed first, so a
failure can be replayed with `python -m tests.soak.soak --seed N --kills 20`.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.soak import soak

KILLS = 20
MIN_KILLS = 15
"""A loaded machine may run out of the time bound first; fewer kills than this fail."""
MAX_SECONDS = 75


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_short_random_kill_soak(capsys: pytest.CaptureFixture[str]) -> None:
    seed = int(os.environ.get("PI_WORKFLOWS_SOAK_SEED") or random.SystemRandom().randrange(2**32))
    print(f"soak seed {seed}")
    code = soak.main(
        ["--seed", str(seed), "--kills", str(KILLS), "--max-seconds", str(MAX_SECONDS), "--quiet"]
    )
    output = capsys.readouterr().out
    print(output)
    assert code == 0, f"the soak found violations (seed {seed}):\n{output}"
    done = int(output.split("\nkills: ", 1)[1].split(" ", 1)[0])
    assert done >= MIN_KILLS, f"only {done} kills in the time bound (seed {seed}):\n{output}"
