"""Checks of user-supplied JSON Schemas (Draft 2020-12), compiled once per schema text.

Implements issue 30's rule "no pure-Python jsonschema on a hot path" for the schemas
that workflow authors write (input, output, answer and spec schemas). `check_schema`
returns one `SchemaCheck` per schema text from a bounded cache. A check answers with a
function compiled by fastjsonschema when the schema uses only keywords that library
checks exactly as jsonschema's `Draft202012Validator` does (after a rewrite into its
draft-07 dialect, below); otherwise, and until compiling pays off, with jsonschema's
validator, built once. Rejections are always worded by jsonschema, so the refusals that
`wire.schema_errors` makes safe are the same as before.

What "exactly" means, keyword by keyword (the tests compare both libraries):

- `pattern` is rewritten so that `$` keeps Python's meaning (fastjsonschema reads it as
  `\\Z`); `prefixItems`/`items` become draft-07 `items`/`additionalItems`;
  `dependentRequired`/`dependentSchemas` become `dependencies`; `$ref` beside other
  keywords becomes an `allOf` member (draft-07 ignores siblings of `$ref`);
  `unevaluatedProperties` next to no applicator becomes `additionalProperties`.
- `format` is not asserted by either (no format checker), annotations are dropped, and
  so are keywords Draft 2020-12 does not know (jsonschema ignores them; draft-07 would
  apply some, such as `dependencies`).
- `uniqueItems` is only stricter in fastjsonschema (jsonschema's sort-and-compare misses
  some duplicates), so where it appears a compiled rejection is confirmed by jsonschema,
  and it is not compiled under `not`, `if` or `oneOf`.
- Anything else (`multipleOf`, `unevaluatedItems`, `minContains`, `$id`, anchors,
  non-local references, a value of the wrong type) keeps jsonschema for that schema.

Values are JSON values as decoded (dict, list, str, int, float, bool, None); for other
Python values (a tuple is an array to fastjsonschema only) pass `plain=False`.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from pi_workflows.wire.canonical import CanonicalJSONError, dumps, loads

if TYPE_CHECKING:
    # jsonschema loads when a check first needs it (a client never does).
    from jsonschema.exceptions import ValidationError

    from pi_workflows.wire.schema_errors import Violation

__all__ = [
    "MAX_CACHED_CHECKS",
    "SchemaCheck",
    "check_schema",
    "check_schema_json",
    "known_valid_schema",
]

MAX_CACHED_CHECKS: Final = 256
"""Schema texts whose checks `check_schema` keeps (least recently used go first)."""

_COMPILE_SECONDS_PER_BYTE: Final = 6e-6
_COMPILE_SECONDS_FLOOR: Final = 5e-4
"""What compiling a schema costs, estimated from its canonical size (measured: about
1 ms for bench_checks.py's 160-byte answer schema, 4 ms for its 650-byte input schema,
on a loaded 2-core machine), against 30-600 us for one check by jsonschema. A check
compiles once the time it has spent in jsonschema reaches that estimate (ski rental),
and never on its first use: a schema checked once (in a resolver or runner child) never
pays for compiling, and one checked often pays at most about twice the best case."""

_DRAFT_2020_12: Final = frozenset(
    {
        "https://json-schema.org/draft/2020-12/schema",
        "https://json-schema.org/draft/2020-12/schema#",
    }
)
_UNSUPPORTED: Final = frozenset(
    {"$dynamicRef", "multipleOf", "unevaluatedItems", "minContains", "maxContains"}
)
_TYPES: Final = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})
_COUNTS: Final = frozenset(
    {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"}
)
_BOUNDS: Final = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
_ONE_SCHEMA: Final = ("additionalProperties", "items", "contains", "propertyNames", "then", "else")
_SCHEMA_LISTS: Final = ("allOf", "anyOf", "oneOf", "prefixItems")
_APPLICATORS: Final = frozenset({"$ref", "allOf", "anyOf", "oneOf", "if", "dependentSchemas"})
"""Keywords whose subschemas also evaluate properties (`unevaluatedProperties` needs them)."""
_DEF_NAME: Final = re.compile(r"[A-Za-z0-9_]{1,64}")
_MULTILINE_FLAG: Final = re.compile(r"\(\?[aiLmsux-]*m[aiLmsux-]*[:)]")
_ANNOTATIONS: Final[dict[str, type | tuple[type, ...]]] = {
    "$comment": str,
    "title": str,
    "description": str,
    "contentEncoding": str,
    "contentMediaType": str,
    "deprecated": bool,
    "readOnly": bool,
    "writeOnly": bool,
    "examples": list,
    "default": object,
}
"""Keywords that assert nothing, with the type the 2020-12 meta-schema gives them
(`format`, read by `_dropped`, must be a string; `contentSchema` must be a schema)."""
_TYPED_UNKNOWN: Final = frozenset({"definitions", "dependencies"})
_WALKED_KEYS: Final = frozenset({"$ref", "$id", "id"})
"""Keys fastjsonschema's reference walk reads wherever they are, even inside `const`."""


