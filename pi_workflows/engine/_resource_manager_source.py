"""Resource-manager files: discovery, loading with a source digest, and `apply` resolution.

`resolve_manager_for_apply` (run only in a child: it executes manager code) checks
discovery, the exported `resource_manager`, the spec and `initial_status(spec)`; the server
re-checks its proposal with `verify_manager_source`, which reads bytes but runs no code.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pi_workflows._paths import agent_dir as default_agent_dir
from pi_workflows.engine._discovery import first_found
from pi_workflows.engine._errors import (
    InitialStatusError,
    ManagerSourceChangedError,
    ResourceManagerDefinitionError,
    ResourceManagerError,
    ResourceManagerLoadError,
    ResourceManagerNotFoundError,
    SpecInvalidError,
    WorkflowLoadError,
)
from pi_workflows.engine._loader import _exec_module
from pi_workflows.engine._resource_manager import (
    MANAGER_NAME_PATTERN,
    MAX_SPEC_BYTES,
    MAX_STATUS_BYTES,
    ResourceManagerDefinition,
)
from pi_workflows.wire.canonical import CanonicalJSONError, dumps, loads, sha256_digest

__all__ = [
    "RESOURCE_MANAGER_ATTRIBUTE",
    "RESOURCE_MANAGER_SUFFIX",
    "ApplyProposal",
    "LoadedManager",
    "ManagerSource",
    "ManagerSourceRef",
    "apply_answer",
    "check_spec",
    "discover_managers",
    "find_manager",
    "load_manager",
    "manager_name",
    "manager_search_dirs",
    "resolve_manager_for_apply",
    "resolve_manager_source",
    "verify_manager_source",
]

RESOURCE_MANAGER_SUFFIX = ".resource_manager.py"
RESOURCE_MANAGER_ATTRIBUTE = "resource_manager"
"""The module attribute of a manager file that holds its `define_resource_manager(...)`."""

ManagerOrigin = Literal["project", "agent"]

MAX_ANSWER_MESSAGE_CHARS = 1000
"""Longest error message in an `apply_answer` (as the workflow resolver's)."""
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

_NAME = re.compile(MANAGER_NAME_PATTERN)


@dataclass(frozen=True, slots=True)
class ManagerSource:
    """A discovered manager file (found by name; not read)."""

    name: str
    """The manager's name: the file stem without `.resource_manager.py`."""
    path: Path
    """Absolute, resolved path of the file."""
    origin: ManagerOrigin
    """Where it was found: the project wins over the agent directory."""


@dataclass(frozen=True, slots=True)
class ManagerSourceRef:
    """A name resolved to its file and the `sha256:` digest of the file's bytes."""

    name: str
    path: str
    digest: str


@dataclass(frozen=True, slots=True, eq=False)
class LoadedManager:
    """A loaded manager file: its definition and the digest of the exact bytes executed."""

    name: str
    path: str
    digest: str
    definition: ResourceManagerDefinition


@dataclass(frozen=True, slots=True)
class ApplyProposal:
    """What the source resolver proposes for `apply`; the server commits it only after
    `verify_manager_source(project, agent_dir, manager, path, source_digest)` passes."""

    manager: str
    path: str
    """The resolved manager file (private: never logged or shown)."""
    source_digest: str
    """`sha256:<hex>` of the file bytes the resolver executed."""
    spec: Any
    """The spec as canonical JSON decoded (what the server stores)."""
    spec_hash: str
    """`sha256_digest(spec)`: the same spec again is a no-op; another raises generation."""
    initial_status: Any
    """`initial_status(spec)`: the status of a newly created resource."""

    def to_wire(self) -> dict[str, Any]:
        """`{"manager", "path", "sourceDigest", "spec", "specHash", "initialStatus"}`."""
        return {
            "manager": self.manager,
            "path": self.path,
            "sourceDigest": self.source_digest,
            "spec": self.spec,
            "specHash": self.spec_hash,
            "initialStatus": self.initial_status,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ApplyProposal:
        """Parse the JSON form a resolver child sent; the spec hash is recomputed.

        Raises:
            ValueError: a missing or malformed field, or a hash that does not match.
        """
        try:
            manager, path, digest = data["manager"], data["path"], data["sourceDigest"]
            spec, spec_hash, status = data["spec"], data["specHash"], data["initialStatus"]
        except (KeyError, TypeError):
            raise ValueError("malformed apply proposal: a field is missing") from None
        if not isinstance(manager, str) or not _NAME.match(manager):
            raise ValueError("malformed apply proposal: 'manager' is not a manager name")
        if not isinstance(path, str) or not Path(path).is_absolute():
            raise ValueError("malformed apply proposal: 'path' is not an absolute path")
        if not isinstance(digest, str) or not _is_digest(digest):
            raise ValueError("malformed apply proposal: 'sourceDigest' is not a sha256 digest")
        try:
            if sha256_digest(spec) != spec_hash:
                raise ValueError("malformed apply proposal: 'specHash' does not match the spec")
            _check_size(spec, MAX_SPEC_BYTES)
            _check_size(status, MAX_STATUS_BYTES)
        except CanonicalJSONError:
            raise ValueError("malformed apply proposal: a value is not plain JSON") from None
        return cls(manager, path, digest, spec, spec_hash, status)


def _is_digest(text: str) -> bool:
    hex_part = text.removeprefix("sha256:")
    return (
        text.startswith("sha256:")
        and len(hex_part) == 64
        and all(c in "0123456789abcdef" for c in hex_part)
    )


def _check_size(value: Any, limit: int) -> None:
    if len(dumps(value)) > limit:
        raise ValueError(f"malformed apply proposal: a value is over {limit} bytes")


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------
# Discovery


def manager_search_dirs(
    project: Path | None, agent_dir: Path | None = None
) -> list[tuple[ManagerOrigin, Path]]:
    """The folders searched, in precedence order: `<project>/.pi/resource-managers/`,
    then `<agent dir>/resource-managers/` (`None`: `$PI_CODING_AGENT_DIR` or `~/.pi/agent`)."""
    dirs: list[tuple[ManagerOrigin, Path]] = []
    if project is not None:
        dirs.append(("project", Path(project) / ".pi" / "resource-managers"))
    agent = Path(agent_dir) if agent_dir is not None else default_agent_dir()
    dirs.append(("agent", agent / "resource-managers"))
    return dirs


def manager_name(path: Path) -> str | None:
    """The manager name of a file (`review-pr.resource_manager.py` → `review-pr`), or None."""
    file_name = path.name
    if not file_name.endswith(RESOURCE_MANAGER_SUFFIX):
        return None
    stem = file_name[: -len(RESOURCE_MANAGER_SUFFIX)]
    return stem if _NAME.match(stem) else None


def discover_managers(
    project: Path | None, agent_dir: Path | None = None
) -> dict[str, ManagerSource]:
    """Every discovered manager by name, sorted; the project's file wins over the agent
    directory's. Files are not read (the same rules as workflow discovery)."""
    found = first_found(manager_search_dirs(project, agent_dir), manager_name)
    return {
        name: ManagerSource(name=name, path=path, origin=origin)
        for name, (origin, path) in sorted(found.items())
    }


def find_manager(name: str, project: Path | None, agent_dir: Path | None = None) -> ManagerSource:
    """The manager file a name refers to.

    Raises:
        ResourceManagerNotFoundError: listing the names that do exist.
    """
    found = discover_managers(project, agent_dir)
    source = found.get(name)
    if source is None:
        raise ResourceManagerNotFoundError(name, sorted(found))
    return source


def _first_candidate(name: str, project: Path | None, agent_dir: Path | None) -> Path | None:
    """What discovery finds for one name, looking only at its candidate files."""
    if manager_name(Path(name + RESOURCE_MANAGER_SUFFIX)) != name:
        return None
    for _, folder in manager_search_dirs(project, agent_dir):
        candidate = folder / (name + RESOURCE_MANAGER_SUFFIX)
        try:
            if candidate.is_file():
                return candidate.resolve()
        except OSError:
            continue
    return None


def _read(name: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ResourceManagerLoadError(
            f"resource manager {name!r}: its file cannot be read ({exc.strerror})"
        ) from None


def resolve_manager_source(
    name: str, project: Path | None, agent_dir: Path | None = None
) -> ManagerSourceRef:
    """Resolve a name to its file and the digest of its bytes (runs no code).

    Raises:
        ResourceManagerNotFoundError: no manager has this name.
        ResourceManagerLoadError: the file cannot be read.
    """
    source = find_manager(name, project, agent_dir)
    return ManagerSourceRef(name, str(source.path), _digest(_read(name, source.path)))


def verify_manager_source(
    project: Path | None, agent_dir: Path | None, name: str, path: str, digest: str
) -> None:
    """The server's check before it commits a proposal: discovery still finds `path` for
    `name` (no new file shadows it, it was not removed) and its bytes still have `digest`.
    Reads at most one directory entry per search folder and one file; runs no code.

    Raises:
        ManagerSourceChangedError: with a path-free reason.
    """
    found = _first_candidate(name, project, agent_dir)
    if found is None:
        raise ManagerSourceChangedError(
            f"resource manager {name!r}: its file is no longer discovered; apply again"
        )
    if str(found) != path:
        raise ManagerSourceChangedError(
            f"resource manager {name!r}: discovery now finds another file; apply again"
        )
    try:
        data = found.read_bytes()
    except OSError:
        raise ManagerSourceChangedError(
            f"resource manager {name!r}: its file can no longer be read; apply again"
        ) from None
    if _digest(data) != digest:
        raise ManagerSourceChangedError(
            f"resource manager {name!r}: its file changed since it was resolved; apply again"
        )


# ---------------------------------------------------------------------------
# Loading and resolution (these execute manager code: call them only in a child)


def load_manager(
    name: str, path: Path | str, *, expected_digest: str | None = None
) -> LoadedManager:
    """Execute a manager file's exact bytes and return its checked definition.

    Args:
        name: the manager name the file was discovered under.
        path: the file.
        expected_digest: a saved digest (a resource runner's launch): other bytes never run.

    Raises:
        ResourceManagerLoadError: unreadable, raised on import (reported by type; the
            traceback stays in the child's log), no or a wrong `resource_manager`, or a
            definition whose name is not the file's.
        ManagerSourceChangedError: with `expected_digest`, the bytes differ.
    """
    file_path = Path(path).resolve()
    data = _read(name, file_path)
    digest = _digest(data)
    if expected_digest is not None and digest != expected_digest:
        raise ManagerSourceChangedError(
            f"resource manager {name!r}: its file changed since it was applied; apply again"
        )
    what = f"resource manager {name!r}"
    try:
        module = _exec_module(file_path, data)
    except WorkflowLoadError as exc:
        raise ResourceManagerLoadError(f"{what}: {_load_problem(exc)}") from exc
    definition = getattr(module, RESOURCE_MANAGER_ATTRIBUTE, None)
    if definition is None:
        raise ResourceManagerLoadError(
            f"{what}: the file has no module attribute {RESOURCE_MANAGER_ATTRIBUTE!r}; assign "
            "`resource_manager = define_resource_manager(...)`"
        )
    if not isinstance(definition, ResourceManagerDefinition):
        raise ResourceManagerLoadError(
            f"{what}: `{RESOURCE_MANAGER_ATTRIBUTE}` is a {type(definition).__name__}, not a "
            "define_resource_manager(...) result"
        )
    if definition.name != name:
        raise ResourceManagerLoadError(
            f"{what}: the file defines {definition.name!r}; a manager's name must equal its "
            "file name (rename one of them)"
        )
    return LoadedManager(name=name, path=str(file_path), digest=digest, definition=definition)


def _load_problem(exc: WorkflowLoadError) -> str:
    """The load failure without a path: the definition's own message, a syntax error's
    line, or the exception's type (its text may name files or data)."""
    cause = exc.__cause__
    if isinstance(cause, ResourceManagerDefinitionError):
        return str(cause)
    if isinstance(cause, SyntaxError):
        return f"syntax error at line {cause.lineno}: {cause.msg}"
    if cause is not None:
        return f"the file raised {type(cause).__name__} while it was imported"
    return "the file cannot be loaded as a Python module"


def check_spec(definition: ResourceManagerDefinition, spec: Any) -> tuple[Any, str]:
    """Check a spec: plain JSON, at most MAX_SPEC_BYTES, then `spec_schema`.

    Returns:
        (the spec decoded from its canonical JSON, `sha256_digest` of it).

    Raises:
        SpecInvalidError: naming the failing place and rule, never the value.
    """
    what = f"spec of resource manager {definition.name!r}"
    try:
        data = dumps(spec)
    except CanonicalJSONError as exc:
        raise SpecInvalidError(f"{what} is not plain JSON: {exc}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecInvalidError(f"{what} is {len(data)} bytes of JSON; at most {MAX_SPEC_BYTES}")
    value = loads(data)
    validator = definition.spec_validator
    if validator is not None:
        violation = validator.first_violation(value)
        if violation is not None:
            raise SpecInvalidError(
                f"{what} is invalid {violation.describe('the whole spec')}", violation=violation
            )
    return value, "sha256:" + hashlib.sha256(data).hexdigest()


def _initial_status(definition: ResourceManagerDefinition, spec_json: bytes) -> Any:
    what = f"resource manager {definition.name!r}: initial_status(spec)"
    try:
        status = definition.initial_status(loads(spec_json))  # a copy: it may mutate its own
    except ResourceManagerError as exc:
        raise InitialStatusError(f"{what} refused the spec: {exc}") from exc
    except Exception as exc:  # author code: reported by type, its text may quote the spec
        raise InitialStatusError(f"{what} raised {type(exc).__name__}") from exc
    try:
        data = dumps(status)
    except CanonicalJSONError as exc:
        raise InitialStatusError(f"{what} returned a value that is not plain JSON: {exc}") from None
    if len(data) > MAX_STATUS_BYTES:
        raise InitialStatusError(
            f"{what} returned {len(data)} bytes of JSON; at most {MAX_STATUS_BYTES}"
        )
    return loads(data)


def resolve_manager_for_apply(
    project: Path | None, agent_dir: Path | None, name: str, spec: Any
) -> ApplyProposal:
    """What the source resolver child runs for `apply`: discover, load, check the spec,
    compute `initial_status(spec)`, and report the source digest. Data in, data out.

    Runs manager code (module import, `initial_status`): call it only in a child process.

    Raises:
        ResourceManagerNotFoundError: no manager has this name (`resourceManagerNotFound`).
        ResourceManagerLoadError: the file does not load or export a valid manager
            (`definitionInvalid`).
        SpecInvalidError: the spec is not plain JSON, too big, or fails `spec_schema`
            (`specInvalid`).
        InitialStatusError: `initial_status` raised or returned bad JSON (`initialStatusInvalid`).
    """
    source = find_manager(name, project, agent_dir)
    loaded = load_manager(name, source.path)
    value, spec_hash = check_spec(loaded.definition, spec)
    status = _initial_status(loaded.definition, dumps(value))
    return ApplyProposal(
        manager=name,
        path=loaded.path,
        source_digest=loaded.digest,
        spec=value,
        spec_hash=spec_hash,
        initial_status=status,
    )


def apply_answer(
    project: Path | None, agent_dir: Path | None, name: str, spec: Any
) -> dict[str, Any]:
    """The source resolver child's one response for `apply` (never raises for a bad
    manager, spec or status)::

        {"ok": true, "manager", "path", "sourceDigest", "spec", "specHash", "initialStatus"}
        {"ok": false, "code": "resourceManagerNotFound" | "definitionInvalid" |
         "specInvalid" | "initialStatusInvalid", "message": bounded, path-free text}

    Runs manager code: call it only in a child process.
    """
    try:
        proposal = resolve_manager_for_apply(project, agent_dir, name, spec)
    except ResourceManagerError as exc:
        message = _UNSAFE.sub(" ", str(exc)).strip()
        if len(message) > MAX_ANSWER_MESSAGE_CHARS:
            message = message[: MAX_ANSWER_MESSAGE_CHARS - 1] + "…"
        return {"ok": False, "code": exc.code, "message": message}
    return {"ok": True, **proposal.to_wire()}
