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
from typing import TYPE_CHECKING, Any, Final

from pi_workflows.wire.canonical import CanonicalJSONError, dumps, loads

if TYPE_CHECKING:
    # jsonschema loads when a check first needs it (a client never does).
    from jsonschema.exceptions import ValidationError

    from pi_workflows.wire.schema_errors import Violation

__all__ = ["MAX_CACHED_CHECKS", "SchemaCheck", "check_schema"]

MAX_CACHED_CHECKS: Final = 256
"""Schema texts whose checks `check_schema` keeps (least recently used go first)."""

_COMPILE_SECONDS_PER_BYTE: Final = 4e-6
_COMPILE_SECONDS_FLOOR: Final = 3e-4
"""What compiling a schema costs, estimated from its canonical size (measured with
benchmarks/bench_checks.py: about 0.3 ms for a tiny schema, 2 ms for a 160-byte answer
schema, 6 ms for a 1 KB input schema). A check compiles once the time it has spent in
jsonschema reaches that estimate, so a schema checked once (in a runner child, say)
never pays for compiling, and one checked often pays at most twice the best case."""

_DRAFT_2020_12: Final = frozenset(
    {"https://json-schema.org/draft/2020-12/schema", "https://json-schema.org/draft/2020-12/schema#"}
)
_KNOWN: Final = frozenset(
    {
        # what `Draft202012Validator.VALIDATORS` applies, plus `then`/`else` (read by `if`)
        # and minContains/maxContains (read by `contains`)
        "$dynamicRef", "$ref", "additionalProperties", "allOf", "anyOf", "const", "contains",
        "dependentRequired", "dependentSchemas", "enum", "exclusiveMaximum",
        "exclusiveMinimum", "format", "if", "then", "else", "items", "maxItems", "maxLength",
        "maxProperties", "maximum", "minItems", "minLength", "minProperties", "minimum",
        "multipleOf", "not", "oneOf", "pattern", "patternProperties", "prefixItems",
        "properties", "propertyNames", "required", "type", "unevaluatedItems",
        "unevaluatedProperties", "uniqueItems", "minContains", "maxContains",
    }
)  # fmt: skip
_UNSUPPORTED: Final = frozenset(
    {"$dynamicRef", "multipleOf", "unevaluatedItems", "minContains", "maxContains"}
)
_TYPES: Final = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})
_COUNTS: Final = frozenset(
    {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"}
)
_BOUNDS: Final = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
_ONE_SCHEMA: Final = frozenset(
    {"additionalProperties", "items", "contains", "propertyNames", "then", "else"}
)
_SCHEMA_LISTS: Final = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_APPLICATORS: Final = frozenset({"$ref", "allOf", "anyOf", "oneOf", "if", "dependentSchemas"})
"""Keywords whose subschemas also evaluate properties (`unevaluatedProperties` needs them)."""
_DEF_NAME: Final = re.compile(r"[A-Za-z0-9_]{1,64}")
_MULTILINE_FLAG: Final = re.compile(r"\(\?[aiLmsux-]*m[aiLmsux-]*[:)]")
_WALKED_KEYS: Final = frozenset({"$ref", "$id", "id"})
"""Keys fastjsonschema's reference walk reads wherever they are, even inside `const`."""


class _Unsupported(Exception):
    """The schema uses something fastjsonschema does not check exactly as jsonschema."""


class SchemaCheck:
    """One Draft 2020-12 schema's check: `is_valid`, and jsonschema's wording on failure.

    Thread-safe: the validators are built once (a race builds a spare, never a wrong one).
    """

    __slots__ = ("_draft07", "_exact", "_fast", "_lock", "_schema", "_slow", "_spent", "_budget")

    def __init__(self, schema: Any, *, size: int | None = None) -> None:
        """`schema` must not change afterwards (`check_schema` passes a private copy)."""
        self._schema = schema
        self._slow: Any = None
        self._fast: tuple[Callable[[Any], Any], type[Exception]] | None = None
        self._lock = threading.Lock()
        self._spent = 0.0
        form = _draft07_form(schema)
        self._draft07: Any = None if form is None else form[0]
        self._exact = form is not None and form[1]
        self._budget = max(_COMPILE_SECONDS_FLOOR, _COMPILE_SECONDS_PER_BYTE * (size or 0))

    @property
    def schema(self) -> Any:
        """The schema checked (read-only)."""
        return self._schema

    @property
    def compilable(self) -> bool:
        """Whether fastjsonschema can check this schema exactly as jsonschema does."""
        return self._draft07 is not None

    @property
    def compiled(self) -> bool:
        """Whether checks now go through the compiled function."""
        return self._fast is not None

    def compile(self) -> bool:
        """Compile now (warm-ups, benchmarks, tests); True when the check is compiled."""
        if self._fast is None and self._draft07 is not None:
            with self._lock:
                if self._fast is None and self._draft07 is not None:
                    self._fast = _compiled(self._draft07)
                    if self._fast is None:
                        self._draft07 = None  # fastjsonschema refused it: keep jsonschema
        return self._fast is not None

    def is_valid(self, value: Any, *, plain: bool = True) -> bool:
        """Whether `value` satisfies the schema, exactly as jsonschema decides.

        Args:
            value: the JSON value to check.
            plain: False when the value may hold other Python types (say, from author
                code); such a value is then checked by jsonschema.
        """
        fast = self._fast
        if fast is not None and (plain or _is_plain(value)):
            function, rejected = fast
            try:
                function(value)
            except rejected:
                if self._exact:
                    return False
            except Exception:  # noqa: BLE001, S110 - a value it cannot read: jsonschema decides
                pass
            else:
                return True
            return bool(self._slow_validator().is_valid(value))
        started = time.perf_counter()
        valid = bool(self._slow_validator().is_valid(value))
        if self._draft07 is not None:
            self._spent += time.perf_counter() - started
            if self._spent >= self._budget:
                self.compile()
        return valid

    def iter_errors(self, value: Any) -> Iterator[ValidationError]:
        """jsonschema's errors for `value` (none when it is valid)."""
        return iter(()) if self.is_valid(value, plain=False) else self._errors(value)

    def best_error(self, value: Any, *, plain: bool = True) -> ValidationError | None:
        """jsonschema's `best_match` for `value`, or None when it is valid."""
        if self.is_valid(value, plain=plain):
            return None
        from jsonschema.exceptions import best_match  # noqa: PLC0415 (see TYPE_CHECKING)

        return best_match(self._errors(value))

    def first_violation(self, value: Any, *, plain: bool = True) -> Violation | None:
        """The safe refusal of `value` (`schema_errors.first_violation`), or None."""
        if self.is_valid(value, plain=plain):
            return None
        from pi_workflows.wire.schema_errors import first_violation  # noqa: PLC0415

        return first_violation(self._errors(value))

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
            detailed_exceptions=True,  # False breaks `const` in 2.22 (a KeyError)
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


class _Walk:
    """State of one rewrite: the root's definitions and what the schema uses."""

    def __init__(self, defs: dict[str, Any], unique_in_refs: bool) -> None:
        self.defs = defs
        self.unique_in_refs = unique_in_refs
        self.unique = False


def _draft07_form(schema: Any) -> tuple[Any, bool] | None:
    """`(schema for fastjsonschema, whether its rejections are final)`, or None when
    fastjsonschema cannot check it exactly as jsonschema does."""
    if isinstance(schema, bool):
        return schema, True
    if not isinstance(schema, dict):
        return None
    try:
        root = dict(schema)
        if root.pop("$schema", None) not in (None, *_DRAFT_2020_12):
            raise _Unsupported
        defs = root.pop("$defs", {})
        if not isinstance(defs, dict) or any(not _DEF_NAME.fullmatch(k) for k in defs):
            raise _Unsupported
        if len({name.lower() for name in defs}) != len(defs):
            raise _Unsupported  # fastjsonschema names a function per reference, lowercased
        walk = _Walk(defs, _mentions_unique(defs) or _mentions_unique(root))
        rewritten = _node(root, walk, exact=False)
        if defs:
            rewritten["$defs"] = {name: _node(sub, walk, exact=False) for name, sub in defs.items()}
    except (_Unsupported, re.error, RecursionError):
        return None
    return rewritten, not walk.unique


def _mentions_unique(node: Any) -> bool:
    if isinstance(node, dict):
        return node.get("uniqueItems") is True or any(_mentions_unique(v) for v in node.values())
    if isinstance(node, list):
        return any(_mentions_unique(v) for v in node)
    return False


def _node(node: Any, walk: _Walk, *, exact: bool) -> Any:
    """One subschema in fastjsonschema's draft-07 dialect; `exact`: under `not`, `if` or
    `oneOf`, where a stricter keyword could accept what jsonschema rejects."""
    if isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        raise _Unsupported
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _KNOWN:
            _keyword(key, value, node, out, walk, exact)
        elif key.startswith("$") and key != "$comment":
            raise _Unsupported  # $id, $anchor, $dynamicAnchor, nested $defs, ...
    _merge_dependencies(node, out, walk, exact)
    return out


def _keyword(
    key: str, value: Any, node: dict[str, Any], out: dict[str, Any], walk: _Walk, exact: bool
) -> None:
    if key in _UNSUPPORTED or key in ("dependentRequired", "dependentSchemas", "format"):
        if key in _UNSUPPORTED:
            raise _Unsupported
        return  # format: not asserted; dependencies: see _merge_dependencies
    if key == "type":
        types = value if isinstance(value, list) else [value]
        if not types or len(set(map(str, types))) != len(types):
            raise _Unsupported
        if not all(isinstance(t, str) and t in _TYPES for t in types):
            raise _Unsupported
        out[key] = value
    elif key in ("enum", "const"):
        if key == "enum" and not isinstance(value, list):
            raise _Unsupported
        if _walked_keys(value):
            raise _Unsupported
        out[key] = value
    elif key == "required":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _Unsupported
        if len(set(value)) != len(value):
            raise _Unsupported
        out[key] = value
    elif key in _COUNTS:
        if type(value) is not int or value < 0:
            raise _Unsupported
        out[key] = value
    elif key in _BOUNDS:
        if type(value) not in (int, float):
            raise _Unsupported
        out[key] = value
    elif key == "pattern":
        out[key] = _pattern(value)
    elif key == "uniqueItems":
        if not isinstance(value, bool):
            raise _Unsupported
        if value:
            if exact:
                raise _Unsupported
            walk.unique = True
            out[key] = True
    elif key in ("properties", "patternProperties"):
        if not isinstance(value, dict):
            raise _Unsupported
        if key == "patternProperties":
            for pattern in value:
                re.compile(pattern)  # jsonschema and fastjsonschema both use `re.search`
        out[key] = {name: _node(sub, walk, exact=exact) for name, sub in value.items()}
    elif key in _ONE_SCHEMA:
        _one_schema(key, value, node, out, walk, exact)
    elif key in _SCHEMA_LISTS:
        _schema_list(key, value, node, out, walk, exact)
    elif key in ("not", "if"):
        out[key] = _node(value, walk, exact=True)
    elif key == "$ref":
        _reference(value, node, out, walk, exact)
    elif key == "unevaluatedProperties":
        if any(k in node for k in _APPLICATORS):
            raise _Unsupported
        if "additionalProperties" not in node:  # else every property is evaluated
            out["additionalProperties"] = _node(value, walk, exact=exact)


def _one_schema(
    key: str, value: Any, node: dict[str, Any], out: dict[str, Any], walk: _Walk, exact: bool
) -> None:
    if key in ("then", "else") and "if" not in node:
        return  # ignored by both without `if`
    sub = _node(value, walk, exact=exact)
    if key == "items" and "prefixItems" in node:
        out["additionalItems"] = sub
    else:
        out[key] = sub


def _schema_list(
    key: str, value: Any, node: dict[str, Any], out: dict[str, Any], walk: _Walk, exact: bool
) -> None:
    if not isinstance(value, list) or not value:
        raise _Unsupported
    subs = [_node(sub, walk, exact=exact or key == "oneOf") for sub in value]
    if key == "prefixItems":
        out["items"] = subs
    elif key == "allOf":
        out["allOf"] = [*out.get("allOf", []), *subs]
    else:
        out[key] = subs


def _reference(value: Any, node: dict[str, Any], out: dict[str, Any], walk: _Walk, exact: bool) -> None:
    if not isinstance(value, str):
        raise _Unsupported
    if value != "#":
        name = value.removeprefix("#/$defs/")
        if name == value or name not in walk.defs:
            raise _Unsupported  # only the root and its own definitions
    if exact and walk.unique_in_refs:
        raise _Unsupported
    if "unevaluatedProperties" in node:
        raise _Unsupported
    # Draft-07 ignores the siblings of `$ref`; 2020-12 applies both, as `allOf` does.
    out["allOf"] = [{"$ref": value}, *out.get("allOf", [])]


def _merge_dependencies(node: dict[str, Any], out: dict[str, Any], walk: _Walk, exact: bool) -> None:
    required = node.get("dependentRequired", {})
    schemas = node.get("dependentSchemas", {})
    if not isinstance(required, dict) or not isinstance(schemas, dict):
        raise _Unsupported
    if set(required) & set(schemas):
        raise _Unsupported
    merged: dict[str, Any] = {}
    for name, needed in required.items():
        if not isinstance(needed, list) or not all(isinstance(v, str) for v in needed):
            raise _Unsupported
        if len(set(needed)) != len(needed):
            raise _Unsupported
        merged[name] = needed
    for name, sub in schemas.items():
        merged[name] = _node(sub, walk, exact=exact)
    if merged:
        out["dependencies"] = merged


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
        raise _Unsupported
    if re.compile(pattern).flags & re.MULTILINE or _MULTILINE_FLAG.search(pattern):
        raise _Unsupported  # `$` then also matches before inner newlines
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
        raise _Unsupported
    re.compile(spelled)
    return spelled