_NOT_YET: Final = object()


class SchemaCheck:
    """One Draft 2020-12 schema's check: `is_valid`, and jsonschema's wording on failure.

    Thread-safe: the validators are built once (a race builds a spare, never a wrong one).
    """

    __slots__ = (
        "_budget",
        "_draft07",
        "_exact",
        "_fast",
        "_lock",
        "_schema",
        "_slow",
        "_spent",
        "_uses",
    )

    def __init__(self, schema: Any, *, size: int | None = None) -> None:
        """`schema` must not change afterwards (`check_schema` passes a private copy);
        `size`: the length of its canonical JSON, when the caller has it."""
        self._schema = schema
        self._slow: Any = None
        self._fast: tuple[Callable[[Any], Any], type[Exception]] | None = None
        self._lock = threading.Lock()
        self._spent = 0.0
        self._uses = 0
        self._draft07: Any = _NOT_YET  # the rewrite waits for the compile (a one-off never)
        self._exact = False
        if size is None:
            try:
                size = len(dumps(schema))
            except CanonicalJSONError:
                size = 0
        self._budget = max(_COMPILE_SECONDS_FLOOR, _COMPILE_SECONDS_PER_BYTE * size)

    @property
    def schema(self) -> Any:
        """The schema checked (read-only)."""
        return self._schema

    @property
    def compilable(self) -> bool:
        """Whether fastjsonschema can check this schema exactly as jsonschema does."""
        return self._rewritten() is not None

    @property
    def compiled(self) -> bool:
        """Whether checks now go through the compiled function."""
        return self._fast is not None

    def compile(self) -> bool:
        """Compile now (warm-ups, benchmarks, tests); True when the check is compiled."""
        if self._fast is None and self._draft07 is not None:
            with self._lock:
                draft07 = self._rewritten()
                if self._fast is None and draft07 is not None:
                    self._fast = _compiled(draft07)
                    if self._fast is None:
                        self._draft07 = None  # fastjsonschema refused it: keep jsonschema
        return self._fast is not None

    def _rewritten(self) -> Any:
        if self._draft07 is _NOT_YET:
            form = _draft07_form(self._schema)
            self._exact = form is not None and form[1]
            self._draft07 = None if form is None else form[0]
        return self._draft07

    def is_valid(self, value: Any, *, plain: bool = True) -> bool:
        """Whether `value` satisfies the schema, exactly as jsonschema decides.

        Args:
            value: the JSON value to check.
            plain: False when the value may hold other Python types (say, from author
                code); such a value is then checked by jsonschema.
        """
        verdict = self._compiled_verdict(value, plain)
        if verdict is not None:
            return verdict
        return bool(self._interpreted(lambda errors: next(errors, None) is None, value))

    def iter_errors(self, value: Any) -> Iterator[ValidationError]:
        """jsonschema's errors for `value` (none when it is valid)."""
        if self._compiled_verdict(value, plain=False) is True:
            return iter(())
        return self._errors(value)

    def best_error(self, value: Any, *, plain: bool = True) -> ValidationError | None:
        """jsonschema's `best_match` for `value`, or None when it is valid."""
        if self._compiled_verdict(value, plain) is True:
            return None
        from jsonschema.exceptions import best_match  # noqa: PLC0415 (see TYPE_CHECKING)

        error: ValidationError | None = self._interpreted(best_match, value)
        return error

    def first_violation(self, value: Any, *, plain: bool = True) -> Violation | None:
        """The safe refusal of `value` (`schema_errors.first_violation`), or None."""
        if self._compiled_verdict(value, plain) is True:
            return None
        from pi_workflows.wire.schema_errors import first_violation  # noqa: PLC0415

        violation: Violation | None = self._interpreted(first_violation, value)
        return violation

    def _compiled_verdict(self, value: Any, plain: bool) -> bool | None:
        """The compiled function's answer, or None when jsonschema must decide."""
        fast = self._fast
        if fast is None or not (plain or _is_plain(value)):
            return None
        function, rejected = fast
        try:
            function(value)
        except rejected:
            # final unless a stricter keyword (uniqueItems) may have refused it
            return False if self._exact else None
        except Exception:  # noqa: BLE001 - a value it cannot read: jsonschema decides
            return None
        return True

    def _interpreted(self, read: Callable[[Iterator[ValidationError]], Any], value: Any) -> Any:
        """`read(jsonschema's errors)`; the time counts toward compiling (while it may)."""
        if self._fast is not None or self._draft07 is None:
            return read(self._errors(value))
        started = time.perf_counter()
        result = read(self._errors(value))
        self._spent += time.perf_counter() - started
        self._uses += 1
        # Never on the first use, however slow (a loaded machine): a process that checks
        # once (a resolver) never compiles, nor loads fastjsonschema mid-load.
        if self._uses > 1 and self._spent >= self._budget:
            self.compile()
        return result

    def _errors(self, value: Any) -> Iterator[ValidationError]:
        return iter(self._slow_validator().iter_errors(value))

    def _slow_validator(self) -> Any:
        slow = self._slow
        if slow is None:
            from jsonschema import Draft202012Validator  # noqa: PLC0415 (see TYPE_CHECKING)

            slow = self._slow = Draft202012Validator(self._schema)
        return slow


