"""The server's cache of resolver answers, so most `run.start`s spawn no resolver.

Implements issue 6's fast `run.start` without giving up python-port.md decision 4 (the
server never runs workflow code). A resolver answer is reused only when starting the
workflow ran no code that depends on the input: the resolver marks an answer
`reuse.cacheable` when the root has no `input` callable and no `title` callable. A
later `run.start` of the same name, project and agent folder is then answered here:

1. **Discovery again, cheaply.** Every name lookup the load made (the root, then each
   include by name) is repeated by checking the candidate files in precedence order
   (project, agent folder, built-ins). A new file that shadows one, or a removed one,
   is a miss.
2. **The bytes again.** Every file of the source identity (root and mounted) and every
   module file the load imported is read and its SHA-256 compared with the saved hash
   on every lookup (no stat signature or mtime is trusted; the files are small).
3. **The input.** The input goes through the same canonical JSON round trip the
   resolver request does, is checked against the root's JSON Schema with the same
   validator and safe error wording as `validate_input`, and hashed with `sha256_digest`.

The answer is the resolver's own answer with this request's input, input hash and name:
byte-for-byte what the resolver would produce for unchanged files (tests compare both).
What the cache cannot see: files a workflow reads at import other than modules, and its
environment. If one of those changes the definition, the runner's digest check parks the
run with `workflowSourceChanged` before any node runs, as for any change after start.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pi_workflows.engine import WORKFLOW_SUFFIX, InputInvalidError, command_name, search_dirs
from pi_workflows.engine.resolve import input_invalid_message, safe_message
from pi_workflows.wire.canonical import CanonicalJSONError, dumps, loads, sha256_digest
from pi_workflows.wire.schema_check import SchemaCheck, check_schema

__all__ = ["CACHE_ENV", "DEFAULT_CAPACITY", "CacheStats", "CachedDefinition", "DefinitionCache"]

log = logging.getLogger(__name__)

CACHE_ENV = "PI_WORKFLOWS_DEFINITION_CACHE"
"""`0` turns the cache off: every `run.start` runs the resolver (benchmarks compare)."""
DEFAULT_CAPACITY = 256
"""Definitions kept (least recently used dropped first)."""

_PER_REQUEST = ("workflow", "input", "inputHash")
"""Answer fields that come from the request, not from the source."""


@dataclass(frozen=True, slots=True)
class _Lookup:
    """One discovery the resolver made: `name` found at `path`."""

    name: str
    path: str


@dataclass(frozen=True, slots=True)
class _File:
    """One file the answer depends on, by resolved path and `sha256:` hash."""

    path: str
    hash: str


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters since the cache was made (for tests and benchmarks)."""

    hits: int
    misses: int
    stores: int


@dataclass(frozen=True, slots=True, eq=False)
class CachedDefinition:
    """A reusable resolver answer and everything that must still hold to reuse it."""

    answer: Mapping[str, Any]
    """The resolver's answer without its per-request fields; treat as read-only."""
    lookups: tuple[_Lookup, ...]
    files: tuple[_File, ...]
    check: SchemaCheck | None
    """The check of the root's input schema (`wire.schema_check`), or None (no schema)."""

    def answer_for(self, name: str, workflow_input: Any) -> dict[str, Any] | None:
        """The resolver's answer for this input, or None when the cache cannot tell.

        None means "ask the resolver" (the input is not canonical JSON: the resolver
        path reports that itself).
        """
        try:
            value = loads(dumps(workflow_input))  # what the resolver's request line carries
        except CanonicalJSONError:
            return None
        if self.check is not None:
            violation = self.check.first_violation(value)
            if violation is not None:
                refusal = InputInvalidError.from_violation(violation)
                message = safe_message(input_invalid_message(name, refusal))
                return {"ok": False, "code": refusal.code, "message": message}
        answer = dict(self.answer)  # nested values are shared: nobody mutates an answer
        answer["workflow"] = name
        answer["input"] = value
        answer["inputHash"] = sha256_digest(value)
        return answer

    def still_valid(self, project: Path | None, agent_dir: Path) -> bool:
        """True when discovery finds the same files and every file has its saved bytes."""
        dirs = [folder for _, folder in search_dirs(project, agent_dir)]
        for lookup in self.lookups:
            if _find(lookup.name, dirs) != lookup.path:
                return False
        for item in self.files:
            try:
                data = Path(item.path).read_bytes()
            except OSError:
                return False
            if "sha256:" + hashlib.sha256(data).hexdigest() != item.hash:
                return False
        return True


