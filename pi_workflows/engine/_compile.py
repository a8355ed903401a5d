"""Compiling a definition with its includes into one flat graph, and its snapshot.

Implements workflow-model.md § 6 (compiled naming `mount/child`, entry node = the mount
path, exit nodes `mount/__piw_exit_<exit>`) and § 2.4 (the definition snapshot, digested
with canonical JSON per python-port.md decision 1), plus input checks (decision 5).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from pi_workflows.engine._context import NodeContext
from pi_workflows.engine._definition import (
    DEFAULT_NODE_TIMEOUT,
    EXIT_NODE_PREFIX,
    CheckpointNode,
    Edge,
    Include,
    Node,
    NotifyNode,
    ShellNode,
    Switch,
    WorkflowDefinition,
)
from pi_workflows.engine._errors import InputInvalidError, WorkflowDefinitionError
from pi_workflows.engine._keys import compiled_node_path
from pi_workflows.wire.canonical import CanonicalJSONError, dumps, sha256_digest

__all__ = [
    "DEFINITION_SNAPSHOT_SCHEMA",
    "INCLUDE_ENTRY_SCHEMA",
    "MAX_INCLUDE_DEPTH",
    "CompiledMount",
    "CompiledNode",
    "CompiledWorkflow",
    "IncludeResolver",
    "compile_workflow",
    "definition_digest",
    "definition_snapshot",
    "include_entry_output",
    "include_exit_output",
    "project_scope",
    "validate_input",
]

DEFINITION_SNAPSHOT_SCHEMA = "pi-workflows.definition-snapshot.v1"
INCLUDE_ENTRY_SCHEMA = "pi-workflows.include-entry.v1"
MAX_INCLUDE_DEPTH = 16
"""Deepest nesting of includes; deeper (or cyclic) composition is refused."""

IncludeResolver: TypeAlias = Callable[
    [Include, tuple[str, ...], WorkflowDefinition], WorkflowDefinition
]
"""`resolve(include, mount_path, parent) -> child definition`; the loader resolves names."""

_ENTRY_TIMEOUT_MS = round(DEFAULT_NODE_TIMEOUT * 1000)


@dataclass(frozen=True, slots=True, eq=False)
class CompiledMount:
    """One include in the compiled graph."""

    path: str
    """The compiled mount path, e.g. `m` or `m/n`; also the id of its entry node."""
    mount_path: tuple[str, ...]
    workflow: WorkflowDefinition
    """The child definition."""
    include: Include
    start: str
    """Compiled path of the child's first node."""
    exits: Mapping[str, str]
    """Exit name → compiled exit node path (`m/__piw_exit_<exit>`)."""


@dataclass(frozen=True, slots=True, eq=False)
class CompiledNode:
    """One node of the flat compiled graph.

    Authored nodes carry `node` (the `compute(...)`, `action(...)`, … object holding the
    callbacks). Include entry and exit nodes are synthetic computes: `node` is `None`,
    `include_transition` is `entry` or `exit`, and `mount` names their include.
    """

    path: str
    """Compiled id (`mount/child/node`); key of `CompiledWorkflow.nodes`."""
    kind: Literal["compute", "action", "shell", "checkpoint", "notify"]
    node: Node | None
    mount_path: tuple[str, ...]
    """The include scope whose state the node's context sees (`()` for the root)."""
    local_id: str
    """The id inside its own workflow."""
    timeout_ms: int | None
    include_transition: Literal["entry", "exit"] | None = None
    mount: CompiledMount | None = None
    exit_name: str | None = None

    @property
    def scope(self) -> str:
        """The scope as a compiled mount path (`""` for the root)."""
        return "/".join(self.mount_path)


@dataclass(frozen=True, slots=True, eq=False)
class CompiledWorkflow:
    """A root definition and all its includes as one flat graph that routing and runners use."""

    definition: WorkflowDefinition
    start_at: str
    nodes: Mapping[str, CompiledNode]
    outgoing: Mapping[str, Edge]
    """Compiled edge by compiled source path."""
    mounts: Mapping[str, CompiledMount] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def name(self) -> str:
        """The root workflow's name."""
        return self.definition.name

    @property
    def max_steps(self) -> int:
        """The root's step limit (each mount's child `max_steps` bounds one invocation)."""
        return self.definition.max_steps