_cache: OrderedDict[bytes, SchemaCheck] = OrderedDict()
_cache_lock = threading.Lock()


def check_schema(schema: Any) -> SchemaCheck:
    """The check of `schema` (a Draft 2020-12 JSON Schema), shared by equal schema texts.

    The cache holds `MAX_CACHED_CHECKS` checks keyed by the schema's canonical JSON; a
    schema without a canonical form gets a check of its own, built from a deep copy.
    """
    try:
        text = dumps(schema)
    except CanonicalJSONError:
        import copy  # noqa: PLC0415 (a rare path)

        return SchemaCheck(copy.deepcopy(schema))
    return check_schema_json(text)


def check_schema_json(text: bytes) -> SchemaCheck:
    """The check of the schema whose canonical JSON is `text` (as `check_schema`).

    Raises:
        CanonicalJSONError: `text` is not canonical JSON.
    """
    with _cache_lock:
        check = _cache.get(text)
        if check is not None:
            _cache.move_to_end(text)
            return check
    check = SchemaCheck(loads(text), size=len(text))
    with _cache_lock:
        _cache[text] = check
        while len(_cache) > MAX_CACHED_CHECKS:
            _cache.popitem(last=False)
    return check


def known_valid_schema(schema: Any) -> bool:
    """True when `schema` is certainly a valid Draft 2020-12 schema, without jsonschema.

    Every keyword of a schema `SchemaCheck` can compile has been read, with the type the
    meta-schema gives it, so jsonschema's `check_schema` (a few milliseconds of pure
    Python per schema, paid by every process that loads a workflow) can be skipped for
    it. False means "ask `check_schema`", which also words the problem.
    """
    return _draft07_form(schema) is not None


