"""Canonical JSON (RFC 8785): reference vectors, number forms, key order, errors, loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pi_workflows.wire import canonical
from pi_workflows.wire.canonical import (
    MAX_SAFE_INTEGER,
    CanonicalJSONError,
    InvalidJSONError,
    NonCanonicalError,
    NotSerializableError,
    dumps,
    loads,
)

RFC_DATA = Path(__file__).parent.parent / "fixtures" / "rfc8785"

# Both ways to the same bytes: the C pre-check in front of orjson, and the
# output checks used where the extension was not built.
ENCODERS = {
    "c-precheck": dumps,
    "output-checks": canonical._dumps_with_output_checks,
}


@pytest.fixture(params=sorted(ENCODERS))
def encode(request: pytest.FixtureRequest) -> Any:
    return ENCODERS[request.param]


@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None,
    reason="no C compiler: the package runs on its pure-Python output checks",
)
def test_the_c_precheck_is_built() -> None:
    # With a compiler, `make test` builds it; without one the build falls back silently.
    assert canonical._orjson_output_is_canonical is not None


VECTORS = sorted(path.name for path in (RFC_DATA / "input").glob("*.json"))


def _parse_like_ecmascript(text: str) -> Any:
    """Parse the way JSON.parse does: every number is a double."""

    def parse_int(token: str) -> int | float:
        number = int(token)
        return number if abs(number) <= MAX_SAFE_INTEGER else float(token)

    return json.loads(text, parse_int=parse_int)


@pytest.mark.parametrize("name", VECTORS)
def test_rfc8785_reference_vector(name: str, encode: Any) -> None:
    value = _parse_like_ecmascript((RFC_DATA / "input" / name).read_text("utf-8"))
    assert encode(value) == (RFC_DATA / "output" / name).read_bytes()


def test_reference_vectors_are_present() -> None:
    assert len(VECTORS) == 6


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e-7, "1e-7"),
        (1e-6, "0.000001"),
        (123.0, "123"),
        (-0.0, "0"),
        (0.0, "0"),
        (0.1, "0.1"),
        (-1.5, "-1.5"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (123456789012345680000.0, "123456789012345680000"),
        (1.5e-7, "1.5e-7"),
        (2.2250738585072014e-308, "2.2250738585072014e-308"),
        (9007199254740992.0, "9007199254740992"),
        (333333333.3333333, "333333333.3333333"),
    ],
)
def test_numbers_use_ecmascript_form(number: float, text: str, encode: Any) -> None:
    assert encode(number) == text.encode()
    assert encode([number]) == b"[" + text.encode() + b"]"


def test_keys_sort_by_utf16_code_units_not_code_points(encode: Any) -> None:
    value = {"\ue000": 1, "\U0001f600": 2, "a": 3, "\u00e9": 4}
    assert encode(value) == '{"a":3,"\u00e9":4,"\U0001f600":2,"\ue000":1}'.encode()


def test_strings_escape_as_json_stringify(encode: Any) -> None:
    text = '"\\\b\f\n\r\t\x00\x1f\x7f\u2028/'
    assert encode(text) == b'"\\"\\\\\\b\\f\\n\\r\\t\\u0000\\u001f\x7f\xe2\x80\xa8/"'


def test_no_white_space_and_nested_structures() -> None:
    assert dumps({"b": [1, {"d": None, "c": True}], "a": False}) == (
        b'{"a":false,"b":[1,{"c":true,"d":null}]}'
    )


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        float("-inf"),
        {"only": [None, float("nan")]},
        [float("inf"), None],
        MAX_SAFE_INTEGER + 1,
        -MAX_SAFE_INTEGER - 1,
        2**64,
        {1: "x"},
        {"a": {None: 1}},
        "\ud800",
        {"\udfff": 1},
        object(),
        b"bytes",
        {"set": {1, 2}},
    ],
)
def test_values_without_canonical_form_raise_value_error(value: Any, encode: Any) -> None:
    with pytest.raises(NotSerializableError) as info:
        encode(value)
    assert isinstance(info.value, ValueError)
    assert str(info.value)


def test_boundary_integers_are_allowed() -> None:
    assert dumps([MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER]) == b"[9007199254740991,-9007199254740991]"


def test_subclasses_serialize_as_their_base_type(encode: Any) -> None:
    class Name(str):
        pass

    class Count(int):
        pass

    assert encode({Name("k"): Count(3), "t": (1, 2)}) == b'{"k":3,"t":[1,2]}'


def test_loads_returns_int_for_safe_integers_and_float_otherwise() -> None:
    value = loads(b'{"big":100000000000000000000,"f":1.5,"i":9007199254740991,"n":-3}')
    assert value == {"big": 1e20, "f": 1.5, "i": MAX_SAFE_INTEGER, "n": -3}
    assert type(value["big"]) is float
    assert type(value["i"]) is int
    assert type(value["n"]) is int


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b'{"b":1,"a":2}', NonCanonicalError),
        (b'{"a": 1}', NonCanonicalError),
        (b'{"a":1,"a":1}', NonCanonicalError),
        (b"1.0", NonCanonicalError),
        (b"1E3", NonCanonicalError),
        (b"1e3", NonCanonicalError),
        (b"-0", NonCanonicalError),
        (b'"\\u0041"', NonCanonicalError),
        (b'"\\/"', NonCanonicalError),
        (b'"\\u001F"', NonCanonicalError),
        (b"9007199254740993", NonCanonicalError),
        (b'{"a":1}\n', NonCanonicalError),
        (b'"\\ud800"', InvalidJSONError),
        (b'"\xed\xa0\x80"', InvalidJSONError),
        (b'"\xff"', InvalidJSONError),
        (b"NaN", InvalidJSONError),
        (b"{", InvalidJSONError),
        (b"", InvalidJSONError),
    ],
)
def test_loads_rejects_non_canonical_and_invalid_input(data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        loads(data)


def test_duplicate_keys_are_named_in_the_error() -> None:
    with pytest.raises(NonCanonicalError, match="repeats a key"):
        loads(b'{"a":1,"a":1}')


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"])),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(st.characters(exclude_categories=["Cs"])), children, max_size=5)
    ),
    max_leaves=30,
)


@given(json_values)
def test_loads_inverts_dumps_for_every_canonical_document(value: Any) -> None:
    data = dumps(value)
    assert dumps(loads(data)) == data


@given(st.binary(max_size=64))
def test_loads_never_fails_with_anything_but_canonical_errors(data: bytes) -> None:
    try:
        value = loads(data)
    except CanonicalJSONError:
        return
    assert dumps(value) == data


@pytest.mark.parametrize("depth", [256, 600, 1023])
def test_deep_nesting_is_a_clear_error_both_ways(depth: int) -> None:
    with pytest.raises(InvalidJSONError, match="deeper"):
        loads(b"[" * depth + b"]" * depth)
    with pytest.raises(InvalidJSONError, match="deeper"):
        loads(b'{"a":' * depth + b"1" + b"}" * depth)
    value: Any = []
    for _ in range(depth):
        value = [value]
    with pytest.raises(NotSerializableError, match="deeper"):
        dumps(value)


def test_nesting_up_to_the_limit_round_trips() -> None:
    data = b"[" * 255 + b"]" * 255
    assert dumps(loads(data)) == data
