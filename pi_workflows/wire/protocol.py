"""Protocol schemas and message codecs for the client, runner and channel-adapter channels.

Implements client-protocol.md § Envelope and workflow-server.md § Live client protocol,
§ Runner lifecycle (the launch envelope), § Runner protocol and § Supervised channel
adapters. The JSON Schemas in `wire/schemas/` are the contract; this module loads and
applies them, so the same files can drive a TypeScript implementation.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator, Mapping
from importlib import resources
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Literal,
    NotRequired,
    TypeAlias,
    TypedDict,
    cast,
    get_args,
)

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.wire._runner_payloads import MessageKind as RunnerMessageKind
from pi_workflows.wire.canonical import dumps, loads
from pi_workflows.wire.framing import MAX_FRAME_BYTES, FrameTooLargeError

if TYPE_CHECKING:
    # jsonschema loads when a message fails its fast branch check (to word the error) or
    # has no fast branch; a client that sends and reads valid messages never loads it.
    from jsonschema.exceptions import ValidationError

__all__ = [
    "CHANNEL_ADAPTER_KINDS",
    "CHANNEL_MESSAGE_KINDS",
    "CHANNEL_SCHEMA",
    "CHANNEL_SERVER_KINDS",
    "CLIENT_MESSAGE_TYPES",
    "CLIENT_SCHEMA",
    "DISK_FULL_CODE",
    "DISPLAY_STATUSES",
    "EVENT_KINDS",
    "LAUNCH_SCHEMA",
    "OUTCOMES",
    "RUNNER_COMMANDS",
    "RUNNER_MESSAGE_KINDS",
    "RUNNER_SERVER_KINDS",
    "RUN_LIST_PAGE_SCHEMA",
    "RUN_PAGE_SCHEMA",
    "RUN_VIEW_SCHEMA",
    "SCHEMA_NAMES",
    "SESSION_VIEW_SCHEMA",
    "ChannelSender",
    "ClientMessage",
    "DisplayStatus",
    "EventKind",
    "EventMessage",
    "HelloMessage",
    "Outcome",
    "ProtocolViolation",
    "RequestMessage",
    "ResponseMessage",
    "RunnerSender",
    "SafeError",
    "channel_message_from_wire",
    "client_message_from_wire",
    "client_operations",
    "decode_channel_message",
    "decode_client_message",
    "decode_launch_envelope",
    "decode_run_list_page",
    "decode_runner_message",
    "encode_channel_message",
    "encode_client_message",
    "encode_launch_envelope",
    "encode_run_list_page",
    "encode_runner_message",
    "launch_envelope_from_wire",
    "load_schema",
    "run_list_page_from_wire",
    "runner_message_from_wire",
    "unknown_operation",
    "validate",
]

CLIENT_SCHEMA: Final = "pi-workflows.client.v1"
"""The `schema` value of every live client message."""

LAUNCH_SCHEMA: Final = "pi-workflows.worker-launch.v1"
"""The `schema` value of the runner launch envelope and of every runner channel message."""

CHANNEL_SCHEMA: Final = "pi-workflows.channel.v1"
"""The `schema` value of every channel-adapter message."""

RUN_VIEW_SCHEMA: Final = "pi-workflows.run-view.v1"
RUN_LIST_PAGE_SCHEMA: Final = "pi-workflows.run-list-page.v1"
SESSION_VIEW_SCHEMA: Final = "pi-workflows.session-view.v1"
RUN_PAGE_SCHEMA: Final = "pi-workflows.run-page.v1"

SCHEMA_NAMES: Final = (
    "client.v1",
    "worker-launch.v1",
    "runner.v1",
    "channel.v1",
    "run-view.v1",
    "run-list-page.v1",
    "session-view.v1",
    "run-page.v1",
)
"""Every schema file in `wire/schemas/`, by the name `validate` takes (`<name>.schema.json`)."""

Outcome: TypeAlias = Literal[
    "accepted", "adopted", "rejected", "conflict", "notFound", "claimLost", "unavailable"
]
OUTCOMES: Final[tuple[Outcome, ...]] = (
    "accepted",
    "adopted",
    "rejected",
    "conflict",
    "notFound",
    "claimLost",
    "unavailable",
)
"""The closed set of command outcomes (client responses and runner replies)."""

DISK_FULL_CODE: Final = "diskFull"
"""The error code of a request refused because the disk holding the workflow state is
full (outcome `unavailable`): nothing was stored, and the same request (same idempotency
key) may be sent again once space returns."""

CLIENT_MESSAGE_TYPES: Final = ("hello", "request", "response", "event")

EventKind: TypeAlias = Literal[
    "runList",
    "runSnapshot",
    "runPatch",
    "runPage",
    "sessionSnapshot",
    "unavailable",
    "maintenanceProgress",
]
EVENT_KINDS: Final[tuple[EventKind, ...]] = (
    "runList",
    "runSnapshot",
    "runPatch",
    "runPage",
    "sessionSnapshot",
    "unavailable",
    "maintenanceProgress",
)

DisplayStatus: TypeAlias = Literal[
    "queued",
    "running",
    "waiting",
    "paused",
    "completed",
    "failed",
    "timed_out",
    "cancelled",
    "ambiguous",
]
DISPLAY_STATUSES: Final[tuple[DisplayStatus, ...]] = (
    "queued",
    "running",
    "waiting",
    "paused",
    "completed",
    "failed",
    "timed_out",
    "cancelled",
    "ambiguous",
)
"""The closed `display.status` set; only the server computes it."""

RUNNER_MESSAGE_KINDS: Final = get_args(RunnerMessageKind)
"""Kinds a runner may send to the server: the design's list, then `content.read` (a
bounded part of a value the server sent by reference; the design names no kind for it)
and `content.write` (a bounded part of a value too large for one frame that the runner
sends by reference: a shell command's escaped output, for example)."""

RUNNER_SERVER_KINDS: Final = ("command", "reply")
"""Kinds the server sends to a runner."""

RUNNER_COMMANDS: Final = ("start", "resume", "continue", "restart")

CHANNEL_MESSAGE_KINDS: Final = (
    "channel.ready",
    "channel.present",
    "channel.answer",
    "channel.settle",
    "channel.exiting",
)
CHANNEL_SERVER_KINDS: Final = ("channel.present", "channel.settle")
"""Channel kinds the server sends to an adapter (commands: no `result`)."""
CHANNEL_ADAPTER_KINDS: Final = (
    "channel.ready",
    "channel.present",
    "channel.answer",
    "channel.settle",
    "channel.exiting",
)
"""Channel kinds an adapter sends to the server (`channel.present`/`channel.settle` as
results: with `result`)."""

RunnerSender: TypeAlias = Literal["runner", "server"]
ChannelSender: TypeAlias = Literal["adapter", "server"]

_SCHEMA_PACKAGE = "pi_workflows.wire"
_SCHEMA_PREFIX = "pi-workflows."


class ProtocolViolation(PiWorkflowsError, ValueError):  # noqa: N818 - the protocol's own name
    """A decoded message does not match its protocol schema.

    The text names only schema-defined locations and keywords, never peer-supplied
    content, so it is safe to log and to return as a bounded error. The receiver
    closes only the offending connection.

    Attributes:
        schema_name: The schema the message was checked against, e.g. `client.v1`.
        keyword: The JSON Schema keyword that failed, e.g. `required`, or `None`.
        location: JSON pointer of the offending value inside the message.
    """

    def __init__(
        self, message: str, *, schema_name: str, keyword: str | None = None, location: str = ""
    ) -> None:
        super().__init__(message)
        self.schema_name = schema_name
        self.keyword = keyword
        self.location = location


class SafeError(TypedDict):
    """A bounded safe error in a response: a machine code and a short message."""

    code: str
    message: str


class HelloMessage(TypedDict):
    """The first message the server sends on a client connection."""

    schema: Literal["pi-workflows.client.v1"]
    type: Literal["hello"]
    connectionId: str
    packageVersion: str


class RequestMessage(TypedDict):
    """One client operation; `requestId` names one transport attempt only."""

    schema: Literal["pi-workflows.client.v1"]
    type: Literal["request"]
    requestId: str
    clientId: str
    operation: str
    idempotencyKey: str
    payload: dict[str, Any]
    runId: NotRequired[str]
    expectedRevision: NotRequired[int]


class ResponseMessage(TypedDict):
    """Settles one request; an accepted or adopted response has no `error`."""

    schema: Literal["pi-workflows.client.v1"]
    type: Literal["response"]
    requestId: str
    outcome: Outcome
    revision: NotRequired[int]
    receipt: NotRequired[dict[str, Any]]
    error: NotRequired[SafeError]


class EventMessage(TypedDict):
    """One revisioned subscription event."""

    schema: Literal["pi-workflows.client.v1"]
    type: Literal["event"]
    subscriptionId: str
    kind: EventKind
    revision: int
    payload: dict[str, Any]


ClientMessage: TypeAlias = HelloMessage | RequestMessage | ResponseMessage | EventMessage
"""Any live client message; narrow it with `message["type"]`."""


# ---------------------------------------------------------------------------
# Schema loading and validation


def _schema_file_name(schema_name: str) -> str:
    name = schema_name.removeprefix(_SCHEMA_PREFIX).removesuffix(".schema.json")
    if name not in SCHEMA_NAMES:
        raise KeyError(f"unknown protocol schema {schema_name!r}")
    return name


@functools.cache
def _schema_document(name: str) -> dict[str, Any]:
    text = (
        resources.files(_SCHEMA_PACKAGE)
        .joinpath("schemas")
        .joinpath(f"{name}.schema.json")
        .read_text(encoding="utf-8")
    )
    document: dict[str, Any] = json.loads(text)
    return document


def load_schema(schema_name: str) -> dict[str, Any]:
    """Return a copy of one protocol schema document.

    Args:
        schema_name: A name from `SCHEMA_NAMES` (`client.v1`), optionally with the
            `pi-workflows.` prefix or the `.schema.json` suffix.

    Raises:
        KeyError: no such schema.
    """
    return copy.deepcopy(_schema_document(_schema_file_name(schema_name)))


@functools.lru_cache(maxsize=128)
@functools.lru_cache(maxsize=256)
def _ecma_regex(pattern: str) -> re.Pattern[str]:
    """Compile an ECMA-262 `pattern` so Python matches what JavaScript matches.

    Python's `$` also matches before a final newline, so `"run.cancel\\n"` would pass
    `^...$`. An unescaped `$` outside a character class becomes `\\Z`.
    """
    out: list[str] = []
    index = 0
    in_class = False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            out.append(pattern[index : index + 2])
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "$":
            char = r"\Z"
        out.append(char)
        index += 1
    return re.compile("".join(out))


def _pattern_keyword(
    validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    from jsonschema.exceptions import ValidationError  # noqa: PLC0415 (see TYPE_CHECKING)

    if validator.is_type(instance, "string") and not _ecma_regex(pattern).search(instance):
        yield ValidationError("string does not match the pattern")


@functools.cache
def _protocol_validator_class() -> Any:
    """Draft 2020-12 with ECMA-262 `pattern` (jsonschema loads on the first call)."""
    from jsonschema import Draft202012Validator, validators  # noqa: PLC0415

    # jsonschema's `extend` is untyped in its stubs; the result is a validator class.
    return validators.extend(  # type: ignore[no-untyped-call]
        Draft202012Validator, {"pattern": _pattern_keyword}
    )


@functools.cache
def _default_relevance() -> Any:
    from jsonschema.exceptions import by_relevance  # noqa: PLC0415 (see TYPE_CHECKING)

    return by_relevance()


def _relevance(error: ValidationError) -> tuple[bool, Any]:
    """Rank `unevaluatedProperties` last: it also fires when a shared-field `allOf` fails."""
    return (error.validator != "unevaluatedProperties", _default_relevance()(error))


@functools.cache
def _validator(name: str) -> Any:
    validator_class = _protocol_validator_class()
    document = _schema_document(name)
    validator_class.check_schema(document)
    return validator_class(document)


_MAX_INLINE_DEPTH = 32


def _inline_refs(node: Any, defs: Mapping[str, Any], depth: int = 0) -> Any:
    """Replace local `{"$ref": "#/$defs/x"}` nodes by their targets (schemas hold no cycles)."""
    if depth > _MAX_INLINE_DEPTH:
        raise ValueError("schema references nest too deeply to inline")
    if isinstance(node, dict):
        inlined = {key: _inline_refs(value, defs, depth + 1) for key, value in node.items()}
        ref = inlined.pop("$ref", None)
        if not isinstance(ref, str):
            return inlined
        if not ref.startswith("#/$defs/"):
            raise ValueError(f"cannot inline the non-local reference {ref!r}")
        target = _inline_refs(defs[ref.removeprefix("#/$defs/")], defs, depth + 1)
        if not inlined:
            return target
        # `$ref` beside other keywords applies both, exactly like `allOf` (2020-12).
        inlined["allOf"] = [target, *inlined.get("allOf", [])]
        return inlined
    if isinstance(node, list):
        return [_inline_refs(item, defs, depth + 1) for item in node]
    return node


@functools.cache
def _branch_schemas(name: str) -> tuple[str | None, dict[Any, Any]]:
    """Per-discriminator subschemas for a schema shaped as `allOf` of if-const/then branches.

    The schema file stays the one contract: each branch is its `then` subschema with
    local references inlined, which jsonschema checks about four times faster than the
    whole document. The full validator still decides, and words, every rejection.
    """
    document = _schema_document(name)
    defs = document.get("$defs", {})
    discriminator: str | None = None
    branches: dict[Any, Any] = {}
    for clause in document.get("allOf", []):
        condition = clause.get("if", {})
        required = condition.get("required", [])
        properties = condition.get("properties", {})
        if len(required) != 1 or set(properties) != set(required) or "then" not in clause:
            return None, {}
        key = required[0]
        if discriminator not in (None, key) or "const" not in properties[key]:
            return None, {}
        discriminator = key
        branches[properties[key]["const"]] = _inline_refs(clause["then"], defs)
    return discriminator, branches


@functools.cache
def _branch_validator(name: str, value: Any) -> Any:
    """The validator of one branch, compiled on its first message (a client compiles
    only the few operations it uses)."""
    branch = _branch_schemas(name)[1][value]
    return _fast_branch(branch) or _protocol_validator_class()(branch)


def _clause_values(clause: object) -> tuple[str, frozenset[str]] | None:
    """`(key, values)` for an `allOf` clause `{"if": key is one of values, "then": ...}`
    over strings; None for any other clause."""
    if not isinstance(clause, dict) or set(clause) != {"if", "then"}:
        return None
    condition = clause["if"]
    if not isinstance(condition, dict) or set(condition) != {"required", "properties"}:
        return None
    required, properties = condition["required"], condition["properties"]
    if not (isinstance(required, list) and len(required) == 1 and [*properties] == required):
        return None
    rule = properties[required[0]]
    values = [rule["const"]] if set(rule) == {"const"} else rule.get("enum")
    if set(rule) - {"const", "enum"} or not isinstance(values, list):
        return None
    if not all(isinstance(v, str) for v in values):
        return None
    return required[0], frozenset(values)


@functools.cache
def _conditional_clauses(name: str, value: Any) -> tuple[tuple[int, str, frozenset[str]], ...]:
    """The branch's `allOf` clauses that apply only when a field holds given strings."""
    clauses = _branch_schemas(name)[1][value].get("allOf", [])
    found = ((index, _clause_values(clause)) for index, clause in enumerate(clauses))
    return tuple((index, *shape) for index, shape in found if shape is not None)


@functools.cache
def _applying_validator(name: str, value: Any, skipped: frozenset[int]) -> Any:
    """The branch without the conditional clauses in `skipped` (whose `if` a message
    fails, so they hold for it anyway): a request compiles its operation's clause only."""
    branch = dict(_branch_schemas(name)[1][value])
    if skipped:
        clauses = [c for i, c in enumerate(branch["allOf"]) if i not in skipped]
        if clauses:
            branch["allOf"] = clauses
        else:
            del branch["allOf"]
    return _fast_branch(branch) or _protocol_validator_class()(branch)


def _branch_is_valid(name: str, value: Any, message: dict[str, Any]) -> bool:
    conditional = _conditional_clauses(name, value)
    if not conditional:
        return bool(_branch_validator(name, value).is_valid(message))
    skipped = frozenset(
        index
        for index, key, values in conditional
        if not (isinstance(message.get(key), str) and message[key] in values)
    )
    return bool(_applying_validator(name, value, skipped).is_valid(message))


# A branch is compiled with fastjsonschema (draft-07 code generation, ~30x faster than
# jsonschema here) only when that can never accept what jsonschema rejects: every keyword
# is one it checks exactly as jsonschema does, or one where it is only stricter (`pattern`
# reads `$` as end of string; numeric bounds also apply to booleans), and the operators
# whose subschemas invert or choose (`not`, `if`/`then`/`else`, `oneOf`) hold exact
# keywords only. Anything else (`unevaluatedProperties`, `prefixItems`, ...) keeps
# jsonschema. A rejection is worded by the whole-document validator either way.
_EXACT_KEYWORDS = frozenset(
    {
        "type",
        "required",
        "properties",
        "additionalProperties",
        "const",
        "enum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "items",
        "description",
        "title",
        "$comment",
    }
)
_STRICTER_KEYWORDS = frozenset({"pattern", "minimum", "maximum", "allOf", "anyOf"})
_CHOOSING_KEYWORDS = frozenset({"not", "if", "then", "else", "oneOf"})


def _fast_safe(node: object, *, exact: bool = False) -> bool:
    if node is True:
        return True  # the schema that accepts anything, in both libraries
    if not isinstance(node, dict):
        return False
    return all(_fast_safe_keyword(key, value, exact) for key, value in node.items())


def _fast_safe_keyword(key: str, value: Any, exact: bool) -> bool:
    if key in ("then", "else"):
        # Not inverted: a stricter branch only rejects more, as outside a choice.
        return _fast_safe(value, exact=exact)
    if key in _CHOOSING_KEYWORDS:
        parts = value if isinstance(value, list) else [value]
        return all(_fast_safe(part, exact=True) for part in parts)
    if key in ("const", "enum"):
        values = value if key == "enum" else [value]
        return all(v is None or isinstance(v, (str, bool, int)) for v in values)
    if key == "properties":
        return all(_fast_safe(sub, exact=exact) for sub in value.values())
    if key in ("items", "additionalProperties") and isinstance(value, dict):
        return _fast_safe(value, exact=exact)
    if key in ("allOf", "anyOf"):
        return not exact and all(_fast_safe(part) for part in value)
    return key in _EXACT_KEYWORDS or (not exact and key in _STRICTER_KEYWORDS)


class _FastBranch:
    """A branch validator compiled by fastjsonschema; same `is_valid` as jsonschema's."""

    def __init__(self, schema: dict[str, Any]) -> None:
        import fastjsonschema  # noqa: PLC0415 (loads with the first branch compiled)

        self.schema = schema
        self._error = fastjsonschema.JsonSchemaException
        self._check = fastjsonschema.compile(
            {"$schema": "http://json-schema.org/draft-07/schema#", **schema}, use_formats=False
        )

    def is_valid(self, message: object) -> bool:
        try:
            self._check(message)
        except self._error:
            return False
        return True


def _fast_branch(schema: dict[str, Any]) -> _FastBranch | None:
    return _FastBranch(schema) if _fast_safe(schema) else None


_DOCUMENT_KEYWORDS = frozenset({"$schema", "$id", "$defs"})
"""Keywords of a schema file that name or hold its parts; inlined away by `_inline_refs`."""


@functools.cache
def _whole_fast(name: str) -> _FastBranch | None:
    """A schema without if-const branches (such as a run list page), compiled whole when
    fastjsonschema checks it as jsonschema does or stricter; else None."""
    document = _schema_document(name)
    body = {key: value for key, value in document.items() if key not in _DOCUMENT_KEYWORDS}
    try:
        inlined = _inline_refs(body, document.get("$defs", {}))
    except (ValueError, KeyError):
        return None
    return _fast_branch(inlined)


def _valid_by_branch(name: str, message: object) -> bool:
    discriminator, branches = _branch_schemas(name)
    if discriminator is None:
        whole = _whole_fast(name)
        return whole is not None and whole.is_valid(message)
    if not isinstance(message, dict):
        return False
    document = _schema_document(name)
    if any(field not in message for field in document.get("required", [])):
        return False
    for field, rule in document.get("properties", {}).items():
        if field in message and "const" in rule and message[field] != rule["const"]:
            return False
    value = message.get(discriminator)
    if not isinstance(value, str | int | bool) or value not in branches:
        return False
    return _branch_is_valid(name, value, message)


def validate(schema_name: str, message: object) -> None:
    """Check one decoded message against a protocol schema.

    Args:
        schema_name: A name from `SCHEMA_NAMES`, e.g. `client.v1` or `runner.v1`.
        message: The decoded JSON value.

    Raises:
        ProtocolViolation: the message does not match; the text holds no peer content.
        KeyError: no such schema.
    """
    name = _schema_file_name(schema_name)
    if _valid_by_branch(name, message):
        return
    from jsonschema.exceptions import best_match  # noqa: PLC0415 (see TYPE_CHECKING)

    error = best_match(_validator(name).iter_errors(message), key=_relevance)
    if error is not None:
        raise _violation(name, error)


@functools.cache
def client_operations() -> frozenset[str]:
    """The closed operation vocabulary: the `operation` enumeration of `client.v1`."""
    return frozenset(_schema_document("client.v1")["$defs"]["operation"]["enum"])


_STAND_IN_OPERATION: Final = "server.status"
"""An enumerated operation with no payload rule: checks the rest of a request's envelope."""


def unknown_operation(message: object) -> str | None:
    """The operation name of a request that is valid but for an unenumerated operation.

    Such a request gets a `rejected` answer naming the operation, not a closed
    connection: the name matches the `operationName` grammar (at most 128 characters of
    letters and dots), so echoing it is bounded and safe. None for anything else,
    which stays a schema violation.
    """
    if not isinstance(message, dict) or message.get("type") != "request":
        return None
    operation = message.get("operation")
    if not isinstance(operation, str) or operation in client_operations():
        return None
    grammar = _schema_document("client.v1")["$defs"]["operationName"]
    if len(operation) > grammar["maxLength"] or not _ecma_regex(grammar["pattern"]).search(
        operation
    ):
        return None
    try:
        validate("client.v1", {**message, "operation": _STAND_IN_OPERATION})
    except ProtocolViolation:
        return None
    return operation


def _violation(name: str, error: ValidationError) -> ProtocolViolation:
    keyword = str(error.validator)
    location = "".join(f"/{part}" for part in error.absolute_path)
    value = error.validator_value
    reason: str
    if keyword == "required" and isinstance(error.instance, dict) and isinstance(value, list):
        missing = [field for field in value if field not in error.instance]
        reason = "missing required field " + ", ".join(repr(field) for field in missing)
    elif keyword in {"additionalProperties", "unevaluatedProperties"}:
        reason = "unknown field"
    elif keyword in {"const", "enum"}:
        reason = "value is not one of the allowed values"
    elif keyword == "type":
        reason = f"expected {value}"
    elif keyword in {"minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems"}:
        reason = f"violates {keyword} {value}"
    elif keyword == "pattern":
        reason = "string does not match the required pattern"
    elif keyword == "not":
        reason = "field combination is not allowed"
    else:
        reason = f"fails {keyword}"
    return ProtocolViolation(
        f"message violates {name} at {location or '/'}: {reason}",
        schema_name=name,
        keyword=keyword,
        location=location,
    )


# ---------------------------------------------------------------------------
# Generic decode and encode


def _checked(name: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolViolation(
            f"message violates {name} at /: a message must be a JSON object",
            schema_name=name,
            keyword="type",
        )
    validate(name, value)
    return value


def _check_sender(name: str, message: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    if message.get("kind") not in allowed:
        raise ProtocolViolation(
            f"message violates {name} at /kind: this sender may not send that kind",
            schema_name=name,
            keyword="kind",
            location="/kind",
        )


def _decode(name: str, frame: bytes | bytearray | memoryview) -> dict[str, Any]:
    if len(frame) > MAX_FRAME_BYTES:
        raise FrameTooLargeError(f"message exceeds the {MAX_FRAME_BYTES}-byte frame limit")
    return _checked(name, loads(frame))


def _encode(name: str, message: Mapping[str, Any], allowed: tuple[str, ...] | None = None) -> bytes:
    checked = _checked(name, message)
    if allowed is not None:
        _check_sender(name, checked, allowed)
    body = dumps(message)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameTooLargeError(
            f"message of {len(body)} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit; "
            "send a content reference instead"
        )
    return body


# ---------------------------------------------------------------------------
# Live client protocol


def client_message_from_wire(value: object) -> ClientMessage:
    """Check an already-decoded value (e.g. from `FrameDecoder`) as a client message.

    Raises:
        ProtocolViolation: not an object, or not a valid `pi-workflows.client.v1` message.
    """
    return cast(ClientMessage, _checked("client.v1", value))


def decode_client_message(frame: bytes | bytearray | memoryview) -> ClientMessage:
    """Decode one client frame body (without its newline).

    Order of checks: size limit, canonical JSON, JSON object, schema.

    Raises:
        FrameTooLargeError: more than MAX_FRAME_BYTES.
        CanonicalJSONError: not JSON, or not canonical (white space, key order,
            number form, escapes, duplicate keys, bad UTF-8, lone surrogates).
        ProtocolViolation: canonical JSON that is not a valid client message.
    """
    return cast(ClientMessage, _decode("client.v1", frame))


def encode_client_message(message: Mapping[str, Any]) -> bytes:
    """Validate a client message, then return its canonical bytes (no trailing newline).

    Raises:
        ProtocolViolation: the message does not match the schema.
        NotSerializableError: a value has no canonical JSON form.
        FrameTooLargeError: the encoding exceeds MAX_FRAME_BYTES.
    """
    return _encode("client.v1", message)


# ---------------------------------------------------------------------------
# Runner launch envelope and runner channel


def launch_envelope_from_wire(value: object) -> dict[str, Any]:
    """Check an already-decoded value as a `pi-workflows.worker-launch.v1` envelope.

    Raises:
        ProtocolViolation: the envelope does not match the schema.
    """
    return _checked("worker-launch.v1", value)


def decode_launch_envelope(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Decode the canonical bytes of a runner launch envelope.

    Raises:
        FrameTooLargeError, CanonicalJSONError, ProtocolViolation: as for
        `decode_client_message`.
    """
    return _decode("worker-launch.v1", data)


def encode_launch_envelope(envelope: Mapping[str, Any]) -> bytes:
    """Validate a launch envelope and return its canonical bytes (the hashed form).

    Raises:
        ProtocolViolation, NotSerializableError, FrameTooLargeError: as for
        `encode_client_message`.
    """
    return _encode("worker-launch.v1", envelope)


def run_list_page_from_wire(value: object) -> dict[str, Any]:
    """Check an already-decoded value as a `pi-workflows.run-list-page.v1` page.

    Raises:
        ProtocolViolation: the page does not match the schema.
    """
    return _checked("run-list-page.v1", value)


def decode_run_list_page(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Decode the canonical bytes of a run-list page (as `decode_client_message`)."""
    return _decode("run-list-page.v1", data)


def encode_run_list_page(page: Mapping[str, Any]) -> bytes:
    """Validate a run-list page and return its canonical bytes (as `encode_client_message`)."""
    return _encode("run-list-page.v1", page)


def _runner_kinds(sender: RunnerSender | None) -> tuple[str, ...] | None:
    if sender is None:
        return None
    return RUNNER_MESSAGE_KINDS if sender == "runner" else RUNNER_SERVER_KINDS


def runner_message_from_wire(
    value: object, *, sender: RunnerSender | None = None
) -> dict[str, Any]:
    """Check an already-decoded value as a runner channel message, against the schema.

    Neither end calls this at run time: both read runner frames into the records of
    `wire/runner.py` (checked once, in C). This is the JSON Schema's own check, for
    tests and tools that hold raw frames.

    Args:
        value: The decoded message.
        sender: `"runner"` when the server reads from a runner (only runner kinds are
            accepted), `"server"` when a runner reads commands and replies, `None`
            to accept any kind of the channel.

    Raises:
        ProtocolViolation: the message does not match the schema or the sender.
    """
    message = _checked("runner.v1", value)
    allowed = _runner_kinds(sender)
    if allowed is not None:
        _check_sender("runner.v1", message, allowed)
    return message


def decode_runner_message(
    frame: bytes | bytearray | memoryview, *, sender: RunnerSender | None = None
) -> dict[str, Any]:
    """Decode one runner channel frame body (without its newline).

    Args:
        frame: The frame body.
        sender: As for `runner_message_from_wire`; the server passes `"runner"`.

    Raises:
        FrameTooLargeError, CanonicalJSONError, ProtocolViolation: as for
        `decode_client_message`.
    """
    if len(frame) > MAX_FRAME_BYTES:
        raise FrameTooLargeError(f"message exceeds the {MAX_FRAME_BYTES}-byte frame limit")
    return runner_message_from_wire(loads(frame), sender=sender)


def encode_runner_message(
    message: Mapping[str, Any], *, sender: RunnerSender | None = None
) -> bytes:
    """Validate a runner channel message and return its canonical bytes.

    Raises:
        ProtocolViolation, NotSerializableError, FrameTooLargeError: as for
        `encode_client_message`.
    """
    return _encode("runner.v1", message, _runner_kinds(sender))


# ---------------------------------------------------------------------------
# Channel-adapter channel


def _channel_kinds(sender: ChannelSender | None) -> tuple[str, ...] | None:
    if sender is None:
        return None
    return CHANNEL_ADAPTER_KINDS if sender == "adapter" else CHANNEL_SERVER_KINDS


def channel_message_from_wire(
    value: object, *, sender: ChannelSender | None = None
) -> dict[str, Any]:
    """Check an already-decoded value as a channel-adapter message.

    Args:
        value: The decoded message.
        sender: `"adapter"` when the server reads from an adapter, `"server"` when an
            adapter reads presentations, `None` to accept any kind of the channel.

    Raises:
        ProtocolViolation: the message does not match the schema or the sender.
    """
    message = _checked("channel.v1", value)
    allowed = _channel_kinds(sender)
    if allowed is not None:
        _check_sender("channel.v1", message, allowed)
        _check_channel_direction(message, sender)
    return message


def _check_channel_direction(message: Mapping[str, Any], sender: ChannelSender | None) -> None:
    # present and settle flow both ways: a command from the server, a result back.
    if message.get("kind") not in CHANNEL_SERVER_KINDS:
        return
    if ("result" in message) != (sender == "adapter"):
        raise ProtocolViolation(
            "message violates channel.v1 at /result: "
            + (
                "a result must come from the adapter"
                if sender == "server"
                else "a result is missing"
            ),
            schema_name="channel.v1",
            keyword="result",
            location="/result",
        )


def decode_channel_message(
    frame: bytes | bytearray | memoryview, *, sender: ChannelSender | None = None
) -> dict[str, Any]:
    """Decode one channel-adapter frame body (without its newline).

    Raises:
        FrameTooLargeError, CanonicalJSONError, ProtocolViolation: as for
        `decode_client_message`.
    """
    if len(frame) > MAX_FRAME_BYTES:
        raise FrameTooLargeError(f"message exceeds the {MAX_FRAME_BYTES}-byte frame limit")
    return channel_message_from_wire(loads(frame), sender=sender)


def encode_channel_message(
    message: Mapping[str, Any], *, sender: ChannelSender | None = None
) -> bytes:
    """Validate a channel-adapter message and return its canonical bytes.

    Raises:
        ProtocolViolation, NotSerializableError, FrameTooLargeError: as for
        `encode_client_message`.
    """
    body = _encode("channel.v1", message, _channel_kinds(sender))
    if sender is not None:
        _check_channel_direction(message, sender)
    return body