# ---------------------------------------------------------------------------
# Compiling


def _compiled(draft07: Any) -> tuple[Callable[[Any], Any], type[Exception]] | None:
    import fastjsonschema  # noqa: PLC0415 (loads with the first schema compiled)

    definition = (
        {"$schema": "http://json-schema.org/draft-07/schema#", **draft07}
        if isinstance(draft07, dict)
        else draft07
    )
    try:
        function = fastjsonschema.compile(
            definition,
            handlers={},
            use_default=False,  # never fill in defaults: a check does not change the value
            use_formats=False,  # as jsonschema without a format checker
            detailed_exceptions=False,
        )
    except Exception:  # noqa: BLE001 - any refusal keeps jsonschema for this schema
        return None
    return function, fastjsonschema.JsonSchemaValueException


def _is_plain(value: Any, depth: int = 0) -> bool:
    kind = type(value)
    if kind is dict:
        return depth < 256 and all(
            type(key) is str and _is_plain(item, depth + 1) for key, item in value.items()
        )
    if kind is list:
        return depth < 256 and all(_is_plain(item, depth + 1) for item in value)
    return kind in (str, int, float, bool, type(None))


# ---------------------------------------------------------------------------
# The draft-07 form of a schema


class _UnsupportedError(Exception):
    """The schema uses something fastjsonschema does not check exactly as jsonschema."""


def _require(condition: bool) -> None:
    if not condition:
        raise _UnsupportedError


@dataclass(slots=True)
class _Place:
    """One subschema being rewritten: its keywords, the rewrite so far, and whether it
    sits under `not`, `if` or `oneOf` (where a stricter keyword could accept what
    jsonschema rejects)."""

    node: dict[str, Any]
    out: dict[str, Any]
    exact: bool


class _Rewrite:
    """One schema's draft-07 form: its root definitions and what it uses."""

    def __init__(self, defs: dict[str, Any], unique_anywhere: bool) -> None:
        self.defs = defs
        self.unique_anywhere = unique_anywhere
        self.unique = False

    def node(self, node: Any, *, exact: bool) -> Any:
        if isinstance(node, bool):
            return node
        _require(isinstance(node, dict))
        place = _Place(node, {}, exact)
        for key, value in node.items():
            if key in _KNOWN:
                _KEYWORDS[key](self, place, key, value)
            elif key in _ANNOTATIONS:  # dropped, but of the type the meta-schema says
                _require(isinstance(value, _ANNOTATIONS[key]))
            elif key == "contentSchema":
                self.node(value, exact=exact)
            else:  # $id, $anchor, nested $defs; `definitions`, `dependencies` (typed by
                # the meta-schema, unknown to this module): keep jsonschema
                _require(not key.startswith("$") and key not in _TYPED_UNKNOWN)
        self.dependencies(place)
        return place.out

    def dependencies(self, place: _Place) -> None:
        required = place.node.get("dependentRequired", {})
        schemas = place.node.get("dependentSchemas", {})
        _require(isinstance(required, dict) and isinstance(schemas, dict))
        _require(not set(required) & set(schemas))
        merged: dict[str, Any] = {}
        for name, needed in required.items():
            _require(isinstance(needed, list) and all(isinstance(v, str) for v in needed))
            _require(len(set(needed)) == len(needed))
            merged[name] = needed
        for name, sub in schemas.items():
            merged[name] = self.node(sub, exact=place.exact)
        if merged:
            place.out["dependencies"] = merged


Handler: TypeAlias = Callable[[_Rewrite, _Place, str, Any], None]


def _unsupported(rewrite: _Rewrite, place: _Place, key: str, value: Any) -> None:
    raise _UnsupportedError


def _dropped(rewrite: _Rewrite, place: _Place, key: str, value: Any) -> None:
    """`format` (asserted by neither), and what `_Rewrite.dependencies` merges."""
    _require(key != "format" or isinstance(value, str))