def _find(name: str, dirs: list[Path]) -> str | None:
    """`find_workflow(name, ...).path` as a string, by probing the candidates in order.

    Equal to a full discovery for a valid command name, except that a folder that is
    searchable but not listable counts here (so such a setup only misses the cache).
    """
    file_name = f"{name}{WORKFLOW_SUFFIX}"
    if command_name(Path(file_name)) != name:
        return None
    for folder in dirs:
        candidate = folder / file_name
        if candidate.is_file() and os.access(folder, os.R_OK | os.X_OK):
            try:
                return str(candidate.resolve())
            except OSError:
                return None
    return None


class DefinitionCache:
    """Reusable resolver answers by (workflow name, project path, agent folder).

    Thread-safe: `answer` and `store` run on the resolver threads.
    A lookup reads and hashes the definition's files: small, bounded work (the resolver
    refuses reuse for a workflow that imports more than a few MiB of modules).
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY, *, enabled: bool | None = None) -> None:
        self._capacity = capacity
        self.enabled = enabled if enabled is not None else os.environ.get(CACHE_ENV) != "0"
        """False: every lookup misses and nothing is stored (`PI_WORKFLOWS_DEFINITION_CACHE=0`)."""
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str | None, str], CachedDefinition] = OrderedDict()
        self._hits = 0
        self._misses = 0
        self._stores = 0

    @property
    def stats(self) -> CacheStats:
        """Hits, misses and stores so far."""
        with self._lock:
            return CacheStats(self._hits, self._misses, self._stores)

    def lookup(self, name: str, project: str | None, agent_dir: Path) -> CachedDefinition | None:
        """The cached definition, if every file and discovery it depends on still holds."""
        key = (name, project, str(agent_dir))
        with self._lock:
            entry = self._entries.get(key) if self.enabled else None
        if entry is not None and not entry.still_valid(
            Path(project) if project is not None else None, agent_dir
        ):
            with self._lock:
                if self._entries.get(key) is entry:
                    del self._entries[key]
            entry = None
        with self._lock:
            if entry is None:
                self._misses += 1
            else:
                self._hits += 1
                self._entries.move_to_end(key)
        return entry

    def answer(
        self, name: str, project: str | None, agent_dir: Path, workflow_input: Any
    ) -> dict[str, Any] | None:
        """The resolver's answer for this `run.start`, or None: run the resolver.

        Never raises: anything unexpected is a miss, and the resolver decides.
        """
        try:
            entry = self.lookup(name, project, agent_dir)
            return entry.answer_for(name, workflow_input) if entry is not None else None
        except Exception:
            log.exception("definition cache lookup failed", extra={"action": "cache.error"})
            return None

    def store(
        self, name: str, project: str | None, agent_dir: Path, answer: Mapping[str, Any]
    ) -> bool:
        """Keep a resolver answer for reuse when it allows that; True if kept. Never raises."""
        try:
            entry = _entry_from(answer)
        except Exception:
            log.exception("definition cache store failed", extra={"action": "cache.error"})
            return False
        if entry is None or not self.enabled:
            return False
        key = (name, project, str(agent_dir))
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
            self._stores += 1
        return True

    def clear(self) -> None:
        """Forget every definition."""
        with self._lock:
            self._entries.clear()


def _entry_from(answer: Mapping[str, Any]) -> CachedDefinition | None:
    reuse = answer.get("reuse")
    if answer.get("ok") is not True or not isinstance(reuse, Mapping):
        return None
    if reuse.get("cacheable") is not True:
        return None
    try:
        identity = answer["sourceIdentity"]
        files = [_File(str(identity["root"]["path"]), str(identity["root"]["hash"]))]
        files += [_File(str(m["path"]), str(m["hash"])) for m in identity["mounted"]]
        files += [_File(str(m["path"]), str(m["hash"])) for m in reuse["modules"]]
        lookups = tuple(_Lookup(str(d["name"]), str(d["path"])) for d in reuse["discovered"])
        schema = answer["definition"]["inputSchema"]
    except (KeyError, TypeError):
        return None
    if not lookups:
        return None
    check = check_schema(schema) if schema is not None else None
    kept = {key: value for key, value in answer.items() if key not in _PER_REQUEST}
    return CachedDefinition(
        answer=copy.deepcopy(kept), lookups=lookups, files=tuple(files), check=check
    )
