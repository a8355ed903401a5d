"""The graph pane: the run's whole definition as a layered layout of cards.

`GraphView.show_run(view, definition, replay_attempt=None)` draws `definition` (a
`pi-workflows.definition-snapshot.v1`, verified from the view's `graph.definition`
content reference) with each node's state from the run view; `replay_attempt` (an
`attemptId` of the trace) shows the run as it was at that attempt, marked as a replay.
Keys: arrows/hjkl pan, `f` follow (on by default: centres the running node or the
waiting checkpoint), `z` compact. The layout depends only on the definition, so an
update never moves a node; only visible lines are rendered (the Line API), and a view
that changes no node state renders nothing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from pi_workflows.viewer._layout import (
    CARD_HEIGHT,
    CARD_WIDTH,
    Density,
    GraphLayout,
    NodeState,
    focus_node,
    layout_definition,
    node_states,
    render_graph,
)

__all__ = ["GraphView"]

PAN_COLUMNS = 4
PAN_LINES = 2


class GraphView(ScrollView, can_focus=True):
    """A pannable canvas of the run's graph (see the module docstring)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left,h", "pan(-1, 0)", "Pan", show=False),
        Binding("right,l", "pan(1, 0)", "Pan", show=False),
        Binding("up,k", "pan(0, -1)", "Pan", show=False),
        Binding("down,j", "pan(0, 1)", "Pan", show=False),
        Binding("f", "toggle_follow", "Follow"),
        Binding("z", "toggle_density", "Compact"),
    ]

    def __init__(
        self, *, name: str | None = None, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.follow = True
        self.density: Density = "cards"
        self.renders = 0
        """How many times the canvas was drawn (tests check that no-ops draw nothing)."""
        self._definition: Mapping[str, Any] | None = None
        self._layout: GraphLayout | None = None
        self._view: Mapping[str, Any] | None = None
        self._states: dict[str, NodeState] = {}
        self._strips: list[Strip] = []
        self._mounted = False

    @property
    def layout_of_graph(self) -> GraphLayout | None:
        """The current layout (None without a definition)."""
        return self._layout

    @property
    def states(self) -> Mapping[str, NodeState]:
        return self._states

    def show_run(
        self,
        view: Mapping[str, Any] | None,
        definition: Mapping[str, Any] | None,
        *,
        replay_attempt: str | None = None,
    ) -> None:
        """Draw `definition` with the states of `view` (see the module docstring)."""
        changed = False
        if definition is not self._definition:
            if definition != self._definition:  # the same snapshot keeps its layout
                self._layout = None if definition is None else layout_definition(definition)
                changed = True
            self._definition = definition
        states = node_states(view, replay_attempt, now_ms=int(time.time() * 1000))
        self._view = view
        if not changed and states == self._states and self._strips:
            return
        self._states = states
        self._draw()

    def on_mount(self) -> None:
        self._mounted = True
        if self._layout is not None or self._view is not None:
            self._draw()  # `show_run` came before the pane was mounted

    def _draw(self) -> None:
        if not self._mounted:
            return
        self.renders += 1
        if self._layout is None:
            lines = [Text("(no graph: the definition is not available)", end="")]
        else:
            lines = render_graph(self._layout, self._states, self.density)
        console = self.app.console
        self._strips = [Strip(list(line.render(console))) for line in lines]
        width = max((strip.cell_length for strip in self._strips), default=0)
        self.virtual_size = Size(width, len(self._strips))
        self.refresh()
        if self.follow:
            self.call_after_refresh(self._centre_focus)

    def focus_point(self) -> tuple[int, int] | None:
        """The canvas cell follow centres on: the current node's card (or line)."""
        layout = self._layout
        node = focus_node(self._view, self._states)
        if layout is None or node is None or node not in layout.by_node:
            return None
        card = layout.by_node[node]
        if self.density == "compact":
            return 0, [c.node for c in layout.cards].index(node)
        return card.x + CARD_WIDTH // 2, card.y + CARD_HEIGHT // 2

    def _centre_focus(self) -> None:
        point = self.focus_point()
        if point is None:
            return
        x, y = point
        size = self.scrollable_content_region.size
        self.scroll_to(
            max(0, x - size.width // 2), max(0, y - size.height // 2), animate=False, force=True
        )

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.scrollable_content_region.width
        if not 0 <= index < len(self._strips):
            return Strip.blank(width, self.rich_style)
        return self._strips[index].crop_extend(scroll_x, scroll_x + width, self.rich_style)

    def action_pan(self, columns: int, lines: int) -> None:
        """Move the canvas; panning by hand stops following."""
        self.follow = False
        self.scroll_relative(columns * PAN_COLUMNS, lines * PAN_LINES, animate=False, force=True)

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        self.notify("follow on" if self.follow else "follow off", timeout=2)
        if self.follow:
            self._centre_focus()

    def action_toggle_density(self) -> None:
        self.density = "compact" if self.density == "cards" else "cards"
        self._draw()