def compile_workflow(
    definition: WorkflowDefinition | CompiledWorkflow, resolve: IncludeResolver | None = None
) -> CompiledWorkflow:
    """Flatten `definition` and its includes into one graph with `mount/child` paths.

    Args:
        definition: the root definition (a compiled workflow is returned as is).
        resolve: called for every include; without it, definition objects are used
            directly and a name reference raises.

    Raises:
        WorkflowDefinitionError: a child without exits, a terminal child node that is no
            exit, an unknown exit, or composition deeper than MAX_INCLUDE_DEPTH or cyclic.
    """
    if isinstance(definition, CompiledWorkflow):
        return definition
    nodes: dict[str, CompiledNode] = {}
    outgoing: dict[str, Edge] = {}
    mounts: dict[str, CompiledMount] = {}
    _compile_into(
        definition,
        prefix=(),
        nodes=nodes,
        outgoing=outgoing,
        mounts=mounts,
        resolve=resolve,
        chain=(definition,),
    )
    return CompiledWorkflow(
        definition=definition,
        start_at=_target((), definition.start_at),
        nodes=MappingProxyType(nodes),
        outgoing=MappingProxyType(dict(sorted(outgoing.items()))),
        mounts=MappingProxyType(mounts),
    )


def _target(prefix: tuple[str, ...], local: str) -> str:
    # A mount's entry node has the mount path itself as its id, so both cases coincide.
    return compiled_node_path(prefix, local)


def _source(prefix: tuple[str, ...], local: str) -> str:
    mount, dot, exit_name = local.partition(".")
    if dot:
        return compiled_node_path((*prefix, mount), EXIT_NODE_PREFIX + exit_name)
    return compiled_node_path(prefix, local)


def _compile_into(
    definition: WorkflowDefinition,
    *,
    prefix: tuple[str, ...],
    nodes: dict[str, CompiledNode],
    outgoing: dict[str, Edge],
    mounts: dict[str, CompiledMount],
    resolve: IncludeResolver | None,
    chain: tuple[WorkflowDefinition, ...],
) -> None:
    for local_id, node in definition.nodes.items():
        path = compiled_node_path(prefix, local_id)
        nodes[path] = CompiledNode(
            path=path,
            kind=node.kind,
            node=node,
            mount_path=prefix,
            local_id=local_id,
            timeout_ms=node.timeout_ms,
        )
    for edge in definition.edges:
        source = _source(prefix, edge.source)
        switch = edge.switch
        outgoing[source] = Edge(
            source=source,
            target=None if edge.target is None else _target(prefix, edge.target),
            switch=None
            if switch is None
            else Switch(
                on=switch.on,
                cases=MappingProxyType({k: _target(prefix, v) for k, v in switch.cases.items()}),
                default=None if switch.default is None else _target(prefix, switch.default),
            ),
        )
    for mount_name, include in definition.includes.items():
        mount_path = (*prefix, mount_name)
        mount_id = "/".join(mount_path)
        child = _resolve_child(definition, include, mount_path, resolve)
        if len(mount_path) > MAX_INCLUDE_DEPTH or any(child is seen for seen in chain):
            names = " → ".join([*(d.name for d in chain), child.name])
            raise WorkflowDefinitionError(
                f"includes nest deeper than {MAX_INCLUDE_DEPTH} or form a cycle ({names}); "
                "break the cycle",
                workflow=definition.name,
                node=mount_name,
            )
        _check_child(definition, mount_name, child)
        exits = {
            name: compiled_node_path(mount_path, EXIT_NODE_PREFIX + name) for name in child.exits
        }
        mount = CompiledMount(
            path=mount_id,
            mount_path=mount_path,
            workflow=child,
            include=include,
            start=_target(mount_path, child.start_at),
            exits=MappingProxyType(exits),
        )
        mounts[mount_id] = mount
        nodes[mount_id] = CompiledNode(
            path=mount_id,
            kind="compute",
            node=None,
            mount_path=prefix,
            local_id=mount_name,
            timeout_ms=_ENTRY_TIMEOUT_MS,
            include_transition="entry",
            mount=mount,
        )
        outgoing[mount_id] = Edge(source=mount_id, target=mount.start, switch=None)
        _compile_into(
            child,
            prefix=mount_path,
            nodes=nodes,
            outgoing=outgoing,
            mounts=mounts,
            resolve=resolve,
            chain=(*chain, child),
        )
        for exit_name, exit_path in exits.items():
            nodes[exit_path] = CompiledNode(
                path=exit_path,
                kind="compute",
                node=None,
                mount_path=mount_path,
                local_id=EXIT_NODE_PREFIX + exit_name,
                timeout_ms=_ENTRY_TIMEOUT_MS,
                include_transition="exit",
                mount=mount,
                exit_name=exit_name,
            )
            source = compiled_node_path(mount_path, child.exits[exit_name].source)
            outgoing[source] = Edge(source=source, target=exit_path, switch=None)


