"""The server's definition cache: its answers equal the resolver's, and it notices change.

Real resolver children (forked by a real zygote) give the reference answers; the cache
must reproduce them byte for byte from what it stored, and must miss when a file, a
module the workflow imports, or discovery (a shadowing file) changes.
"""

from __future__ import annotations

import json
import sqlite3
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.actors._process_supervisor import ProcessSupervisorActor
from pi_workflows.server._definition_cache import CacheStats, DefinitionCache
from pi_workflows.server._resolver import (
    RESOLVER_MODULE,
    ResolverPort,
    resolve_start,
    resolver_spawns,
)
from pi_workflows.supervision._zygote_client import Zygote
from pi_workflows.wire.canonical import dumps

pytestmark = pytest.mark.timeout(120)

GREETING = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="greeting",
    title="Say  hello\\nnicely",
    start_at="greet",
    input_schema={
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string", "minLength": 2}, "n": {"type": "integer"}},
        "additionalProperties": False,
    },
    nodes={"greet": compute(lambda ctx: {"text": "hi " + ctx.input["name"]})},
)
"""

REVIEW = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="review",
    start_at="judge",
    nodes={"judge": compute(lambda ctx: {"ok": True})},
    input_schema={"type": "object"},
    exits={"done": {"from": "judge"}},
)
"""

LINT = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="lint",
    start_at="run",
    nodes={"run": compute(lambda ctx: {"clean": True})},
    exits={"done": {"from": "run"}},
)
"""

SHIP = """
from pi_workflows import compute, define_workflow, include_workflow

workflow = define_workflow(
    name="ship",
    start_at="prep",
    nodes={"prep": compute(lambda ctx: {"n": 1}), "ship": compute(lambda ctx: {})},
    includes={
        "review": include_workflow("review", input=lambda ctx: ctx.outputs["prep"]),
        "lint": include_workflow("lib/lint.workflow.py"),
    },
    edges=[
        {"from": "prep", "to": "review"},
        {"from": "review.done", "to": "lint"},
        {"from": "lint.done", "to": "ship"},
    ],
)
"""

HELPED = """
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import piw_cache_helper

from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="helped",
    start_at="a",
    input_schema=piw_cache_helper.SCHEMA,
    nodes={"a": compute(lambda ctx: {})},
)
"""

CHECKED = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="checked",
    start_at="a",
    input=lambda value: {"normalised": value},
    nodes={"a": compute(lambda ctx: {})},
)
"""

TITLED = """
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="titled",
    title=lambda ctx: "run for " + str(ctx.input),
    start_at="a",
    nodes={"a": compute(lambda ctx: {})},
)
"""


class Place:
    """A project and an agent folder with workflow files, and a resolver to ask."""

    def __init__(self, root: Path, resolvers: ResolverPort) -> None:
        self.project = root / "project"
        self.agent = root / "agent"
        self.resolvers = resolvers
        (self.project / ".pi" / "workflows").mkdir(parents=True)
        (self.agent / "workflows").mkdir(parents=True)

    def write(self, where: str, relative: str, source: str) -> Path:
        base = (
            self.project / ".pi" / "workflows" if where == "project" else self.agent / "workflows"
        )
        path = base / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
        return path

    def resolve(self, name: str, value: Any) -> dict[str, Any]:
        return resolve_start(name, str(self.project), self.agent, value, self.resolvers)


@pytest.fixture(scope="module")
def resolvers() -> Iterator[ResolverPort]:
    """Resolvers forked by a real zygote, started and killed by a real supervisor."""
    zygote = Zygote([RESOLVER_MODULE])
    supervisor = ProcessSupervisorActor.start(lambda name, exc: None, zygote)
    try:
        yield ResolverPort(supervisor)
    finally:
        supervisor.stop()
        zygote.close()


@pytest.fixture
def place(short_tmp: Path, resolvers: ResolverPort) -> Place:
    return Place(short_tmp, resolvers)


def cached(cache: DefinitionCache, place: Place, name: str, value: Any) -> dict[str, Any] | None:
    return cache.answer(name, str(place.project), place.agent, value)


