"""`wire.schema_check` decides every value exactly as jsonschema's Draft 2020-12 validator.

Each schema is checked both ways: through the fastjsonschema-compiled function (forced
with `compile()`) and through jsonschema itself; both must agree with a fresh
`Draft202012Validator` on validity and on the safe refusal `schema_errors` words.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from pi_workflows.wire import schema_check
from pi_workflows.wire.schema_check import MAX_CACHED_CHECKS, SchemaCheck, check_schema
from pi_workflows.wire.schema_errors import first_violation

TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
    "properties": {"root": {"const": True}},
}

# (name, schema, values, compilable)
CASES: list[tuple[str, Any, list[Any], bool]] = [
    (
        "refs-and-defs",
        TREE,
        [
            {"name": "a"},
            {"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]},
            {"name": "a", "children": [{"name": ""}]},
            {"name": "a", "children": [{"nome": "b"}]},
            {"name": "a", "root": True},  # `$ref` beside `properties`: both apply
            {"name": "a", "root": 1},
            [],
        ],
        True,
    ),
    (
        "recursive-root",
        {"type": ["array", "integer"], "items": {"$ref": "#"}, "maxItems": 2},
        [1, [1, [2, [3]]], [1, 2, 3], [[1.5]], [[True]], 1.0, "x"],
        True,
    ),
    (
        "pattern-dollar-and-digits",
        {"type": "string", "pattern": "^[a-z$]+-\\d{2}$"},
        ["ab-12", "ab-12\n", "ab-12\n\n", "a$-12", "ab-١٢", "AB-12", "ab-123", 12],
        True,
    ),
    (
        "pattern-properties",
        {
            "type": "object",
            "patternProperties": {"^x-": {"type": "integer"}, "[$]": {"const": 1}},
            "additionalProperties": {"type": "string"},
        },
        [{"x-a": 1, "b": "s"}, {"x-a": "1"}, {"b": 2}, {"a$": 1}, {"a$": 2}, {}],
        True,
    ),
    (
        "format-is-not-asserted",
        {
            "type": "object",
            "properties": {
                "when": {"type": "string", "format": "date-time"},
                "mail": {"type": "string", "format": "email"},
            },
        },
        [{"when": "2026-12-07T00:00:00Z"}, {"when": "yesterday"}, {"mail": "@"}, {"mail": 1}],
        True,
    ),
    (
        "unevaluated-properties-alone",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "patternProperties": {"^p": True},
            "unevaluatedProperties": {"type": "boolean"},
        },
        [{"a": 1}, {"a": 1, "b": True}, {"a": 1, "b": 2}, {"pz": 3}, {"a": "1"}],
        True,
    ),
    (
        "unevaluated-properties-with-allof-falls-back",
        {
            "allOf": [{"properties": {"a": {"type": "integer"}}}],
            "properties": {"b": {"type": "string"}},
            "unevaluatedProperties": False,
        },
        [{"a": 1, "b": "x"}, {"a": 1, "c": 2}, {"a": "1"}, {}],
        False,
    ),
    (
        "multiple-of-falls-back",
        {"type": "number", "multipleOf": 0.01},
        [19.01, 0.5, 1, 0.015, "x"],
        False,
    ),
    (
        "prefix-items",
        {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
        [["a", 1], ["a"], ["a", 1, 2], [1, "a"], []],
        True,
    ),
    (
        "dependencies",
        {
            "dependentRequired": {"a": ["b"]},
            "dependentSchemas": {"c": {"required": ["d"]}},
        },
        [{"a": 1, "b": 2}, {"a": 1}, {"c": 1, "d": 1}, {"c": 1}, {}, 3],
        True,
    ),
    (
        "choices",
        {
            "oneOf": [{"type": "integer"}, {"type": "number", "minimum": 5}],
            "not": {"const": 7},
            "if": {"type": "integer"},
            "then": {"maximum": 100},
            "else": {"exclusiveMaximum": 50},
        },
        [1, 5, 5.5, 7, 7.0, 101, 49.5, 60.5, True],
        True,
    ),
    (
        "const-and-enum-tell-booleans-from-numbers",
        {
            "type": "object",
            "properties": {"a": {"const": 1}, "b": {"enum": [False, [0], {"k": 1}]}},
        },
        [
            {"a": 1},
            {"a": 1.0},
            {"a": True},
            {"b": False},
            {"b": 0},
            {"b": [False]},
            {"b": {"k": 1.0}},
        ],
        True,
    ),
    (
        "unique-items-confirmed-by-jsonschema",
        {"type": "array", "uniqueItems": True, "items": {"type": ["array", "integer", "boolean"]}},
        [[1, 2], [1, 1], [1, True], [1, 1.0], [[0], [False], [0]], [[1], [True]]],
        True,
    ),
    (
        "unique-items-under-not-falls-back",
        {"not": {"uniqueItems": True}},
        [[1, 1], [1, 2], [[0], [False], [0]]],
        False,
    ),
    (
        "annotations-and-unknown-keywords",
        {
            "title": "t",
            "description": "d",
            "default": {"a": 1},
            "examples": [1],
            "$comment": "c",
            "additionalItems": False,
            "contentEncoding": "base64",
            "properties": {
                "a": {"type": "string", "default": "x", "contentMediaType": "application/json"}
            },
        },
        [{"a": "not json"}, {"a": 1}, {}, ["x"]],
        True,
    ),
    (
        "definitions-fastjsonschema-would-name-alike-fall-back",
        {
            "$defs": {"a": {"type": "string"}, "a_": {"type": "integer"}, "A": {"type": "null"}},
            "properties": {
                "s": {"$ref": "#/$defs/a"},
                "i": {"$ref": "#/$defs/a_"},
                "n": {"$ref": "#/$defs/A"},
            },
        },
        [{"s": "x", "i": 1, "n": None}, {"s": 1}, {"i": "x"}, {"n": 0}],
        False,
    ),
    (
        "definitions-with-distinct-names",
        {
            "$defs": {"a_b": {"type": "string"}, "ab": {"type": "integer"}},
            "properties": {"s": {"$ref": "#/$defs/a_b"}, "i": {"$ref": "#/$defs/ab"}},
        },
        [{"s": "x", "i": 1}, {"s": 1}, {"i": "x"}],
        True,
    ),
    (
        "draft-07-keywords-the-meta-schema-types-fall-back",
        {"dependencies": {"a": ["b"]}, "definitions": {"x": {"type": "string"}}},
        [{"a": 1}, {"a": 1, "b": 2}, 3],
        False,
    ),
    ("true", True, [1, None, {}], True),
    ("false", False, [1, None, {}], True),
    (
        "anchor-falls-back",
        {"$defs": {"a": {"$anchor": "x", "type": "string"}}, "$ref": "#x"},
        ["s", 1],
        False,
    ),
]


def _expected(schema: Any, value: Any) -> tuple[bool, Any]:
    validator = Draft202012Validator(schema)
    return validator.is_valid(value), first_violation(validator.iter_errors(value))


@pytest.mark.parametrize(
    ("name", "schema", "values", "compilable"), CASES, ids=[c[0] for c in CASES]
)
def test_compiled_and_jsonschema_paths_agree_with_jsonschema(
    name: str, schema: Any, values: list[Any], compilable: bool
) -> None:
    compiled, interpreted = SchemaCheck(copy.deepcopy(schema)), SchemaCheck(copy.deepcopy(schema))
    assert compiled.compile() is compilable
    assert not interpreted.compiled
    for value in values:
        valid, violation = _expected(schema, value)
        for check in (compiled, interpreted):
            assert check.is_valid(value) is valid, (name, value)
            assert check.first_violation(value) == violation, (name, value)
            error = check.best_error(value)
            assert (error is None) is valid
    assert compiled.compiled is compilable


def test_a_check_compiles_only_after_enough_use() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}
    check = SchemaCheck(schema, size=1000)
    assert check.is_valid({"n": 1})
    assert not check.compiled  # one use never pays for compiling
    slow = SchemaCheck({"type": "array", "items": schema}, size=0)
    many = [{"n": index} for index in range(20_000)]  # longer than compiling: still not
    assert slow.is_valid(many)
    assert not slow.compiled
    assert slow.is_valid(many)
    assert slow.compiled
    for _ in range(100_000):
        if check.compiled:
            break
        check.is_valid({"n": 1})
    assert check.compiled
    assert check.is_valid({"n": 2}) and not check.is_valid({"n": -1})


def test_a_value_with_other_python_types_is_checked_by_jsonschema() -> None:
    check = SchemaCheck({"type": "array"})
    assert check.compile()
    assert check.is_valid((1, 2))  # fastjsonschema reads a tuple as an array
    assert not check.is_valid((1, 2), plain=False)  # jsonschema does not
    assert check.first_violation((1,), plain=False) is not None


def test_checks_never_fill_in_defaults() -> None:
    check = SchemaCheck({"properties": {"a": {"default": 1}}})
    assert check.compile()
    value: dict[str, Any] = {}
    assert check.is_valid(value)
    assert value == {}


def test_equal_schema_texts_share_one_check_and_the_cache_is_bounded() -> None:
    first = check_schema({"type": "object", "required": ["a"]})
    assert check_schema({"required": ["a"], "type": "object"}) is first
    assert check_schema({"type": "object", "required": ["b"]}) is not first
    for index in range(MAX_CACHED_CHECKS):
        check_schema({"const": index})
    assert len(schema_check._cache) == MAX_CACHED_CHECKS
    assert check_schema({"type": "object", "required": ["a"]}) is not first


def test_a_cached_check_does_not_follow_later_changes_to_the_schema() -> None:
    schema: dict[str, Any] = {"type": "object", "required": ["late-change"]}
    check = check_schema(schema)
    schema["required"] = []
    assert not check.is_valid({})
    assert check_schema({"type": "object", "required": ["late-change"]}) is check


# ---------------------------------------------------------------------------
# Random schemas of the compiled keywords against random values

NAMES = st.sampled_from(["a", "b", "r", "a-b", "ab", "x y", "é", 'q"', "$ref", "id"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.0, 1.0, 2.5, -1.5]),
    st.sampled_from(["", "a", "ab\n", "a-b", "zz", "é"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(NAMES, inner, max_size=3)),
    max_leaves=8,
)


def _leaf_schemas() -> st.SearchStrategy[Any]:
    types = st.sampled_from(["array", "boolean", "integer", "null", "number", "object", "string"])
    return st.one_of(
        st.booleans(),
        st.builds(lambda t: {"type": t}, types),
        st.builds(lambda t: {"type": t}, st.lists(types, min_size=1, max_size=3, unique=True)),
        st.builds(lambda v: {"const": v}, SCALARS),
        st.builds(lambda v: {"enum": v}, st.lists(SCALARS, max_size=3)),
        st.builds(lambda n: {"minLength": n}, st.integers(0, 2)),
        st.builds(lambda n: {"maxItems": n}, st.integers(0, 2)),
        st.builds(lambda n: {"minProperties": n}, st.integers(0, 2)),
        st.builds(lambda n: {"minimum": n}, st.sampled_from([-1, 0, 1.5])),
        st.builds(lambda n: {"exclusiveMaximum": n}, st.sampled_from([0, 2, 2.5])),
        st.builds(lambda p: {"pattern": p}, st.sampled_from(["^a", "b$", "^[a$]", "-", "\\w$"])),
        st.builds(lambda r: {"required": r}, st.lists(NAMES, max_size=2, unique=True)),
        st.just({"uniqueItems": True}),
    )


def _composed(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.builds(lambda p: {"properties": p}, st.dictionaries(NAMES, inner, max_size=2)),
        st.builds(
            lambda p, extra: {"properties": p, "additionalProperties": extra},
            st.dictionaries(NAMES, inner, max_size=2),
            inner,
        ),
        st.builds(
            lambda p, extra: {"properties": p, "unevaluatedProperties": extra},
            st.dictionaries(NAMES, inner, max_size=2),
            inner,
        ),
        st.builds(lambda s: {"patternProperties": {"^a": s}}, inner),
        st.builds(lambda s: {"items": s}, inner),
        st.builds(
            lambda p, s: {"prefixItems": p, "items": s},
            st.lists(inner, min_size=1, max_size=2),
            inner,
        ),
        st.builds(lambda s: {"contains": s}, inner),
        st.builds(lambda s: {"propertyNames": s}, inner),
        st.builds(lambda s: {"not": s}, inner),
        st.builds(lambda a, b: {"if": a, "then": b}, inner, inner),
        st.builds(lambda a, b, c: {"if": a, "then": b, "else": c}, inner, inner, inner),
        st.builds(lambda s: {"allOf": s}, st.lists(inner, min_size=1, max_size=2)),
        st.builds(lambda s: {"anyOf": s}, st.lists(inner, min_size=1, max_size=2)),
        st.builds(lambda s: {"oneOf": s}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda s: {"dependentSchemas": {"a": s}}, inner),
        st.just({"dependentRequired": {"a": ["b"]}}),
        st.builds(
            lambda a, b: {**a, **b} if isinstance(a, dict) and isinstance(b, dict) else a,
            inner,
            inner,
        ),
    )


SCHEMAS = st.recursive(_leaf_schemas(), _composed, max_leaves=6)
REFERENCES = st.sampled_from(
    [
        {"$ref": "#/$defs/d"},
        {"$ref": "#/$defs/d", "type": "object"},
        {"not": {"$ref": "#/$defs/d"}},
        {"oneOf": [{"$ref": "#/$defs/d"}, {"type": "string"}]},
        {"$ref": "#"},
    ]
)
ROOTS = st.one_of(
    SCHEMAS,
    st.builds(
        lambda defined, body, reference: {
            "$defs": {"d": defined},
            "allOf": [body],
            "properties": {"r": reference},
        },
        SCHEMAS,
        SCHEMAS,
        REFERENCES,
    ),
)


@settings(max_examples=300)
@given(schema=ROOTS, values=st.lists(VALUES, min_size=1, max_size=6))
def test_random_schemas_are_checked_as_jsonschema_checks_them(
    schema: Any, values: list[Any]
) -> None:
    check = SchemaCheck(copy.deepcopy(schema))
    check.compile()
    validator = Draft202012Validator(schema)
    for value in values:
        assert check.is_valid(value) is validator.is_valid(value), value


# ---------------------------------------------------------------------------
# A schema the rewrite reads whole is a valid schema (jsonschema's meta-schema check)

JUNK: st.SearchStrategy[Any] = st.one_of(
    SCALARS, st.just([]), st.just({}), st.just(["a", "a"]), st.just({"type": "nothing"})
)
KEYWORDS = st.sampled_from(
    [
        "type", "enum", "const", "required", "properties", "patternProperties",
        "additionalProperties", "items", "prefixItems", "contains", "propertyNames",
        "not", "if", "then", "else", "allOf", "anyOf", "oneOf", "minLength", "maxItems",
        "minimum", "exclusiveMaximum", "pattern", "uniqueItems", "dependentRequired",
        "dependentSchemas", "unevaluatedProperties", "format", "title", "description",
        "$comment", "examples", "deprecated", "readOnly", "contentSchema", "definitions",
        "dependencies", "$ref", "$defs", "$anchor", "madeUp",
    ]
)  # fmt: skip


def _spoiled(schema: Any, keyword: str, junk: Any, depth: int) -> Any:
    """`schema` with `keyword: junk` set at one nesting `depth` (where it can go)."""
    if not isinstance(schema, dict):
        return {keyword: junk}
    for key, sub in schema.items():
        if depth > 0 and isinstance(sub, dict) and key not in ("const", "enum", "examples"):
            return {**schema, key: _spoiled(sub, keyword, junk, depth - 1)}
    return {**schema, keyword: junk}


@settings(max_examples=300)
@given(schema=ROOTS, keyword=KEYWORDS, junk=JUNK, depth=st.integers(0, 3))
def test_a_schema_known_valid_is_valid_by_the_meta_schema(
    schema: Any, keyword: str, junk: Any, depth: int
) -> None:
    for candidate in (schema, _spoiled(schema, keyword, junk, depth)):
        if schema_check.known_valid_schema(candidate):
            Draft202012Validator.check_schema(candidate)  # raises SchemaError if not


def test_common_schemas_are_known_valid_and_broken_ones_are_not() -> None:
    assert schema_check.known_valid_schema(TREE)
    assert schema_check.known_valid_schema({"type": "string", "title": "t", "format": "email"})
    for broken in (
        {"type": "text"},
        {"required": "a"},
        {"minLength": -1},
        {"pattern": "("},
        {"title": 5},
        {"properties": {"a": 3}},
        {"then": {"type": 1}},
        {"definitions": {"a": 1}},
        {"additionalProperties": False, "unevaluatedProperties": None},
    ):
        assert not schema_check.known_valid_schema(broken), broken