def _resolve_child(
    parent: WorkflowDefinition,
    include: Include,
    mount_path: tuple[str, ...],
    resolve: IncludeResolver | None,
) -> WorkflowDefinition:
    if resolve is not None:
        return resolve(include, mount_path, parent)
    if isinstance(include.workflow, WorkflowDefinition):
        return include.workflow
    raise WorkflowDefinitionError(
        f"includes workflow {include.workflow!r} by name; load the root with "
        "load_workflow(...) so names resolve through discovery",
        workflow=parent.name,
        node=mount_path[-1],
    )


def _check_child(parent: WorkflowDefinition, mount: str, child: WorkflowDefinition) -> None:
    if not child.exits:
        raise WorkflowDefinitionError(
            f"includes workflow {child.name!r}, which declares no exits; add "
            "exits={'done': {'from': '<terminal node>'}} to it",
            workflow=parent.name,
            node=mount,
        )
    exit_sources = {e.source for e in child.exits.values()}
    for node_id in child.nodes:
        if node_id not in child.outgoing and node_id not in exit_sources:
            raise WorkflowDefinitionError(
                f"is a terminal node of included workflow {child.name!r} (mounted at "
                f"{mount!r}) but no exit leaves from it; add an exit or an edge",
                workflow=child.name,
                node=node_id,
            )
    for source in parent.outgoing:
        owner, dot, exit_name = source.partition(".")
        if dot and owner == mount and exit_name not in child.exits:
            raise WorkflowDefinitionError(
                f"names exit {exit_name!r}, but workflow {child.name!r} mounted at {mount!r} "
                f"has exits {sorted(child.exits)}",
                workflow=parent.name,
                node=source,
            )


# ---------------------------------------------------------------------------
# Snapshot


def definition_snapshot(workflow: WorkflowDefinition | CompiledWorkflow) -> dict[str, Any]:
    """Return the canonical-JSON-able snapshot viewers and the server use (no callbacks).

    Shape (schema `pi-workflows.definition-snapshot.v1`)::

        {"schema", "name", "startAt", "maxSteps", "inputSchema": schema | null,
         "exits": {exit: node},
         "nodes": {path: {"kind", "timeoutMs": ms | null, "mountPath": [...],
                          "localNodeId", + "maxOutputBytes" (shell), "summary" and
                          "answerSchema" (checkpoint, when static / given), "notifyKind"
                          (notify), "includeTransition", "mount", "exit" (synthetic)}},
         "edges": [{"from", "to"} | {"from", "switch": {"on", "cases", "default"?}}],
         "mounts": {path: {"mountPath", "workflow", "entry", "startAt", "exits",
                           "maxSteps", "inputSchema"}}}
    """
    compiled = compile_workflow(workflow)
    root = compiled.definition
    return {
        "schema": DEFINITION_SNAPSHOT_SCHEMA,
        "name": root.name,
        "startAt": compiled.start_at,
        "maxSteps": root.max_steps,
        "inputSchema": root.input_schema,
        "exits": {name: e.source for name, e in root.exits.items()},
        "nodes": {path: _node_snapshot(n) for path, n in sorted(compiled.nodes.items())},
        "edges": [edge.to_wire() for edge in compiled.outgoing.values()],
        "mounts": {
            path: {
                "mountPath": list(m.mount_path),
                "workflow": m.workflow.name,
                "entry": m.path,
                "startAt": m.start,
                "exits": dict(m.exits),
                "maxSteps": m.workflow.max_steps,
                "inputSchema": m.workflow.input_schema,
            }
            for path, m in sorted(compiled.mounts.items())
        },
    }


def _node_snapshot(compiled: CompiledNode) -> dict[str, Any]:
    snap: dict[str, Any] = {
        "kind": compiled.kind,
        "timeoutMs": compiled.timeout_ms,
        "mountPath": list(compiled.mount_path),
        "localNodeId": compiled.local_id,
    }
    node = compiled.node
    if isinstance(node, ShellNode):
        snap["maxOutputBytes"] = node.max_output_bytes
    elif isinstance(node, CheckpointNode):
        if isinstance(node.summary, str):
            snap["summary"] = node.summary
        if node.input_schema_json is not None:
            snap["answerSchema"] = node.input_schema
    elif isinstance(node, NotifyNode):
        snap["notifyKind"] = node.notify_kind
    if compiled.include_transition is not None:
        assert compiled.mount is not None
        snap["includeTransition"] = compiled.include_transition
        snap["mount"] = compiled.mount.path
        if compiled.exit_name is not None:
            snap["exit"] = compiled.exit_name
    return snap