def test_cache_answers_equal_the_resolvers(place: Place) -> None:
    place.write("project", "greeting.workflow.py", GREETING)
    place.write("agent", "review.workflow.py", REVIEW)
    place.write("project", "lib/lint.workflow.py", LINT)
    place.write("project", "ship.workflow.py", SHIP)
    cache = DefinitionCache()
    cases = {
        "greeting": [{"name": "Ada"}, {"name": "Bo", "n": 3}, {"name": "x"}, {"nm": 1}, [1]],
        "ship": [{}, {"n": 1.0}, {"deep": {"list": [1, "two", None]}}],
    }
    for name, inputs in cases.items():
        first = place.resolve(name, inputs[0])
        assert first["ok"], first
        assert first["reuse"]["cacheable"] is True, name
        assert cache.store(name, str(place.project), place.agent, first)
        for value in inputs:
            expected = place.resolve(name, value)
            got = cached(cache, place, name, value)
            assert got is not None, (name, value)
            assert dumps(got) == dumps(expected), (name, value)
    assert cache.stats.misses == 0
    assert any(not place.resolve("greeting", value)["ok"] for value in cases["greeting"]), (
        "the cases include refused inputs"
    )
    ship = place.resolve("ship", {})
    assert [m["mount"] for m in ship["sourceIdentity"]["mounted"]] == ["lint", "review"]
    assert {d["name"] for d in ship["reuse"]["discovered"]} == {"ship", "review"}


def test_refused_input_has_the_resolvers_code_and_message(place: Place) -> None:
    place.write("project", "greeting.workflow.py", GREETING)
    cache = DefinitionCache()
    cache.store(
        "greeting", str(place.project), place.agent, place.resolve("greeting", {"name": "Ada"})
    )
    bad = {"name": 7}
    got = cached(cache, place, "greeting", bad)
    assert got == place.resolve("greeting", bad)
    assert got is not None and got["code"] == "inputInvalid"
    assert "at /name: must be string" in got["message"]


def test_editing_any_file_of_the_definition_misses(place: Place) -> None:
    place.write("agent", "review.workflow.py", REVIEW)
    lint = place.write("project", "lib/lint.workflow.py", LINT)
    root = place.write("project", "ship.workflow.py", SHIP)
    cache = DefinitionCache()
    cache.store("ship", str(place.project), place.agent, place.resolve("ship", {}))
    assert cached(cache, place, "ship", {}) is not None
    lint.write_text(LINT.replace('"clean": True', '"clean": False'))
    assert cached(cache, place, "ship", {}) is None  # a mounted file changed
    cache.store("ship", str(place.project), place.agent, place.resolve("ship", {}))
    assert cached(cache, place, "ship", {}) is not None
    root.write_text(root.read_text() + "\n# edited\n")
    assert cached(cache, place, "ship", {}) is None  # the root changed, same size or not


def test_a_shadowing_file_misses(place: Place) -> None:
    place.write("agent", "review.workflow.py", REVIEW)
    place.write("project", "lib/lint.workflow.py", LINT)
    place.write(
        "agent",
        "ship.workflow.py",
        SHIP.replace("lib/lint", "../../project/.pi/workflows/lib/lint"),
    )
    cache = DefinitionCache()
    cache.store("ship", str(place.project), place.agent, place.resolve("ship", {}))
    assert cached(cache, place, "ship", {}) is not None
    # An include found by name is now shadowed by a project file.
    place.write("project", "review.workflow.py", REVIEW.replace('"ok": True', '"ok": 1'))
    assert cached(cache, place, "ship", {}) is None
    fresh = place.resolve("ship", {})
    review = [m for m in fresh["sourceIdentity"]["mounted"] if m["mount"] == "review"]
    assert review[0]["path"].startswith(str(place.project))
    cache.store("ship", str(place.project), place.agent, fresh)
    assert cached(cache, place, "ship", {}) is not None
    # The root itself is now shadowed.
    place.write("project", "ship.workflow.py", SHIP)
    assert cached(cache, place, "ship", {}) is None