def _type(rewrite: _Rewrite, place: _Place, key: str, value: Any) -> None:
    types = value if isinstance(value, list) else [value]
    _require(bool(types) and all(isinstance(t, str) and t in _TYPES for t in types))
    _require(len(set(types)) == len(types))
    place.out[key] = value


def _values(rewrite: _Rewrite, place: _Place, key: str, value: Any) -> None:
    _require(key == "const" or isinstance(value, list))
    _require(not _walked_keys(value))
    if key == "enum":
        place.out["enum"] = value
    else:
        # the same test as a one-value `enum`; fastjsonschema's own `const` breaks
        # without detailed exceptions (2.22), which cost a copy of the schema per refusal
        _require("enum" not in place.node)
        place.out["enum"] = [value]


def _required(rewrite: _Rewrite, place: _Place, key: str, value: Any) -> None:
    _require(isinstance(value, list) and all(isinstance(v, str) for v in value))
    _require(len(set(value)) == len(value))
    place.out[key] = value


def _count(rewrite: _Rewrite, place: _Place, key: str, value: Any) -> None:
    _require(type(value) is int and value >= 0)
    place.out[key] = value


def _bound(rewrite: _Rewrite, place: _Place, key: str, value: Any) -> None:
    _require(type(value) in (int, float))
    place.out[key] = value


def _pattern_keyword(rewrite: _Rewrite, place: _Place, key: str, value: Any) -> None:
    place.out[key] = _pattern(value)


def _unique(rewrite: _Rewrite, place: _Place, key: str, value: Any) -> None:
    _require(isinstance(value, bool))
    if value:
        _require(not place.exact)
        rewrite.unique = True
        place.out[key] = True


def _properties(rewrite: _Rewrite, place: _Place, key: str, value: Any) -> None:
    _require(isinstance(value, dict))
    if key == "patternProperties":
        for pattern in value:
            re.compile(pattern)  # jsonschema and fastjsonschema both use `re.search`
    place.out[key] = {name: rewrite.node(sub, exact=place.exact) for name, sub in value.items()}


def _one_schema(rewrite: _Rewrite, place: _Place, key: str, value: Any) -> None:
    sub = rewrite.node(value, exact=place.exact or key in ("not", "if"))
    if key in ("then", "else") and "if" not in place.node:
        return  # ignored by both without `if` (but a schema all the same)
    if key == "items" and "prefixItems" in place.node:
        place.out["additionalItems"] = sub
    else:
        place.out[key] = sub


def _schema_list(rewrite: _Rewrite, place: _Place, key: str, value: Any) -> None:
    _require(isinstance(value, list) and bool(value))
    exact = place.exact or key == "oneOf"
    subs = [rewrite.node(sub, exact=exact) for sub in value]
    if key == "prefixItems":
        place.out["items"] = subs
    elif key == "allOf":
        place.out["allOf"] = [*place.out.get("allOf", []), *subs]
    else:
        place.out[key] = subs


def _reference(rewrite: _Rewrite, place: _Place, key: str, value: Any) -> None:
    _require(isinstance(value, str))
    if value != "#":  # only the root and its own definitions
        _require(value.startswith("#/$defs/") and value[8:] in rewrite.defs)
    _require(not (place.exact and rewrite.unique_anywhere))
    _require("unevaluatedProperties" not in place.node)
    # Draft-07 ignores the siblings of `$ref`; 2020-12 applies both, as `allOf` does.
    place.out["allOf"] = [{"$ref": value}, *place.out.get("allOf", [])]


def _unevaluated(rewrite: _Rewrite, place: _Place, key: str, value: Any) -> None:
    _require(not any(k in place.node for k in _APPLICATORS))
    sub = rewrite.node(value, exact=place.exact)  # a schema even where it changes nothing
    if "additionalProperties" not in place.node:  # else every property is evaluated
        place.out["additionalProperties"] = sub


