"""The graph pane headless (textual's Pilot): it pans, follows the current node,
switches density, and draws nothing for a view that changes no node state."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from textual.app import App, ComposeResult

from pi_workflows.engine import definition_snapshot
from pi_workflows.viewer._graph import GraphView
from tests.viewer.test_layout import LOOP, SHIP, _attempt, _view

pytestmark = pytest.mark.timeout(60)


class GraphApp(App[None]):
    def compose(self) -> ComposeResult:
        yield GraphView(id="graph")


class EarlyApp(App[None]):
    """Calls `show_run` before the pane is mounted, as an app with a held view may."""

    def compose(self) -> ComposeResult:
        graph = GraphView()
        graph.show_run(_view(currentNode="work"), definition_snapshot(LOOP))
        yield graph


def _screen(graph: GraphView) -> str:
    return "\n".join(graph.render_line(y).text for y in range(graph.size.height))


def test_follow_centres_the_current_node_and_panning_stops_it() -> None:
    asyncio.run(_follow())


async def _follow() -> None:
    app = GraphApp()
    async with app.run_test(size=(60, 20)) as pilot:
        graph = app.query_one(GraphView)
        graph.focus()
        definition = definition_snapshot(SHIP)
        running = _view(_attempt("prep", "completed", 1, 0, 10), currentNode="ship")
        graph.show_run(running, definition)
        await pilot.pause()
        assert graph.follow and "ship" in _screen(graph)
        assert graph.scroll_offset.y > 0, "the current node is far down: followed"
        await pilot.press("k", "k")
        assert not graph.follow, "panning by hand stops following"
        offset = graph.scroll_offset.y
        await pilot.press("j")
        await pilot.pause()
        assert graph.scroll_offset.y > offset
        await pilot.press("f")
        await pilot.pause()
        assert graph.follow


def test_compact_density_and_no_redraw_without_a_change() -> None:
    asyncio.run(_density())


async def _density() -> None:
    app = GraphApp()
    async with app.run_test(size=(100, 30)) as pilot:
        graph = app.query_one(GraphView)
        graph.focus()
        definition: dict[str, Any] = definition_snapshot(LOOP)
        view = _view(_attempt("init", "completed", 1, 0, 10), currentNode="work")
        graph.show_run(view, definition)
        await pilot.pause()
        drawn = graph.renders
        graph.show_run(dict(view), dict(definition))  # equal data, new objects
        assert graph.renders == drawn, "nothing changed: nothing drawn"
        assert "┌" in _screen(graph)
        await pilot.press("z")
        await pilot.pause()
        assert graph.density == "compact" and "┌" not in _screen(graph)
        assert "↺ work [again]" in _screen(graph)
        graph.show_run(None, None)
        await pilot.pause()
        assert "no graph" in _screen(graph)


def test_a_run_shown_before_mounting_is_drawn_once_mounted() -> None:
    asyncio.run(_early())


async def _early() -> None:
    app = EarlyApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        graph = app.query_one(GraphView)
        assert graph.renders == 1 and "work" in _screen(graph)
