"""Canonical `dumps` throughput against orjson (sorted keys) and the pure-Python rfc8785 package.

Prints ratios measured in one run on one message mix (small envelopes and 64 KiB
run views). Target (issue 2): within 3x of orjson, at least 10x faster than rfc8785.
Run: .venv/bin/python benchmarks/bench_canonical.py
"""

from __future__ import annotations

import gc
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import rfc8785

sys.path.insert(0, str(Path(__file__).parent))
from _messages import envelopes, run_view

from pi_workflows.wire.canonical import (
    _dumps_with_output_checks,
    _orjson_output_is_canonical,
    dumps,
)


def best_of(repeats: int, encode: Callable[[Any], bytes], messages: list[Any]) -> float:
    """Best wall time of `repeats` passes (the least disturbed by the shared machine)."""
    best = float("inf")
    gc.disable()
    try:
        for _ in range(repeats):
            started = time.perf_counter()
            for message in messages:
                encode(message)
            best = min(best, time.perf_counter() - started)
    finally:
        gc.enable()
    return best


def main() -> None:
    rng = random.Random(8785)
    small = envelopes(rng, 2000)
    views = [run_view(rng, n) for n in range(20)]
    mix: list[Any] = small + views
    total_bytes = sum(len(dumps(m)) for m in mix)
    for message in mix:  # the canonical form is the reference: the others must agree on it
        assert dumps(message) == rfc8785.dumps(message)

    def orjson_sorted(value: Any) -> bytes:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)

    for label, part in (("envelopes", small), ("64 KiB run views", views)):
        ratio = best_of(15, dumps, part) / best_of(15, orjson_sorted, part)
        print(f"{label}: ours/orjson time {ratio:.2f}x")
    ours = best_of(15, dumps, mix)
    fast = best_of(15, orjson_sorted, mix)
    slow = best_of(3, rfc8785.dumps, mix)
    fallback = best_of(5, _dumps_with_output_checks, mix)
    mib = total_bytes / 2**20
    print(f"message mix: {len(mix)} messages, {mib:.2f} MiB")
    print(f"pi_workflows.wire.canonical.dumps: {mib / ours:8.1f} MiB/s")
    print(f"orjson.dumps(OPT_SORT_KEYS):       {mib / fast:8.1f} MiB/s")
    print(f"rfc8785.dumps:                     {mib / slow:8.1f} MiB/s")
    print(f"ratio ours/orjson time:  {ours / fast:.2f}x  (target <= 3x)")
    print(f"ratio rfc8785/ours time: {slow / ours:.1f}x  (target >= 10x)")
    built = "built" if _orjson_output_is_canonical is not None else "NOT built"
    print(f"(C pre-check {built}; without it, output checks: {fallback / fast:.2f}x orjson)")


if __name__ == "__main__":
    main()
