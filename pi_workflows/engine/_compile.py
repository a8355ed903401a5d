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

# Loaded with the engine, not on a first refusal: the resolver counts each module first
# imported while a workflow loads and checks its input as one of the workflow's own.
import pi_workflows.wire.schema_errors  # noqa: F401
from pi_workflows.engine._context import EffectHost, EngineContext, NodeContext
from pi_workflows.engine._definition import (
    DEFAULT_NODE_TIMEOUT,
    EXIT_NODE_PREFIX,
    AgentNode,
    CheckpointNode,
    Edge,
    HumanDecisionNode,
    Include,
    Node,
    NotifyNode,
    ShellNode,
    Switch,
    WorkflowDefinition,
)
from pi_workflows.engine._errors import InputInvalidError, WorkflowDefinitionError
from pi_workflows.engine._keys import compiled_node_path
from pi_workflows.engine._limits import Limits
from pi_workflows.wire.canonical import CanonicalJSONError, dumps, sha256_digest
from pi_workflows.wire.schema_check import check_schema_json

__all__ = [
    "DEFINITION_SNAPSHOT_SCHEMA",
    "INCLUDE_ENTRY_SCHEMA",
    "MAX_INCLUDE_DEPTH",
    "CompiledMount",
    "CompiledNode",
    "CompiledWorkflow",
    "IncludeResolver",
    "ScopedState",
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
    kind: Literal["compute", "action", "shell", "checkpoint", "notify", "agent"]
    node: Node | None
    mount_path: tuple[str, ...]
    """The include scope whose state the node's context sees (`()` for the root)."""
    local_id: str
    """The id inside its own workflow."""
    timeout_ms: int | None
    include_transition: Literal["entry", "exit"] | None = None
    mount: CompiledMount | None = None
    exit_name: str | None = None
    limits: Limits | None = None
    """The node's own limits over those of its workflow and of each including one (the
    server default fills what is still unset, in the runner)."""

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
        inherited=definition.limits,
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
    inherited: Limits | None,
) -> None:
    for local_id, node in definition.nodes.items():
        path = compiled_node_path(prefix, local_id)
        own = getattr(node, "limits", None)
        nodes[path] = CompiledNode(
            path=path,
            kind=node.kind,
            node=node,
            mount_path=prefix,
            local_id=local_id,
            timeout_ms=node.timeout_ms,
            limits=_limits_over(own, inherited),
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
        if prefix:
            # Inside an included workflow, leaving a nested include must lead somewhere:
            # an unrouted exit would end the whole run in the middle of its parent.
            for exit_name in child.exits:
                if f"{mount_name}.{exit_name}" not in definition.outgoing:
                    raise WorkflowDefinitionError(
                        f"leaves include {mount_name!r} through exit {exit_name!r} with no edge; "
                        f"add an edge from '{mount_name}.{exit_name}' (an included workflow "
                        "ends only through its own exits)",
                        workflow=definition.name,
                        node=mount_name,
                    )
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
            limits=inherited,
        )
        outgoing[mount_id] = Edge(source=mount_id, target=mount.start, switch=None)
        child_limits = _limits_over(child.limits, inherited)
        _compile_into(
            child,
            prefix=mount_path,
            nodes=nodes,
            outgoing=outgoing,
            mounts=mounts,
            resolve=resolve,
            chain=(*chain, child),
            inherited=child_limits,
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
                limits=child_limits,
            )
            source = compiled_node_path(mount_path, child.exits[exit_name].source)
            outgoing[source] = Edge(source=source, target=exit_path, switch=None)


def _limits_over(own: Limits | None, inherited: Limits | None) -> Limits | None:
    if own is None:
        return inherited
    return own.over(inherited)


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
                          "localNodeId", + "limits" ({"memoryMb", "processes"}, the
                          keys the definitions set, when any), "maxOutputBytes",
                          "idempotent" and "readBack"
                          (shell, the last two only when set), "summary" and
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
    if compiled.limits is not None and not compiled.limits.empty:
        snap["limits"] = compiled.limits.to_wire()
    node = compiled.node
    if isinstance(node, ShellNode):
        snap["maxOutputBytes"] = node.max_output_bytes
        if node.idempotent:
            snap["idempotent"] = True
        if node.read_back is not None:
            snap["readBack"] = True
    elif isinstance(node, CheckpointNode):
        if isinstance(node.summary, str):
            snap["summary"] = node.summary
        if node.input_schema_json is not None:
            snap["answerSchema"] = node.input_schema
    elif isinstance(node, HumanDecisionNode):
        snap.update(_decision_snapshot(node))
    elif isinstance(node, NotifyNode):
        snap["notifyKind"] = node.notify_kind
    elif isinstance(node, AgentNode):
        snap.update(_agent_snapshot(node))
    if compiled.include_transition is not None:
        assert compiled.mount is not None
        snap["includeTransition"] = compiled.include_transition
        snap["mount"] = compiled.mount.path
        if compiled.exit_name is not None:
            snap["exit"] = compiled.exit_name
    return snap


