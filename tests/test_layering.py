"""The package's floors: no module imports a floor above its own, and packages meet only
through their public surface.

Implements the house rule of docs/architecture.md § Floors (as trio's `test_exports`
pins its layout): `wire` → `supervision` → `storage` and `engine` → `domain` → `actors`
→ `server` and `cli`. The check reads every module's imports as written (static,
lazy and `TYPE_CHECKING` ones alike), so a cycle between floors cannot come back. The
`domain` floor also writes no SQL: its statements live in `storage/`.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pi_workflows

PACKAGE = Path(pi_workflows.__file__).parent

FLOORS: dict[str, int] = {
    # The base: no imports of the package at all, or only of each other; `_address` is
    # where answers go (an address, `Done`, `Reply`).
    "_address": 0,
    "errors": 0,
    "_version": 0,
    "_paths": 0,
    # Protocol records, canonical JSON, framing, the client and the socket listener.
    "wire": 1,
    # Processes: spawn, identity, signals, crash points, the zygote, child channels;
    # and the TypeScript parts as package data.
    "supervision": 2,
    "pi": 2,
    # The state database; and the engine that runs inside runner and validation
    # children (which never opens the database).
    "storage": 3,
    "engine": 3,
    # Units of work and views: plain functions from data to data.
    "domain": 4,
    # One pykka actor per module.
    "actors": 5,
    # The composition root and router; the command line; the test fakes; the demo and
    # the examples it installs.
    "server": 6,
    "cli": 6,
    "testing": 6,
    "demo": 6,
    "examples": 6,
    "viewer": 6,
    # The package root: the public API, loaded lazily; and the public resource-manager
    # authoring module it names.
    "__init__": 7,
    "resource_managers": 7,
}
"""Each top-level part of `pi_workflows` and its floor (lower floors are imported)."""

SIBLINGS: frozenset[tuple[str, str]] = frozenset(
    {
        ("_paths", "errors"),
        ("cli", "server"),  # `server run` hosts the composition root in the CLI's process
        ("demo", "testing"),  # the demo runs against the fake model provider
        ("demo", "examples"),  # the demo installs the shipped example manager
        ("cli", "viewer"),  # `piw` is a command of the command line
        ("__init__", "resource_managers"),  # the root names the resource-manager API lazily
    }
)
"""Imports allowed between parts of the same floor (from, to)."""

EXEMPT_DIRS = ("engine/builtins", "examples/")
"""Built-in workflows and shipped examples (each in a folder of `examples/`) are workflow
and manager files: they use the public authoring API (the root)."""


@dataclass(frozen=True, slots=True)
class Import:
    module: str
    """The importing module's dotted name."""
    target: str
    """The imported module's dotted name."""
    names: tuple[str, ...]
    line: int

    @property
    def where(self) -> str:
        return f"{self.module}:{self.line}"


def part_of(dotted: str) -> str:
    """`pi_workflows.storage._db` → `storage`; `pi_workflows` → `__init__`."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent)
        if any(str(relative.parent).startswith(f"pi_workflows/{d}") for d in EXEMPT_DIRS):
            continue
        parts = list(relative.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def imports_of(module: str, path: Path) -> Iterator[Import]:
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pi_workflows"):
                    yield Import(module, alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.startswith("pi_workflows"):
                names = tuple(alias.name for alias in node.names)
                yield Import(module, target, names, node.lineno)


def all_imports() -> list[Import]:
    return [found for module, path in modules() for found in imports_of(module, path)]


def test_every_part_has_a_floor() -> None:
    parts = {part_of(module) for module, _ in modules()}
    assert parts <= set(FLOORS), sorted(parts - set(FLOORS))


def test_no_module_imports_a_floor_above_its_own() -> None:
    upward = []
    for found in all_imports():
        source, target = part_of(found.module), part_of(found.target)
        if source == target:
            continue
        if FLOORS[target] < FLOORS[source] or (source, target) in SIBLINGS:
            continue
        upward.append(f"{found.where} imports {found.target} ({source} → {target})")
    assert upward == [], "\n".join(upward)


def test_the_part_graph_has_no_cycle() -> None:
    edges: dict[str, set[str]] = {}
    for found in all_imports():
        source, target = part_of(found.module), part_of(found.target)
        if source != target:
            edges.setdefault(source, set()).add(target)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for following in edges.get(start, ()):
            if following == goal or (
                following not in seen and reaches(following, goal, seen | {following})
            ):
                return True
        return False

    cycles = sorted(part for part in edges if reaches(part, part, {part}))
    assert cycles == [], cycles


def test_packages_meet_through_their_public_surface() -> None:
    """Another part is used through its package root or a public (unprefixed) module,
    and only for the names in that module's `__all__`."""
    private, unlisted = [], []
    for found in all_imports():
        if part_of(found.module) == part_of(found.target):
            continue
        if any(piece.startswith("_") for piece in found.target.split(".")[2:]):
            private.append(f"{found.where} imports private {found.target}")
            continue
        exported = set(getattr(importlib.import_module(found.target), "__all__", ()))
        for name in found.names:
            submodule = f"{found.target}.{name}"
            if name not in exported and not _is_public_submodule(submodule):
                unlisted.append(f"{found.where} imports {name} from {found.target}")
    assert private == [], "\n".join(private)
    assert unlisted == [], "\n".join(unlisted)


def _is_public_submodule(dotted: str) -> bool:
    """`from pi_workflows.wire import protocol`: a public module, not a name."""
    if dotted.rsplit(".", 1)[-1].startswith("_"):
        return False
    try:
        importlib.import_module(dotted)
    except ImportError:
        return False
    return True


def test_each_package_lists_what_it_exports() -> None:
    for module, path in modules():
        if path.name != "__init__.py" or module == "pi_workflows":
            continue
        package = importlib.import_module(module)
        exported = getattr(package, "__all__", None)
        assert isinstance(exported, list), module
        missing = [name for name in exported if not hasattr(package, name)]
        assert missing == [], (module, missing)


SQL_START = re.compile(r"(SELECT|INSERT|UPDATE|DELETE|WITH|REPLACE|UPSERT)\s", re.IGNORECASE)
"""A string that opens like an SQL statement (after its leading white space)."""
QUERY_CALLS = frozenset(
    {"execute", "executemany", "executescript", "fetch_value", "fetch_one", "fetch_all"}
)
"""The ways to run a statement on a `Database`, `Reader`, `Tx` or connection."""


def sql_in(path: Path) -> Iterator[str]:
    """Each SQL-looking string constant (docstrings aside) and each statement call."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and SQL_START.match(node.value.lstrip())
        ):
            yield f"{path.name}:{node.lineno} SQL text {node.value.strip()[:40]!r}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in QUERY_CALLS
        ):
            yield f"{path.name}:{node.lineno} runs a statement (.{node.func.attr})"


def test_the_domain_writes_no_sql() -> None:
    """`domain` holds units of work and views: every statement they run is a named
    query in `storage/_queries.py` behind a storage function (docs/storage.md § Files)."""
    found = [hit for path in sorted((PACKAGE / "domain").rglob("*.py")) for hit in sql_in(path)]
    assert found == [], "\n".join(found)
