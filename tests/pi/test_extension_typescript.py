"""The Pi extension's `runPatch` application against Python's `diff_views`: every patch
the server can send turns the held view into exactly the new one in TypeScript too.

(The extension's other TypeScript tests, tests/node/extension.test.ts, run with the
rest of tests/node from tests/pi/test_bridge_typescript.py.)
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pi_workflows.wire.view_patch import diff_views
from tests.pi.conftest import REPO, require_node_tools

pytestmark = pytest.mark.timeout(120)

KEYS = ["status", "display", "a/b", "~x", "__proto__", "trace", "é", ""]


def _value(rng: random.Random, depth: int) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.35:
        return rng.choice([None, True, False, 0, -1.5, 2**53 - 1, "", "running", "x/y~z"])
    if roll < 0.65:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {rng.choice(KEYS): _value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _mutate(rng: random.Random, value: Any) -> Any:
    if isinstance(value, list):
        items = [_mutate(rng, item) if rng.random() < 0.3 else item for item in value]
        if items and rng.random() < 0.4:
            items = items[rng.randint(1, len(items)) :]  # a window that slid on
        return items + [_value(rng, 2) for _ in range(rng.randint(0, 2))]
    if isinstance(value, dict):
        out = {k: (_mutate(rng, v) if rng.random() < 0.5 else v) for k, v in value.items()}
        for key in list(out):
            if rng.random() < 0.2:
                del out[key]
        if rng.random() < 0.4:
            out[rng.choice(KEYS)] = _value(rng, 2)
        return out
    return _value(rng, 3) if rng.random() < 0.5 else value


def test_patches_from_python_apply_exactly_in_the_extension(tmp_path: Path) -> None:
    require_node_tools()
    rng = random.Random(1414)
    cases = []
    for _ in range(400):
        old = {"display": _value(rng, 1), "trace": _value(rng, 1), "revision": rng.randint(0, 9)}
        new = _mutate(rng, old)
        cases.append({"old": old, "new": new, "ops": diff_views(old, new)})
    assert sum(1 for c in cases if c["ops"]) > 300, "most cases change something"
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    result = subprocess.run(
        ["node", "--import", "jiti/register", "--test", str(REPO / "tests/node/patch_apply.ts")],
        cwd=REPO,
        env={"PATH": os.environ["PATH"], "PIW_PATCH_CASES": str(path)},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    summary = dict(re.findall(r"^# (pass|fail) (\d+)$", result.stdout, re.M))
    assert result.returncode == 0 and summary == {"pass": "1", "fail": "0"}, (
        result.stdout[-3000:] + result.stderr[-2000:]
    )