def _decision_snapshot(node: HumanDecisionNode) -> dict[str, Any]:
    # What the server needs to present and check answers without workflow code.
    snap: dict[str, Any] = {"protected": True, "audience": node.audience}
    if isinstance(node.summary, str):
        snap["summary"] = node.summary
    if node.choices:
        snap["choices"] = [c.to_wire() for c in node.choices]
    if node.answer_schema_json is not None:
        snap["answerSchema"] = node.answer_schema
    if node.timeout_after_ms is not None:
        snap["onTimeout"] = {"afterMs": node.timeout_after_ms, "defaultAnswer": node.default_answer}
    return snap


def _agent_snapshot(node: AgentNode) -> dict[str, Any]:
    # The prompt is private (never in the snapshot); the schema is the tool's contract.
    snap: dict[str, Any] = {"validate": node.validate is not None}
    if node.visible:
        # An assistant-message step: it needs an origin Pi session (`headlessVisibleStep`).
        snap["visible"] = True
        if node.max_chars is not None:
            snap["maxChars"] = node.max_chars
    if node.output_schema_json is not None:
        snap["outputSchema"] = node.output_schema
    for key, value in (
        ("tools", node.tools),
        ("model", node.model),
        ("provider", node.provider),
        ("thinking", node.thinking),
    ):
        if value is not None:
            snap[key] = list(value) if isinstance(value, tuple) else value
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
    schema_json = definition.input_schema_json
    if schema_json is not None:
        # plain=False: the value may come from author code (an include's input mapper)
        violation = check_schema_json(schema_json).first_violation(value, plain=False)
        if violation is not None:
            raise InputInvalidError.from_violation(violation)
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
    """The refusal of an `input` callable, safe to store: only its own `InputInvalidError`
    carries a message (the author's, written for the client); any other exception's text
    may quote the input (`int('…')`), so only its type is named."""
    if isinstance(exc, InputInvalidError):
        text = str(exc).strip()
        if text:
            return text
    return f"the workflow's input check refused it ({type(exc).__name__})"


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


# ---------------------------------------------------------------------------
# Scoped run state


@dataclass(frozen=True, slots=True)
class _MountExit:
    seq: int
    path: str
    exit_name: str
    outcome: str


