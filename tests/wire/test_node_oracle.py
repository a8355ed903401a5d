"""Byte-identity with Node: `dumps` equals JSON.stringify with UTF-16-sorted keys.

Node is the oracle (python-port.md decision 1). Thousands of seeded random values
go to one Node process as JSON lines; Node answers with its canonical form of each.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
from typing import Any

import pytest

from pi_workflows.wire.canonical import MAX_SAFE_INTEGER, _dumps_with_output_checks, dumps

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed; the oracle needs it")

CASES = 4000

NODE_CANONICALIZER = r"""
const readline = require('readline');
function canon(v) {
  if (Array.isArray(v)) return '[' + v.map(canon).join(',') + ']';
  if (v !== null && typeof v === 'object') {
    // Default sort compares UTF-16 code units, exactly what RFC 8785 asks.
    const keys = Object.keys(v).sort();
    return '{' + keys.map(k => JSON.stringify(k) + ':' + canon(v[k])).join(',') + '}';
  }
  return JSON.stringify(v);
}
const out = [];
readline.createInterface({ input: process.stdin }).on('line', line => {
  // Answer as ASCII-escaped JSON strings so the transport cannot alter any byte.
  out.push(JSON.stringify(canon(JSON.parse(line))).replace(/[\u007f-\uffff]/g,
    c => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0')));
}).on('close', () => process.stdout.write(out.join('\n') + '\n'));
"""

BOUNDARY_FLOATS = [
    0.0,
    -0.0,
    5e-324,
    -5e-324,
    2.2250738585072009e-308,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    -1.7976931348623157e308,
    1e21,
    1e-7,
    1e-6,
    9.999999999999999e20,
    999999999999999900000.0,
    1e20,
    0.1,
    0.2,
    0.30000000000000004,
    9007199254740991.0,
    9007199254740992.0,
    9007199254740993.0,
    4.35,
    1e23,
    5e-7,
    123456789.12345678,
    1.0000000000000002,
    0.9999999999999999,
    2**-1074 * 3,
    1e308,
    1e-308,
    100.0,
    -1.5e300,
]


def _random_float(rng: random.Random) -> float:
    choice = rng.random()
    if choice < 0.15:
        return rng.choice(BOUNDARY_FLOATS)
    if choice < 0.55:
        while True:  # any bit pattern: every magnitude, subnormals included
            number: float = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
            if number == number and abs(number) != float("inf"):
                return number
    if choice < 0.75:
        return rng.uniform(-1e6, 1e6)
    if choice < 0.9:
        return float(rng.randint(-(10**22), 10**22))
    return rng.randint(-1000, 1000) / rng.choice([1, 3, 7, 10, 100, 1024])


def _random_char(rng: random.Random) -> str:
    plane = rng.random()
    if plane < 0.3:
        return chr(rng.randint(0x00, 0x7F))
    if plane < 0.5:
        return chr(rng.randint(0x80, 0xD7FF))
    if plane < 0.7:
        return chr(rng.randint(0xE000, 0xFFFF))
    return chr(rng.randint(0x10000, 0x10FFFF))


def _random_string(rng: random.Random) -> str:
    return "".join(_random_char(rng) for _ in range(rng.randint(0, 8)))


def _random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.random()
    if depth > 0 and kind < 0.25:
        size = rng.randint(0, 6)
        return {_random_string(rng): _random_value(rng, depth - 1) for _ in range(size)}
    if depth > 0 and kind < 0.4:
        return [_random_value(rng, depth - 1) for _ in range(rng.randint(0, 6))]
    if kind < 0.65:
        return _random_float(rng)
    if kind < 0.75:
        return rng.randint(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)
    if kind < 0.9:
        return _random_string(rng)
    return rng.choice([None, True, False])


def _deep(rng: random.Random, depth: int) -> Any:
    value: Any = _random_value(rng, 0)
    for _ in range(depth):
        value = {_random_string(rng): value} if rng.random() < 0.5 else [value]
    return value


def _node_canonical(values: list[Any]) -> list[bytes]:
    assert NODE is not None
    lines = "".join(json.dumps(value, ensure_ascii=True) + "\n" for value in values)
    result = subprocess.run(
        [NODE, "-e", NODE_CANONICALIZER],
        input=lines.encode("ascii"),
        capture_output=True,
        timeout=60,
        check=True,
    )
    return [json.loads(line).encode("utf-8") for line in result.stdout.decode("ascii").splitlines()]


@pytest.mark.timeout(120)
def test_dumps_is_byte_identical_with_node() -> None:
    seed = int(os.environ.get("PI_WORKFLOWS_ORACLE_SEED", random.randrange(2**32)))
    print(f"node oracle seed: {seed}", file=sys.stderr)
    rng = random.Random(seed)
    values: list[Any] = [_random_value(rng, 4) for _ in range(CASES)]
    values += [_deep(rng, rng.randint(20, 200)) for _ in range(50)]
    values += [[number] for number in BOUNDARY_FLOATS]
    expected = _node_canonical(values)
    assert len(expected) == len(values)
    for encode in (dumps, _dumps_with_output_checks):
        mismatches = [
            (value, want, encode(value))
            for value, want in zip(values, expected, strict=True)
            if encode(value) != want
        ]
        assert not mismatches, f"seed {seed}, {encode.__name__}: first {mismatches[0]!r}"