def definition_digest(workflow: WorkflowDefinition | CompiledWorkflow | Mapping[str, Any]) -> str:
    """Return `sha256:<hex>` of the canonical JSON of the snapshot (or of a snapshot given)."""
    if isinstance(workflow, WorkflowDefinition | CompiledWorkflow):
        return sha256_digest(definition_snapshot(workflow))
    return sha256_digest(workflow)


# ---------------------------------------------------------------------------
# Inputs and include transitions


def validate_input(definition: WorkflowDefinition, value: Any) -> Any:
    """Check `value` against the definition's JSON Schema, then its `input` callable.

    Returns:
        The normalised input: what `input(value)` returned, or `value` when it returned
        `None` or there is no callable.

    Raises:
        InputInvalidError: the schema refused it, the callable raised, or the result
            is not plain JSON.
    """
    schema = definition.input_schema
    if schema is not None:
        error = best_match(Draft202012Validator(schema).iter_errors(value))
        if error is not None:
            where = "input" + "".join(f"[{part!r}]" for part in error.absolute_path)
            raise InputInvalidError(f"{where}: {error.message}")
    if definition.input_fn is not None:
        try:
            normalised = definition.input_fn(value)
        except Exception as exc:  # author code: any raise refuses the input
            raise InputInvalidError(_describe(exc)) from exc
        if normalised is not None:
            value = normalised
    try:
        dumps(value)
    except CanonicalJSONError as exc:
        raise InputInvalidError(f"the input is not plain JSON: {exc}") from None
    return value


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return text if text else type(exc).__name__


def include_entry_output(
    node: CompiledNode, parent_ctx: NodeContext, invocation: int
) -> dict[str, Any]:
    """Run an include entry node: map the parent context to the child's checked input.

    Args:
        node: a compiled node with `include_transition == "entry"`.
        parent_ctx: the context of the parent scope (`node.mount_path`).
        invocation: 1 + completed entries of this mount in the run.

    Returns:
        `{"schema": "pi-workflows.include-entry.v1", "invocation": n, "input": child_input}`;
        the runner uses `input` as `ctx.input` for every node inside the mount.
    """
    if node.include_transition != "entry" or node.mount is None:
        raise ValueError(f"{node.path!r} is not an include entry node")
    mapper = node.mount.include.input_fn
    raw = mapper(parent_ctx) if mapper is not None else parent_ctx.input
    return {
        "schema": INCLUDE_ENTRY_SCHEMA,
        "invocation": invocation,
        "input": validate_input(node.mount.workflow, raw),
    }


def include_exit_output(node: CompiledNode, child_ctx: NodeContext) -> dict[str, Any]:
    """Run an include exit node: `{"exit": name, "output": validate(outputs[exit.from])}`.

    The runner records this output both under the exit node and under the mount path
    (`outputs["m"]`), which is how the parent scope reads the child's result.
    """
    if node.include_transition != "exit" or node.mount is None or node.exit_name is None:
        raise ValueError(f"{node.path!r} is not an include exit node")
    exit_spec = node.mount.workflow.exits[node.exit_name]
    output = child_ctx.outputs.get(exit_spec.source)
    if exit_spec.validate_fn is not None:
        validated = exit_spec.validate_fn(output)
        output = output if validated is None else validated
    return {"exit": node.exit_name, "output": output}


def project_scope(values: Mapping[str, Any], scope: str) -> dict[str, Any]:
    """Keep the entries of `values` (keyed by compiled path) that a node in `scope` sees.

    Direct children of the scope, under their local names; engine exit nodes are left
    out. The runner must first drop entries recorded before the scope's latest entry.
    """
    prefix = f"{scope}/" if scope else ""
    local: dict[str, Any] = {}
    for path, value in values.items():
        if not path.startswith(prefix) or path == scope:
            continue
        rest = path[len(prefix) :]
        if "/" in rest or rest.startswith(EXIT_NODE_PREFIX):
            continue
        local[rest] = value
    return local
