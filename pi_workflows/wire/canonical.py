"""Canonical JSON: RFC 8785 (JCS), the one canonical form for the wire, digests and fingerprints.

Implements python-port.md decision 1 and client-protocol.md § Transports: ECMAScript
number formatting, UTF-16 code-unit key order, no white space, byte-identical with
Node's `JSON.stringify` of the same value with keys sorted by UTF-16 code units.

orjson does the work whenever its output is already canonical. It is not for
floats (`1.0`, `1e+20`, NaN written as `null`), integers beyond ±(2^53−1), and
keys at or above U+E000 (orjson sorts by code point, JCS by UTF-16 code unit).
A C pre-check (`_jcs_scan`) walks the value once to rule those out; where the
extension was not built, checks on orjson's output do the same job more slowly.
Only values that fail the check go through the exact encoder below.
"""

from __future__ import annotations

import enum
import hashlib
import io
import json
import math
import pickle
import re
import uuid
from collections.abc import Callable
from typing import Any, TypeAlias

import orjson

from pi_workflows.errors import PiWorkflowsError

__all__ = [
    "MAX_NESTING_DEPTH",
    "MAX_SAFE_INTEGER",
    "CanonicalJSONError",
    "InvalidJSONError",
    "JsonValue",
    "NestingTooDeepError",
    "NonCanonicalError",
    "NotSerializableError",
    "dumps",
    "format_number",
    "loads",
    "sha256_digest",
]

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None

MAX_SAFE_INTEGER = 2**53 - 1
"""Largest integer that every ECMAScript implementation reads back exactly."""

MAX_NESTING_DEPTH = 255
"""Deepest nesting of arrays and objects with a canonical form here (orjson's own limit)."""


class CanonicalJSONError(PiWorkflowsError, ValueError):
    """Base class for every canonical JSON failure."""


class NotSerializableError(CanonicalJSONError):
    """The value has no canonical JSON form (NaN, infinity, unsafe integer, bad key or type)."""


class InvalidJSONError(CanonicalJSONError):
    """The bytes are not JSON at all (syntax, invalid UTF-8, lone surrogate escape)."""


class NestingTooDeepError(NotSerializableError):
    """The value nests arrays and objects deeper than MAX_NESTING_DEPTH."""


class NonCanonicalError(CanonicalJSONError):
    """The bytes are valid JSON but not in canonical form (or repeat an object key)."""


_ORJSON_OPTIONS = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_STRICT_INTEGER
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)

# Every finite float orjson writes has a "." right after a digit or an "e+"/"e-".
# The literal-led pattern runs at memchr speed; a hit (possibly inside a string)
# is confirmed by the exact token pattern, which costs more per byte.
_DIGIT_DOT_SEARCH = re.compile(rb"\.(?<=[0-9]\.)").search
_DIGIT_EXPONENT_PLUS_SEARCH = re.compile(rb"e\+(?<=[0-9]e\+)").search
_DIGIT_EXPONENT_MINUS_SEARCH = re.compile(rb"e-(?<=[0-9]e-)").search
_FLOAT_TOKEN = re.compile(rb"(?:^|[:,\[])-?[0-9]+[.e]")
_NON_FINITE_BINFLOAT = re.compile(rb"G[\x7f\xff][\xf0-\xff]")
# UTF-8 lead bytes of U+E000..U+FFFF and of astral characters: the only characters
# whose code-point order differs from their UTF-16 code-unit order. One memchr scan
# each is far cheaper than one character-class regex scan.
_CODE_POINT_ORDER_LEADS = tuple(bytes([lead]) for lead in range(0xEE, 0xF5))

try:
    from pi_workflows.wire._jcs_scan import orjson_output_is_canonical
except ImportError:  # built without a C compiler: the output checks below stand in
    _orjson_output_is_canonical: Callable[[Any], bool] | None = None
else:
    _orjson_output_is_canonical = orjson_output_is_canonical

_orjson_dumps = orjson.dumps
_ORJSON_REFUSALS = (orjson.JSONEncodeError, TypeError)

_encode_string: Callable[[str], str] = json.encoder.encode_basestring


