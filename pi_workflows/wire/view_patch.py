"""Revision patches between two views: the RFC 6902 subset a `runPatch` event carries.

Implements client-protocol.md § Subscriptions and reconnection ("the protocol also
supports retained revision patches"). A patch turns the view a client holds at its
base revision into the view at the event's revision. It uses three JSON Patch
operations (`add`, `remove`, `replace`) with RFC 6901 pointers, so any JSON Patch
library can apply it too. `diff_views` is used by the server, `apply_patch` by clients.
"""

from __future__ import annotations

import copy
from typing import Any, Literal, TypedDict

__all__ = ["PatchError", "PatchOperation", "apply_patch", "diff_views"]


class PatchOperation(TypedDict, total=False):
    """One operation: `value` is absent for `remove`."""

    op: Literal["add", "remove", "replace"]
    path: str
    value: Any


class PatchError(ValueError):
    """A patch that does not apply to the document it was given."""


def diff_views(old: Any, new: Any) -> list[PatchOperation]:
    """The operations that turn `old` into `new` (both JSON values)."""
    operations: list[PatchOperation] = []
    _diff(old, new, "", operations)
    return operations


def apply_patch(document: Any, operations: list[PatchOperation]) -> Any:
    """A new document: `document` with `operations` applied in order (it is not changed).

    Raises `PatchError` if an operation names a path the document does not have.
    """
    result = copy.deepcopy(document)
    for operation in operations:
        result = _apply_one(result, operation)
    return result


def _same(a: Any, b: Any) -> bool:
    """JSON equality: `True == 1` and `1 == 1.0` in Python, not in JSON."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _diff(old: Any, new: Any, path: str, out: list[PatchOperation]) -> None:
    if _same(old, new):
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old:
            if key not in new:
                out.append({"op": "remove", "path": _join(path, key)})
        for key, value in new.items():
            if key in old:
                _diff(old[key], value, _join(path, key), out)
            else:
                out.append({"op": "add", "path": _join(path, key), "value": value})
        return
    if isinstance(old, list) and isinstance(new, list):
        _diff_list(old, new, path, out)
        return
    out.append({"op": "replace", "path": path, "value": new})


def _diff_list(old: list[Any], new: list[Any], path: str, out: list[PatchOperation]) -> None:
    shift = _window_shift(old, new)
    if shift:
        # A bounded window that slid on: drop the oldest items instead of rewriting all.
        for _ in range(shift):
            out.append({"op": "remove", "path": _join(path, "0")})
        old = old[shift:]
    for index in range(min(len(old), len(new))):
        _diff(old[index], new[index], _join(path, str(index)), out)
    for value in new[len(old) :]:
        out.append({"op": "add", "path": _join(path, "-"), "value": value})
    for index in range(len(old) - 1, len(new) - 1, -1):
        out.append({"op": "remove", "path": _join(path, str(index))})


def _window_shift(old: list[Any], new: list[Any]) -> int:
    """How many leading items of `old` were dropped, if `new` continues it that way."""
    if not old or not new or _same(old[0], new[0]):
        return 0
    for shift in range(1, len(old)):
        if _same(old[shift], new[0]):
            return shift
    return 0


def _join(path: str, token: str) -> str:
    return f"{path}/{token.replace('~', '~0').replace('/', '~1')}"


def _tokens(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"a patch path must start with /: {path[:80]}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _apply_one(document: Any, operation: PatchOperation) -> Any:
    op = operation.get("op")
    tokens = _tokens(str(operation.get("path", "")))
    if not tokens:
        if op in ("add", "replace"):
            return copy.deepcopy(operation.get("value"))
        raise PatchError("cannot remove the whole document")
    parent = document
    for token in tokens[:-1]:
        parent = _child(parent, token)
    last = tokens[-1]
    if isinstance(parent, dict):
        _apply_to_object(parent, op, last, operation)
    elif isinstance(parent, list):
        _apply_to_array(parent, op, last, operation)
    else:
        raise PatchError("a patch path goes through a value that is not a container")
    return document


def _child(container: Any, token: str) -> Any:
    if isinstance(container, dict) and token in container:
        return container[token]
    if isinstance(container, list) and token.isdigit() and int(token) < len(container):
        return container[int(token)]
    raise PatchError(f"a patch path names a missing member {token[:80]}")


def _apply_to_object(
    parent: dict[str, Any], op: object, key: str, operation: PatchOperation
) -> None:
    if op == "add" or (op == "replace" and key in parent):
        parent[key] = copy.deepcopy(operation.get("value"))
    elif op == "remove" and key in parent:
        del parent[key]
    else:
        raise PatchError(f"cannot {op} member {key[:80]}")


def _apply_to_array(parent: list[Any], op: object, token: str, operation: PatchOperation) -> None:
    if op == "add" and token == "-":  # noqa: S105 (the RFC 6901 end-of-array token)
        parent.append(copy.deepcopy(operation.get("value")))
        return
    if not token.isdigit():
        raise PatchError(f"an array index must be a number: {token[:80]}")
    index = int(token)
    if op == "add" and index <= len(parent):
        parent.insert(index, copy.deepcopy(operation.get("value")))
    elif op == "replace" and index < len(parent):
        parent[index] = copy.deepcopy(operation.get("value"))
    elif op == "remove" and index < len(parent):
        del parent[index]
    else:
        raise PatchError(f"cannot {op} array item {index}")
