"""Loading workflow files, and the source identity that proves which code a run executes.

Implements workflow-server.md § Runner lifecycle (verify the root and every mounted file
hash before loading, the mounted map after) and workflow-model.md § 2.2: the identity is
`{"root": {...}, "mounted": [...]}` with `sha256:` hashes of the exact bytes executed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pi_workflows.engine._compile import (
    CompiledWorkflow,
    compile_workflow,
    definition_digest,
    definition_snapshot,
)
from pi_workflows.engine._definition import Include, WorkflowDefinition
from pi_workflows.engine._discovery import (
    BUILTINS_DIR,
    WORKFLOW_SUFFIX,
    WorkflowSource,
    command_name,
    find_workflow,
)
from pi_workflows.engine._errors import (
    SourceChangedError,
    WorkflowDefinitionError,
    WorkflowLoadError,
    WorkflowNotFoundError,
)

__all__ = [
    "WORKFLOW_ATTRIBUTE",
    "LoadedWorkflow",
    "MountedSource",
    "SourceFile",
    "SourceIdentity",
    "file_hash",
    "load_source",
    "load_verified",
    "load_workflow",
    "verify_mounted",
    "verify_source",
]

WORKFLOW_ATTRIBUTE = "workflow"
"""The module attribute of a workflow file that holds its `define_workflow(...)` result."""

SourceKind = Literal["file", "builtin"]
_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
_module_numbers = itertools.count(1)


@dataclass(frozen=True, slots=True)
class SourceFile:
    """The root file of a run: `{"kind", "path", "hash"}`."""

    kind: SourceKind
    path: str
    """Absolute, resolved path."""
    hash: str
    """`sha256:<hex>` of the file bytes."""

    def to_wire(self) -> dict[str, Any]:
        """The JSON form."""
        return {"kind": self.kind, "path": self.path, "hash": self.hash}


@dataclass(frozen=True, slots=True)
class MountedSource:
    """An included workflow file: `{"mount", "kind", "path", "hash", "workflow"}`."""

    mount: str
    """The compiled mount path (`child`, `child/grandchild`)."""
    kind: SourceKind
    path: str
    hash: str
    workflow: str
    """The included definition's name."""

    def to_wire(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "mount": self.mount,
            "kind": self.kind,
            "path": self.path,
            "hash": self.hash,
            "workflow": self.workflow,
        }


