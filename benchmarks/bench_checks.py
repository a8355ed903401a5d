"""User JSON Schema checks per second: a `Draft202012Validator` built per call (as before
issue 30) against `wire.schema_check` (one compiled check per schema text).

Three schemas of realistic size: a workflow's input schema (checked at `run.start`), an
agent step's output schema (with `$defs` and `$ref`) and a decision's answer schema.
Each is checked against valid values (the common case), and against a mix with one
value in ten invalid (an invalid value is worded by jsonschema on both sides, and the
two sides must word it alike). Also the cost of
a schema's first check in a fresh process (a runner checks its input once): the new
check must not cost more there, since it compiles only once checks add up.
And the schema's own check when a workflow loads (every runner, resolver and validation
child does it for every schema): jsonschema's `check_schema` against
`known_valid_schema`, which skips it for a schema the compiled check reads whole.
Targets: valid values >= 5x the old checks per second; a first check at most 100 us
more than the old one (a cache entry, a private copy); the schema's own check <= 0.2x
the old time.
Run: .venv/bin/python benchmarks/bench_checks.py [--checks N] [--repeats N]
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator

from pi_workflows.wire import schema_check
from pi_workflows.wire.schema_check import check_schema, known_valid_schema
from pi_workflows.wire.schema_errors import first_violation

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["repo", "title", "labels"],
    "additionalProperties": False,
    "properties": {
        "repo": {"type": "string", "pattern": "^[a-z0-9-]+/[a-z0-9-]+$", "maxLength": 200},
        "title": {"type": "string", "minLength": 1, "maxLength": 300},
        "labels": {
            "type": "array",
            "items": {"enum": ["bug", "feature", "docs", "chore"]},
            "maxItems": 4,
        },
        "priority": {"type": "integer", "minimum": 0, "maximum": 5},
        "assignees": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["login"],
                "properties": {"login": {"type": "string"}, "weight": {"type": "number"}},
                "additionalProperties": False,
            },
        },
        "dryRun": {"type": "boolean"},
        "notes": {"type": ["string", "null"]},
        "due": {"type": "string", "format": "date"},
    },
}

OUTPUT_SCHEMA: dict[str, Any] = {
    "$defs": {
        "finding": {
            "type": "object",
            "required": ["file", "line", "severity", "message"],
            "properties": {
                "file": {"type": "string", "minLength": 1},
                "line": {"type": "integer", "minimum": 1},
                "severity": {"enum": ["info", "warning", "error"]},
                "message": {"type": "string", "maxLength": 2000},
                "fix": {"type": ["string", "null"]},
            },
            "additionalProperties": False,
        }
    },
    "type": "object",
    "required": ["summary", "findings"],
    "properties": {
        "summary": {"type": "string", "minLength": 1},
        "findings": {"type": "array", "items": {"$ref": "#/$defs/finding"}, "maxItems": 200},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "unevaluatedProperties": False,
}

ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["approve"],
    "properties": {
        "approve": {"type": "boolean"},
        "comment": {"type": "string", "maxLength": 2000},
    },
    "additionalProperties": False,
}


def _input(rng: random.Random, valid: bool) -> Any:
    value: dict[str, Any] = {
        "repo": "acme/widgets",
        "title": "Fix the frobnicator " + str(rng.randrange(1000)),
        "labels": rng.sample(["bug", "feature", "docs", "chore"], rng.randrange(1, 4)),
        "priority": rng.randrange(6),
        "assignees": [{"login": f"u{i}", "weight": i / 2} for i in range(rng.randrange(3))],
        "dryRun": rng.random() < 0.5,
        "notes": None,
    }
    if not valid:
        value["priority"] = 9
    return value


def _output(rng: random.Random, valid: bool) -> Any:
    findings = [
        {
            "file": f"src/m{i}.py",
            "line": rng.randrange(1, 500),
            "severity": rng.choice(["info", "warning", "error"]),
            "message": "a finding " * rng.randrange(1, 8),
            "fix": None,
        }
        for i in range(rng.randrange(2, 12))
    ]
    if not valid:
        findings[0]["line"] = 0
    return {"summary": "reviewed", "findings": findings, "score": rng.random()}


def _answer(rng: random.Random, valid: bool) -> Any:
    value: dict[str, Any] = {"approve": rng.random() < 0.5, "comment": "looks good"}
    if not valid:
        value["extra"] = 1
    return value


CASES: list[tuple[str, dict[str, Any], Callable[[random.Random, bool], Any]]] = [
    ("input", INPUT_SCHEMA, _input),
    ("output", OUTPUT_SCHEMA, _output),
    ("answer", ANSWER_SCHEMA, _answer),
]


def _old(schema: Any, value: Any) -> Any:
    return first_violation(Draft202012Validator(schema).iter_errors(value))


def _new(schema: Any, value: Any) -> Any:
    return check_schema(schema).first_violation(value)


def _rate(check: Callable[[Any, Any], Any], schema: Any, values: list[Any], repeats: int) -> float:
    """Checks per second: the best of `repeats` passes (the least disturbed)."""
    best = float("inf")
    gc.disable()
    try:
        for _ in range(repeats):
            started = time.perf_counter()
            for value in values:
                check(schema, value)
            best = min(best, time.perf_counter() - started)
    finally:
        gc.enable()
    return len(values) / best


def _first_check(check: Callable[[Any, Any], Any], schema: Any, value: Any, rounds: int) -> float:
    """Median seconds of a schema's first check (the cache emptied each round)."""
    times = []
    for _ in range(rounds):
        schema_check._cache.clear()
        started = time.perf_counter()
        check(schema, value)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def _load_check(schema: Any, rounds: int, *, new: bool) -> float:
    """Median seconds of the check `define_workflow` makes of a schema."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        if not (new and known_valid_schema(schema)):
            Draft202012Validator.check_schema(schema)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", type=int, default=2000, help="values per schema")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(30)
    ratios = []
    for name, schema, make in CASES:
        valid = [make(rng, True) for _ in range(args.checks)]
        mix = [make(rng, index % 10 != 9) for index in range(args.checks)]
        for value in valid + mix:  # the same answers and the same safe wording
            assert _new(schema, value) == _old(schema, value), (name, value)
        assert check_schema(schema).compile(), name
        for label, values in (("valid", valid), ("1 in 10 invalid", mix)):
            old = _rate(_old, schema, values, args.repeats)
            new = _rate(_new, schema, values, args.repeats)
            if label == "valid":
                ratios.append(new / old)
            print(
                f"{name}, {label}: old {old:9.0f} checks/s   new {new:9.0f} checks/s   "
                f"{new / old:5.1f}x"
            )
        first_old = _first_check(_old, schema, values[0], max(5, args.repeats * 4))
        first_new = _first_check(_new, schema, values[0], max(5, args.repeats * 4))
        print(
            f"{name}: first check in a fresh process: old {first_old * 1e6:.0f} us, "
            f"new {first_new * 1e6:.0f} us"
        )
        extra = (first_new - first_old) * 1e6
        print(
            f"{name} first check new-old time: {extra:+.0f} us "
            f"({first_new / first_old:.2f}x)  (target <= +100 us)"
        )
    for name, schema, _ in CASES:
        rounds = max(3, args.repeats * 2)
        old, new = _load_check(schema, rounds, new=False), _load_check(schema, rounds, new=True)
        print(f"{name}: the schema's own check: old {old * 1e6:.0f} us, new {new * 1e6:.0f} us")
        print(f"{name} schema's own check new/old time: {new / old:.2f}x  (target <= 0.2x)")
    print(
        f"new/old checks per second, valid values, worst schema: {min(ratios):.1f}x  (target >= 5x)"
    )


if __name__ == "__main__":
    main()