_KEYWORDS: Final[dict[str, Handler]] = {
    **dict.fromkeys(_UNSUPPORTED, _unsupported),
    **dict.fromkeys(("format", "dependentRequired", "dependentSchemas"), _dropped),
    "type": _type,
    "enum": _values,
    "const": _values,
    "required": _required,
    **dict.fromkeys(_COUNTS, _count),
    **dict.fromkeys(_BOUNDS, _bound),
    "pattern": _pattern_keyword,
    "uniqueItems": _unique,
    "properties": _properties,
    "patternProperties": _properties,
    **dict.fromkeys((*_ONE_SCHEMA, "not", "if"), _one_schema),
    **dict.fromkeys(_SCHEMA_LISTS, _schema_list),
    "$ref": _reference,
    "unevaluatedProperties": _unevaluated,
}
_KNOWN: Final = frozenset(_KEYWORDS)


def _draft07_form(schema: Any) -> tuple[Any, bool] | None:
    """`(schema for fastjsonschema, whether its rejections are final)`, or None when
    fastjsonschema cannot check it exactly as jsonschema does."""
    if isinstance(schema, bool):
        return schema, True
    if not isinstance(schema, dict):
        return None
    try:
        return _root_form(schema)
    except (_UnsupportedError, re.error, RecursionError):
        return None


def _root_form(schema: dict[str, Any]) -> tuple[Any, bool]:
    root = dict(schema)
    _require(root.pop("$schema", None) in (None, *_DRAFT_2020_12))
    defs = root.pop("$defs", {})
    _require(isinstance(defs, dict) and all(_DEF_NAME.fullmatch(k) for k in defs))
    # fastjsonschema names a function per reference; two names must not meet
    _require(len({_function_name(name) for name in defs}) == len(defs))
    rewrite = _Rewrite(defs, _mentions_unique(schema))
    rewritten = rewrite.node(root, exact=False)
    if defs:
        rewritten["$defs"] = {name: rewrite.node(sub, exact=False) for name, sub in defs.items()}
    return rewritten, not rewrite.unique


def _function_name(name: str) -> str:
    """What fastjsonschema's `get_scope_name` keeps of a definition's name."""
    return re.sub(r"[^a-zA-Z0-9]", "_", name).lower().rstrip("_")


def _mentions_unique(node: Any) -> bool:
    if isinstance(node, dict):
        return node.get("uniqueItems") is True or any(_mentions_unique(v) for v in node.values())
    if isinstance(node, list):
        return any(_mentions_unique(v) for v in node)
    return False


def _walked_keys(value: Any) -> bool:
    if isinstance(value, dict):
        return any(k in _WALKED_KEYS or _walked_keys(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_walked_keys(v) for v in value)
    return False


def _pattern(pattern: Any) -> str:
    """`pattern` with each `$` spelled so that fastjsonschema keeps Python's meaning.

    fastjsonschema turns every unescaped `$` into `\\Z`; Python's `$` (what jsonschema
    uses) also matches before a final newline, which `(?=\\n?\\Z)` says without a `$`."""
    if not isinstance(pattern, str):
        raise _UnsupportedError
    if re.compile(pattern).flags & re.MULTILINE or _MULTILINE_FLAG.search(pattern):
        raise _UnsupportedError  # `$` then also matches before inner newlines
    out: list[str] = []
    in_class = False
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            out.append(pattern[index : index + 2])
            index += 2
            continue
        if in_class:
            in_class = char != "]"
            out.append("\\x24" if char == "$" else char)
        elif char == "[":
            # `]` right after `[` or `[^` is a member, not the end of the class
            opening = re.match(r"\[\^?\]?", pattern[index:])
            assert opening is not None
            out.append(opening.group(0))
            index += len(opening.group(0))
            in_class = True
            continue
        else:
            out.append("(?=\\n?\\Z)" if char == "$" else char)
        index += 1
    spelled = "".join(out)
    if re.search(r"(?<!\\)\$", spelled):
        raise _UnsupportedError
    re.compile(spelled)
    return spelled