def test_a_changed_imported_module_misses(place: Place) -> None:
    helper = place.write("project", "piw_cache_helper.py", "SCHEMA = {'type': 'object'}\n")
    place.write("project", "helped.workflow.py", HELPED)
    cache = DefinitionCache()
    first = place.resolve("helped", {})
    assert [Path(m["path"]).name for m in first["reuse"]["modules"]] == ["piw_cache_helper.py"]
    cache.store("helped", str(place.project), place.agent, first)
    assert cached(cache, place, "helped", []) == place.resolve("helped", [])  # refused alike
    helper.write_text("SCHEMA = {'type': 'array'}\n")
    assert cached(cache, place, "helped", []) is None


def test_input_and_title_callables_are_never_cached(place: Place) -> None:
    place.write("project", "checked.workflow.py", CHECKED)
    place.write("project", "titled.workflow.py", TITLED)
    cache = DefinitionCache()
    for name in ("checked", "titled", "hello"):  # the built-in has both
        answer = place.resolve(name, {"name": "Ada"})
        assert answer["ok"] and answer["reuse"] == {
            "cacheable": False,
            "discovered": [],
            "modules": [],
        }
        assert not cache.store(name, str(place.project), place.agent, answer)
        assert cached(cache, place, name, {"name": "Ada"}) is None
    assert cache.stats.stores == 0


def test_the_server_skips_the_resolver_on_a_hit(state_dir: Path, short_tmp: Path) -> None:
    project = short_tmp / "project"
    folder = project / ".pi" / "workflows"
    folder.mkdir(parents=True)
    (folder / "greeting.workflow.py").write_text(GREETING)
    (folder / "checked.workflow.py").write_text(CHECKED)
    server = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=False)
    with server, WorkflowClient(state_dir, autostart=False, timeout=30) as client:

        def start(name: str, value: Any) -> dict[str, Any]:
            payload = {"workflow": name, "input": value, "projectPath": str(project)}
            return dict(client.request("run.start", payload))

        def run(run_id: str) -> dict[str, Any]:
            return dict(client.call("run.get", run_id=run_id)["receipt"])

        spawns = resolver_spawns()
        first = start("greeting", {"name": "Ada"})
        assert resolver_spawns() == spawns + 1
        second = start("greeting", {"name": "Grace"})
        refused = start("greeting", {"name": 1})
        assert resolver_spawns() == spawns + 1, "a hit and a refusal from the cache spawn nothing"
        assert server.definitions.stats.hits == 2
        assert refused["outcome"] == "rejected" and refused["error"]["code"] == "inputInvalid"
        a, b = run(first["receipt"]["runId"]), run(second["receipt"]["runId"])
        assert a["title"] == b["title"] == "Say hello nicely"
        database = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
        try:
            rows = database.execute(
                "SELECT source_identity, definition_digest, input FROM runs WHERE run_id IN (?, ?)"
                " ORDER BY created_at, run_id",
                (a["runId"], b["runId"]),
            ).fetchall()
        finally:
            database.close()
        assert len(rows) == 2 and rows[0][:2] == rows[1][:2]
        assert sorted(json.loads(row[2])["name"] for row in rows) == ["Ada", "Grace"]
        (folder / "greeting.workflow.py").write_text(GREETING.replace('"hi "', '"hello "'))
        start("greeting", {"name": "Ada"})
        assert resolver_spawns() == spawns + 2, "an edited file goes back to the resolver"
        start("checked", {})
        start("checked", {})
        assert resolver_spawns() == spawns + 4, "an input callable always runs in a resolver"


def test_a_disabled_cache_never_answers_and_a_full_one_drops_the_oldest(place: Place) -> None:
    place.write("project", "greeting.workflow.py", GREETING)
    place.write("project", "lint.workflow.py", LINT)
    greeting = place.resolve("greeting", {"name": "Ada"})
    lint = place.resolve("lint", {})
    off = DefinitionCache(enabled=False)
    assert not off.store("greeting", str(place.project), place.agent, greeting)
    assert cached(off, place, "greeting", {"name": "Ada"}) is None
    small = DefinitionCache(capacity=1)
    assert small.store("greeting", str(place.project), place.agent, greeting)
    assert small.store("lint", str(place.project), place.agent, lint)
    assert cached(small, place, "greeting", {"name": "Ada"}) is None
    assert cached(small, place, "lint", {}) == place.resolve("lint", {})
    assert small.stats == CacheStats(hits=1, misses=1, stores=2)