def dumps(value: Any) -> bytes:
    """Return the RFC 8785 canonical UTF-8 bytes of `value`.

    Args:
        value: `None`, `bool`, `int`, `float`, `str`, `list`/`tuple` or `dict` with
            `str` keys, nested to any depth (subclasses are treated as their base type).

    Raises:
        NotSerializableError: NaN or an infinity, an integer outside ±(2^53−1), a
            non-string key, a lone surrogate, or a value of another type.
    """
    if _orjson_output_is_canonical is not None:
        if _orjson_output_is_canonical(value):
            try:
                return _orjson_dumps(value, option=orjson.OPT_SORT_KEYS)
            except _ORJSON_REFUSALS:
                pass  # a lone surrogate in a string value: let the exact encoder name it
        return _exact_dumps(value)
    return _dumps_with_output_checks(value)


def _dumps_with_output_checks(value: Any) -> bytes:
    """`dumps` without the C pre-check: inspect orjson's output instead of the value."""
    try:
        out = _orjson_dumps(value, default=_as_base_type, option=_ORJSON_OPTIONS)
    except _ORJSON_REFUSALS:
        # orjson refuses lone surrogates, non-string keys, deep nesting and unknown
        # types; the exact encoder either handles the value or names the problem.
        return _exact_dumps(value)
    # Each test is a literal-led scan; the slower confirmation runs only on a hit.
    if (
        (
            _DIGIT_DOT_SEARCH(out)
            or (b"e+" in out and _DIGIT_EXPONENT_PLUS_SEARCH(out))
            or (b"e-" in out and _DIGIT_EXPONENT_MINUS_SEARCH(out))
        )
        and _FLOAT_TOKEN.search(out)
    ) or (
        (not out.isascii() and _may_misorder_keys(out))
        or (b"null" in out and _may_hold_non_finite(value))
    ):
        return _exact_dumps(value)
    return out


def _may_misorder_keys(out: bytes) -> bool:
    return any(lead in out for lead in _CODE_POINT_ORDER_LEADS)


def _may_hold_non_finite(value: Any) -> bool:
    """True if `value` may hold NaN or an infinity, which orjson writes as null.

    pickle walks the value in C and writes each float as BINFLOAT (`G`) followed by
    its big-endian IEEE bytes; all-ones exponent bits mark NaN and infinities. Other
    bytes that happen to match only cost a trip through the exact encoder.
    """
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=5)
    pickler.fast = True  # no memo: a third faster, and JSON values hold no cycles
    try:
        pickler.dump(value)
    except Exception:  # noqa: BLE001 - unpicklable values go to the exact encoder to be named
        return True
    return _NON_FINITE_BINFLOAT.search(buffer.getbuffer()) is not None


def loads(data: bytes | bytearray | memoryview) -> Any:
    """Parse canonical JSON bytes.

    Integer tokens within ±(2^53−1) become `int`, every other number a `float`, so
    `dumps(loads(b)) == b` for every canonical `b`.

    Raises:
        InvalidJSONError: not JSON, invalid UTF-8, or a lone surrogate escape.
        NonCanonicalError: valid JSON whose canonical form differs from `data`,
            including any object with a repeated key.
    """
    raw = bytes(data)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSONError(f"not valid JSON: {exc.msg}") from None
    try:
        again = dumps(value)
    except NestingTooDeepError:
        raise InvalidJSONError(f"JSON nests deeper than {MAX_NESTING_DEPTH} levels") from None
    except NotSerializableError:
        value = _floats_for_unsafe_integers(value)
        again = dumps(value)
    if again != raw:
        raise _explain_non_canonical(raw, again)
    return value


def sha256_digest(value: Any) -> str:
    """Return `sha256:<hex>` of the canonical bytes of `value` (definitions, inputs, payloads)."""
    return "sha256:" + hashlib.sha256(dumps(value)).hexdigest()


def _as_base_type(value: Any) -> Any:
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    raise NotSerializableError(f"a value of type {type(value).__name__} has no JSON form")


def _exact_dumps(value: Any) -> bytes:
    parts: list[str] = []
    _encode(value, parts, 0)
    try:
        return "".join(parts).encode("utf-8")
    except UnicodeEncodeError:
        raise NotSerializableError("a string contains a lone surrogate") from None