class ScopedState:
    """What a runner knows of a run, and the include-scoped view each node's context gets.

    Feed it every finished attempt in execution order with `record(...)`: a runner does
    so after each step, and a resumed runner replays the committed attempts (the latest
    completed output per compiled path is all it needs; see workflow-model.md § 6). A
    node in scope `m` then sees `ctx.input` = the input of the latest entry of `m`, and
    `ctx.outputs` / `ctx.results` with only what finished after that entry, under local
    names; a nested mount appears under its mount name once it left through an exit.
    """

    __slots__ = (
        "_attempts",
        "_completed_at",
        "_entered",
        "_exits",
        "_finished_at",
        "_inputs",
        "_invocations",
        "_seq",
        "compiled",
        "input",
        "outcomes",
        "outputs",
    )

    def __init__(self, compiled: CompiledWorkflow, run_input: Any) -> None:
        self.compiled = compiled
        self.input = run_input
        self.outputs: dict[str, Any] = {}
        """Compiled path → output of its latest completed attempt."""
        self.outcomes: dict[str, str] = {}
        """Compiled path → outcome of its latest finished attempt."""
        self._seq = 0
        self._completed_at: dict[str, int] = {}
        self._finished_at: dict[str, int] = {}
        self._entered: dict[str, int] = {}
        self._inputs: dict[str, Any] = {}
        self._invocations: dict[str, int] = {}
        self._attempts: dict[str, int] = {}
        self._exits: dict[str, _MountExit] = {}

    def record(self, path: str, outcome: str, output: Any = None) -> None:
        """Record one finished attempt (`completed`, `failed` or `timed_out`) of `path`."""
        node = self.compiled.nodes.get(path)
        self._seq += 1
        seq = self._seq
        self._finished_at[path] = seq
        self.outcomes[path] = outcome
        if outcome == "completed":
            self._completed_at[path] = seq
            self.outputs[path] = output
        if node is None:
            return
        mount = node.mount
        if node.include_transition == "entry" and mount is not None:
            if outcome == "completed":
                self._entered[mount.path] = seq
                self._inputs[mount.path] = output.get("input") if isinstance(output, dict) else None
                self._invocations[mount.path] = self._invocations.get(mount.path, 0) + 1
                self._attempts[mount.path] = 0
        elif node.include_transition == "exit" and mount is not None:
            assert node.exit_name is not None
            self._exits[mount.path] = _MountExit(seq, path, node.exit_name, outcome)
        else:
            for depth in range(1, len(node.mount_path) + 1):
                scope = "/".join(node.mount_path[:depth])
                self._attempts[scope] = self._attempts.get(scope, 0) + 1

    def invocation(self, mount: str) -> int:
        """1 + the completed entries of `mount` so far (the next entry's `invocation`)."""
        return self._invocations.get(mount, 0) + 1

    def limit_exceeded(self, node: CompiledNode) -> str | None:
        """Why running `node` now would pass an include's `max_steps`, or `None`.

        Each mount's child `max_steps` bounds the real attempts after its latest entry,
        nested mounts included; ancestors are checked first. Entry and exit nodes never
        count.
        """
        if node.node is None:
            return None
        for depth in range(1, len(node.mount_path) + 1):
            scope = "/".join(node.mount_path[:depth])
            mount = self.compiled.mounts[scope]
            limit = mount.workflow.max_steps
            if self._attempts.get(scope, 0) + 1 > limit:
                return (
                    f"include {scope!r} (workflow {mount.workflow.name!r}) made more than "
                    f"{limit} steps in one invocation"
                )
        return None

    def view(self, scope: tuple[str, ...]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """`(input, outputs, results)` as a node in `scope` sees them, by local names."""
        scope_id = "/".join(scope)
        since = self._entered.get(scope_id, 0) if scope else 0
        run_input = self._inputs.get(scope_id) if scope else self.input
        outputs: dict[str, Any] = {}
        results: dict[str, Any] = {}
        for path, seq in self._finished_at.items():
            node = self.compiled.nodes.get(path)
            if node is None or node.node is None or node.mount_path != scope or seq <= since:
                continue
            results[node.local_id] = {"outcome": self.outcomes[path]}
            completed = self._completed_at.get(path)
            if completed is not None and completed > since:
                outputs[node.local_id] = self.outputs[path]
        for mount_id, mount in self.compiled.mounts.items():
            if mount.mount_path[:-1] != scope:
                continue
            left = self._exits.get(mount_id)
            if left is None or left.seq <= since or left.seq < self._entered.get(mount_id, 0):
                continue
            local = mount.mount_path[-1]
            results[local] = {"outcome": left.outcome, "exit": left.exit_name}
            if left.outcome == "completed":
                outputs[local] = self.outputs[left.path]
        return run_input, outputs, results

    def context(
        self,
        node: CompiledNode,
        *,
        run_id: str = "",
        visit: int = 1,
        effects: EffectHost | None = None,
    ) -> EngineContext:
        """The context for one attempt of `node`, projected to its include scope."""
        run_input, outputs, results = self.view(node.mount_path)
        return EngineContext(
            input=run_input,
            outputs=outputs,
            results=results,
            run_id=run_id,
            node_path=node.path,
            visit=visit,
            effects=effects,
        )

    def transition_output(self, node: CompiledNode, ctx: NodeContext) -> dict[str, Any]:
        """Run a synthetic include node: the entry's or the exit's output.

        `ctx` is `context(node)`: the parent scope for an entry, the child's for an exit.
        """
        if node.include_transition == "entry":
            assert node.mount is not None
            return include_entry_output(node, ctx, self.invocation(node.mount.path))
        return include_exit_output(node, ctx)