@dataclass(frozen=True, slots=True)
class SourceIdentity:
    """Which files a run executes: the root and every mounted include, sorted by mount."""

    root: SourceFile
    mounted: tuple[MountedSource, ...]

    def to_wire(self) -> dict[str, Any]:
        """`{"root": {...}, "mounted": [{...}, ...]}`, as stored and sent in launch envelopes."""
        return {"root": self.root.to_wire(), "mounted": [m.to_wire() for m in self.mounted]}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> SourceIdentity:
        """Parse the JSON form.

        Raises:
            ValueError: a missing field, an unknown kind or a malformed hash.
        """
        try:
            root = data["root"]
            parsed_root = SourceFile(
                kind=_kind(root["kind"]), path=_text(root["path"]), hash=_hash(root["hash"])
            )
            mounted = tuple(
                MountedSource(
                    mount=_text(item["mount"]),
                    kind=_kind(item["kind"]),
                    path=_text(item["path"]),
                    hash=_hash(item["hash"]),
                    workflow=_text(item["workflow"]),
                )
                for item in data["mounted"]
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed source identity: {exc!r}") from None
        return cls(root=parsed_root, mounted=mounted)


def _kind(value: object) -> SourceKind:
    if value == "file":
        return "file"
    if value == "builtin":
        return "builtin"
    raise ValueError(f"source kind must be 'file' or 'builtin', got {value!r}")


def _text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def _hash(value: object) -> str:
    if not isinstance(value, str) or not _HASH.match(value):
        raise ValueError(f"expected a 'sha256:<hex>' hash, got {value!r}")
    return value


@dataclass(frozen=True, slots=True, eq=False)
class LoadedWorkflow:
    """A loaded root workflow: definition, compiled graph, identity, snapshot and digest."""

    path: Path
    command_name: str | None
    """The file stem (`None` if the file name does not follow `NAME.workflow.py`)."""
    definition: WorkflowDefinition
    compiled: CompiledWorkflow
    identity: SourceIdentity
    snapshot: dict[str, Any]
    """`definition_snapshot(compiled)`; treat as read-only."""
    digest: str
    """`definition_digest`: sha256 of the snapshot's canonical JSON."""
    discovered: tuple[tuple[str, str], ...] = ()
    """Every include found by name, as (command name, resolved path), in load order:
    a new file that would shadow one of them changes what this load would find."""


def file_hash(path: Path | str) -> str:
    """Return `sha256:<hex>` of the file's bytes."""
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _source_kind(path: Path) -> SourceKind:
    return "builtin" if path.is_relative_to(BUILTINS_DIR) else "file"


def _module_name(path: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9_]", "_", path.name.removesuffix(WORKFLOW_SUFFIX))
    return f"_piw_workflow_{next(_module_numbers)}_{stem}"


def _exec_module(path: Path, data: bytes) -> ModuleType:
    """Execute exactly `data` (the hashed bytes) as a fresh module named uniquely.

    The module is in `sys.modules` only while it executes (dataclasses and pickling look
    it up there), so two loads never share or leak module state.
    """
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None:
        raise WorkflowLoadError(str(path), "cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        code = compile(data, str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise WorkflowLoadError(str(path), f"syntax error at line {exc.lineno}: {exc.msg}") from exc
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)  # noqa: S102 - executing the verified workflow file is the point
    except WorkflowDefinitionError as exc:
        raise WorkflowLoadError(str(path), str(exc)) from exc
    except (Exception, SystemExit) as exc:
        detail = str(exc).strip()
        raise WorkflowLoadError(
            str(path), f"raised {type(exc).__name__}" + (f": {detail}" if detail else "")
        ) from exc
    finally:
        sys.modules.pop(name, None)
    return module


def _definition_from(path: Path, data: bytes) -> WorkflowDefinition:
    module = _exec_module(path, data)
    definition = getattr(module, WORKFLOW_ATTRIBUTE, None)
    if definition is None:
        raise WorkflowLoadError(
            str(path),
            f"has no module attribute {WORKFLOW_ATTRIBUTE!r}; assign "
            "`workflow = define_workflow(...)`",
        )
    if not isinstance(definition, WorkflowDefinition):
        raise WorkflowLoadError(
            str(path),
            f"`{WORKFLOW_ATTRIBUTE}` is a {type(definition).__name__}, not a "
            "define_workflow(...) result",
        )
    return definition


def _read(path: Path, expected_hash: str | None, *, mount: str | None = None) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        if expected_hash is not None:
            raise SourceChangedError(
                f"{path} can no longer be read ({exc.strerror})", path=str(path), mount=mount
            ) from None
        raise WorkflowLoadError(str(path), f"cannot be read ({exc.strerror})") from None
    if expected_hash is not None:
        found = "sha256:" + hashlib.sha256(data).hexdigest()
        if found != expected_hash:
            raise SourceChangedError(
                f"{path} changed since the run started (saved {expected_hash}, now {found})",
                path=str(path),
                mount=mount,
            )
    return data


def load_workflow(
    path: Path | str,
    *,
    project: Path | None = None,
    agent_dir: Path | None = None,
    expected: SourceIdentity | Mapping[str, Any] | None = None,
) -> LoadedWorkflow:
    """Load a workflow file and every include it mounts, and build its identity.

    Args:
        path: the root `NAME.workflow.py`.
        project, agent_dir: where includes by name are discovered.
        expected: a saved identity; every file is then checked against its saved hash
            before its bytes execute (and a mount absent from it is refused).

    Raises:
        WorkflowLoadError: a file raised on import, has no `workflow`, or is not readable.
        WorkflowDefinitionError: composition is invalid (unknown include, cycle, exits).
        SourceChangedError: with `expected`, a file differs from its saved hash.
    """
    root_path = Path(path).resolve()
    saved = SourceIdentity.from_wire(expected) if isinstance(expected, Mapping) else expected
    saved_mounted = {m.mount: m for m in saved.mounted} if saved is not None else {}
    if saved is not None and saved.root.path != str(root_path):
        raise SourceChangedError(
            f"the saved root is {saved.root.path}, not {root_path}", path=str(root_path)
        )
    data = _read(root_path, saved.root.hash if saved is not None else None)
    root_hash = "sha256:" + hashlib.sha256(data).hexdigest()
    definition = _definition_from(root_path, data)

    files: dict[tuple[str, ...], Path] = {(): root_path}
    mounted: list[MountedSource] = []
    discovered: list[tuple[str, str]] = []

    def resolve(
        include: Include, mount_path: tuple[str, ...], parent: WorkflowDefinition
    ) -> WorkflowDefinition:
        mount_id = "/".join(mount_path)
        parent_file = files[mount_path[:-1]]
        ref = include.workflow
        if isinstance(ref, WorkflowDefinition):
            source = Path(ref.source_path).resolve() if ref.source_path else parent_file
            files[mount_path] = source
            if ref.source_path:
                mounted.append(
                    MountedSource(
                        mount=mount_id,
                        kind=_source_kind(source),
                        path=str(source),
                        hash=file_hash(source),
                        workflow=ref.name,
                    )
                )
            return ref
        child_path = _include_path(
            ref,
            parent_file=parent_file,
            parent=parent,
            mount_path=mount_path,
            project=project,
            agent_dir=agent_dir,
            discovered=discovered,
        )
        ancestors = [files[mount_path[:i]] for i in range(len(mount_path))]
        if child_path in ancestors:
            chain = " → ".join(str(p) for p in [*ancestors, child_path])
            raise WorkflowDefinitionError(
                f"includes form a cycle ({chain}); break the cycle",
                workflow=parent.name,
                node=mount_path[-1],
            )
        expected_hash: str | None = None
        if saved is not None:
            saved_mount = saved_mounted.get(mount_id)
            if saved_mount is None or saved_mount.path != str(child_path):
                raise SourceChangedError(
                    f"mount {mount_id!r} now resolves to {child_path}, which the saved "
                    "source identity does not list",
                    path=str(child_path),
                    mount=mount_id,
                )
            expected_hash = saved_mount.hash
        child_data = _read(child_path, expected_hash, mount=mount_id)
        child = _definition_from(child_path, child_data)
        files[mount_path] = child_path
        mounted.append(
            MountedSource(
                mount=mount_id,
                kind=_source_kind(child_path),
                path=str(child_path),
                hash="sha256:" + hashlib.sha256(child_data).hexdigest(),
                workflow=child.name,
            )
        )
        return child

    compiled = compile_workflow(definition, resolve)
    identity = SourceIdentity(
        root=SourceFile(kind=_source_kind(root_path), path=str(root_path), hash=root_hash),
        mounted=tuple(sorted(mounted, key=lambda m: m.mount)),
    )
    snapshot = definition_snapshot(compiled)
    return LoadedWorkflow(
        path=root_path,
        command_name=command_name(root_path),
        definition=definition,
        compiled=compiled,
        identity=identity,
        snapshot=snapshot,
        digest=definition_digest(snapshot),
        discovered=tuple(discovered),
    )


def _include_path(
    ref: str,
    *,
    parent_file: Path,
    parent: WorkflowDefinition,
    mount_path: tuple[str, ...],
    project: Path | None,
    agent_dir: Path | None,
    discovered: list[tuple[str, str]],
) -> Path:
    if "/" in ref or "\\" in ref or ref.endswith(WORKFLOW_SUFFIX):
        if _source_kind(parent_file) == "builtin":
            raise WorkflowDefinitionError(
                f"a built-in cannot include {ref!r} by path; include it by name",
                workflow=parent.name,
                node=mount_path[-1],
            )
        return (parent_file.parent / ref).resolve()
    try:
        found = find_workflow(ref, project, agent_dir).path
    except WorkflowNotFoundError as exc:
        raise WorkflowDefinitionError(
            f"includes {exc}", workflow=parent.name, node=mount_path[-1]
        ) from None
    discovered.append((ref, str(found)))
    return found


def load_source(
    source: WorkflowSource, *, project: Path | None = None, agent_dir: Path | None = None
) -> LoadedWorkflow:
    """Load a discovered workflow (see `load_workflow`)."""
    return load_workflow(source.path, project=project, agent_dir=agent_dir)


def verify_source(identity: SourceIdentity | Mapping[str, Any]) -> None:
    """Check every file of a saved identity against its hash, before any module loads.

    Raises:
        SourceChangedError: a file is missing, unreadable or has other bytes; the
            reason names the file (and the mount).
    """
    saved = SourceIdentity.from_wire(identity) if isinstance(identity, Mapping) else identity
    _read(Path(saved.root.path), saved.root.hash)
    for item in saved.mounted:
        _read(Path(item.path), item.hash, mount=item.mount)


def verify_mounted(identity: SourceIdentity | Mapping[str, Any], loaded: LoadedWorkflow) -> None:
    """Check, after loading, that the loaded root and mounted map equal the saved ones.

    Raises:
        SourceChangedError: naming every added, removed or changed mount.
    """
    saved = SourceIdentity.from_wire(identity) if isinstance(identity, Mapping) else identity
    if saved.root != loaded.identity.root:
        raise SourceChangedError(
            f"the root workflow changed: saved {saved.root.path} {saved.root.hash}, loaded "
            f"{loaded.identity.root.path} {loaded.identity.root.hash}",
            path=loaded.identity.root.path,
        )
    before = {m.mount: m for m in saved.mounted}
    after = {m.mount: m for m in loaded.identity.mounted}
    if before == after:
        return
    changed = sorted(m for m in before.keys() & after.keys() if before[m] != after[m])
    problems = [f"added {m!r}" for m in sorted(after.keys() - before.keys())]
    problems += [f"removed {m!r}" for m in sorted(before.keys() - after.keys())]
    problems += [f"changed {m!r} ({before[m].path} → {after[m].path})" for m in changed]
    first = sorted((before.keys() ^ after.keys()) | set(changed))
    raise SourceChangedError(
        "the mounted workflows changed: " + ", ".join(problems), mount=first[0]
    )


def load_verified(
    identity: SourceIdentity | Mapping[str, Any],
    *,
    project: Path | None = None,
    agent_dir: Path | None = None,
) -> LoadedWorkflow:
    """What a runner does: verify every saved hash, load with the hashes enforced, then
    check the mounted map. Changed code never executes.

    Raises:
        SourceChangedError: park the run with `workflowSourceChanged`.
    """
    saved = SourceIdentity.from_wire(identity) if isinstance(identity, Mapping) else identity
    verify_source(saved)
    loaded = load_workflow(saved.root.path, project=project, agent_dir=agent_dir, expected=saved)
    verify_mounted(saved, loaded)
    return loaded