def _encode(value: Any, parts: list[str], depth: int) -> None:
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif type(value) is str:
        parts.append(_encode_string(value))
    elif type(value) is int:
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise NotSerializableError(
                "an integer is outside ±(2^53−1) and would not read back exactly; "
                "send it as a string"
            )
        parts.append(str(value))
    elif type(value) is float:
        parts.append(format_number(value))
    elif type(value) is dict:
        _check_depth(depth)
        _encode_object(value, parts, depth)
    elif type(value) is list or type(value) is tuple:
        _check_depth(depth)
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            _encode(item, parts, depth + 1)
        parts.append("]")
    else:
        _encode(_as_base_type(value), parts, depth)


def _check_depth(depth: int) -> None:
    if depth >= MAX_NESTING_DEPTH:
        raise NestingTooDeepError(
            f"the value nests deeper than {MAX_NESTING_DEPTH} levels of arrays and objects"
        )


def _encode_object(value: dict[Any, Any], parts: list[str], depth: int) -> None:
    for key in value:
        if not isinstance(key, str):
            raise NotSerializableError(
                f"an object key of type {type(key).__name__} is not a string"
            )
    parts.append("{")
    for index, key in enumerate(sorted(value, key=_utf16_order)):
        if index:
            parts.append(",")
        parts.append(_encode_string(str.__str__(key)))
        parts.append(":")
        _encode(value[key], parts, depth + 1)
    parts.append("}")


def _utf16_order(key: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly as the sequence of UTF-16 code units.
    return key.encode("utf-16-be", "surrogatepass")


def format_number(number: float) -> str:
    """Format a float as ECMAScript `Number.prototype.toString` does (RFC 8785 § 3.2.2.3)."""
    if math.isnan(number) or math.isinf(number):
        raise NotSerializableError("NaN and infinities have no JSON form")
    if number == 0:
        return "0"  # covers -0, which ECMAScript also prints as "0"
    sign = "-" if number < 0 else ""
    digits, point = _shortest_digits(abs(number))
    count = len(digits)
    if count <= point <= 21:
        return sign + digits + "0" * (point - count)
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * -point + digits
    exponent = point - 1
    exponent_text = ("+" if exponent > 0 else "-") + str(abs(exponent))
    mantissa = digits if count == 1 else digits[0] + "." + digits[1:]
    return sign + mantissa + "e" + exponent_text


def _shortest_digits(number: float) -> tuple[str, int]:
    """Return (digits, point) with number == 0.digits × 10^point and no redundant zeros.

    Python's `repr` yields the shortest digit string that reads back exactly, the
    same string the ECMAScript algorithm selects.
    """
    mantissa, _, exponent_text = repr(number).partition("e")
    whole, _, fraction = mantissa.partition(".")
    all_digits = (whole + fraction).lstrip("0")
    digits = all_digits.rstrip("0")
    exponent = int(exponent_text or 0) - len(fraction) + (len(all_digits) - len(digits))
    return digits, len(digits) + exponent


def _floats_for_unsafe_integers(value: Any) -> Any:
    if type(value) is int and not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        return float(value)
    if type(value) is dict:
        return {key: _floats_for_unsafe_integers(item) for key, item in value.items()}
    if type(value) is list:
        return [_floats_for_unsafe_integers(item) for item in value]
    return value


class _DuplicateKeyError(Exception):
    pass


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _DuplicateKeyError
    return result


def _explain_non_canonical(raw: bytes, canonical: bytes) -> NonCanonicalError:
    """Name the first reason `raw` is not canonical (only on the error path)."""
    try:
        json.loads(raw, object_pairs_hook=_reject_duplicates)
    except _DuplicateKeyError:
        return NonCanonicalError("an object repeats a key")
    except ValueError:
        pass
    offset = next(
        (i for i, (a, b) in enumerate(zip(raw, canonical, strict=False)) if a != b),
        min(len(raw), len(canonical)),
    )
    return NonCanonicalError(
        f"JSON is not in canonical form (RFC 8785); first difference at byte {offset}"
    )
