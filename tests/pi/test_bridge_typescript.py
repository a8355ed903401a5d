"""The bridge extension's TypeScript, from `make test`: strict type check, then node's
test runner over tests/node/ (the wire fixture corpus through the TypeScript canonical
JSON codec and client.v1 decoder, and the `workflow` tool's logic).

pi loads the bridge with jiti and no build step; the tests run under the same loader
(`node --import jiti/register`), since node 20 cannot run TypeScript by itself.
"""

from __future__ import annotations

import re
import subprocess

from tests.pi.conftest import REPO, require_node_tools

NODE_TESTS = sorted((REPO / "tests" / "node").glob("*.test.ts"))


def test_the_bridge_type_checks_strictly() -> None:
    require_node_tools()
    result = subprocess.run(
        [str(REPO / "node_modules" / ".bin" / "tsc"), "-p", str(REPO / "tsconfig.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_node_test_runner_passes_the_fixture_corpus_and_the_tool_tests() -> None:
    require_node_tools()
    assert len(NODE_TESTS) >= 2
    result = subprocess.run(
        ["node", "--import", "jiti/register", "--test", *map(str, NODE_TESTS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    summary = dict(re.findall(r"^# (pass|fail|cancelled|todo|skipped) (\d+)$", result.stdout, re.M))
    failed = [line for line in result.stdout.splitlines() if line.startswith("not ok")]
    assert result.returncode == 0 and not failed, "\n".join(failed) or result.stderr[-2000:]
    corpus = len(list((REPO / "tests" / "fixtures" / "wire").glob("*/*.json")))
    assert int(summary["pass"]) > corpus, "every fixture file ran as its own test"
    assert summary["fail"] == summary["cancelled"] == summary["skipped"] == "0"
