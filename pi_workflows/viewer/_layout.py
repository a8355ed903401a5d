"""The graph pane's layout and rendering as plain functions: definition in, grid out.

`layout_definition` places a definition snapshot's nodes as same-size cards in layers
(longest path from `startAt`, top-down) and routes its edges; it reads nothing else,
so a run's updates never move a node. `node_states` reads per-node states from the
run view's trace window, and `render_graph` draws both as rich `Text` lines.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from rich.text import Text

__all__ = [
    "CARD_HEIGHT",
    "CARD_WIDTH",
    "Card",
    "Density",
    "Edge",
    "GraphLayout",
    "NodeState",
    "focus_node",
    "format_elapsed",
    "layout_definition",
    "node_states",
    "render_graph",
]

Density = Literal["cards", "compact"]

CARD_WIDTH: Final = 22
CARD_HEIGHT: Final = 5
COLUMN_GAP: Final = 6
"""Between columns: a channel whose lanes carry edges that skip layers."""
ROW_GAP: Final = 3
"""Between layers: a stub line, the bus line edges run along, the arrow line."""
LANES: Final = COLUMN_GAP - 2
GUTTER_LANE: Final = 2
"""Columns per loop lane in the left gutter."""
LABEL_WIDTH: Final = CARD_WIDTH // 2 - 2

_UP, _DOWN, _LEFT, _RIGHT = 1, 2, 4, 8
_LINES: Final = {
    _UP: "│",
    _DOWN: "│",
    _UP | _DOWN: "│",
    _LEFT: "─",
    _RIGHT: "─",
    _LEFT | _RIGHT: "─",
    _DOWN | _RIGHT: "╭",
    _DOWN | _LEFT: "╮",
    _UP | _RIGHT: "╰",
    _UP | _LEFT: "╯",
    _UP | _DOWN | _RIGHT: "├",
    _UP | _DOWN | _LEFT: "┤",
    _DOWN | _LEFT | _RIGHT: "┬",
    _UP | _LEFT | _RIGHT: "┴",
    _UP | _DOWN | _LEFT | _RIGHT: "┼",
}

BADGES: Final = {
    "human_decision": "decision",
    "checkpoint": "checkpoint",
    "agent": "agent",
    "compute": "compute",
    "action": "action",
    "shell": "shell",
    "notify": "notify",
}

STATE_MARKS: Final = {
    "pending": "·",
    "running": "▶",
    "waiting": "◷",
    "completed": "✓",
    "failed": "✗",
    "timed_out": "✗",
    "cancelled": "⊘",
    "interrupted": "!",
}
STATE_STYLES: Final = {
    "pending": "dim",
    "running": "bold yellow",
    "waiting": "bold magenta",
    "completed": "green",
    "failed": "bold red",
    "timed_out": "red",
    "cancelled": "red",
    "interrupted": "yellow",
}
REPLAY_STYLE: Final = "italic cyan"
"""A replayed step has its own colour and marker: it never looks live."""


@dataclass(frozen=True, slots=True)
class Card:
    """One node's card: its place in the grid and what never changes on it."""

    node: str
    label: str
    badge: str
    layer: int
    column: int
    x: int
    y: int
    start: bool
    end: str | None
    """`end` for a node without successors, `exit NAME` for a workflow exit, else None."""


@dataclass(frozen=True, slots=True)
class Edge:
    """A transition of the definition; `back` edges (loops) run in the gutter."""

    source: str
    target: str
    label: str | None
    back: bool


@dataclass(frozen=True, slots=True)
class GraphLayout:
    """The placed definition: cards, edges, and the static canvas (edges, labels)."""

    name: str
    cards: tuple[Card, ...]
    edges: tuple[Edge, ...]
    width: int
    height: int
    canvas: tuple[str, ...]
    """Edge lines, arrows, labels and start markers; cards are drawn over it."""
    by_node: Mapping[str, Card] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node's state as read from the trace window (and display for the current one)."""

    state: str = "pending"
    attempts: int = 0
    elapsed_ms: int | None = None
    current: bool = False
    replay: bool = False
    partial: bool = False
    """Older attempts are outside the view's trace window: the counts are lower bounds."""


# --- layout ---------------------------------------------------------------------------


def layout_definition(snapshot: Mapping[str, Any]) -> GraphLayout:
    """Place `snapshot` (`pi-workflows.definition-snapshot.v1`) on a grid; deterministic."""
    nodes: Mapping[str, Any] = _mapping(snapshot.get("nodes"))
    names = sorted(nodes)
    successors = _successors(snapshot.get("edges"), set(names))
    start = snapshot.get("startAt")
    roots = ([start] if isinstance(start, str) and start in nodes else []) + names
    order, back = _depth_first(roots, successors)
    layers = _layers(order, successors, back)
    edges = tuple(
        Edge(source, target, label, (source, target) in back)
        for source in order
        for target, label in successors.get(source, ())
    )
    rows: dict[int, list[str]] = {}
    for node in order:  # within a layer, in depth-first discovery order
        rows.setdefault(layers[node], []).append(node)
    loops = sum(1 for edge in edges if edge.back)
    # Room above the first layer only for loops back into it (the start card says start).
    top = ROW_GAP if any(edge.back and layers[edge.target] == 0 for edge in edges) else 0
    left = GUTTER_LANE * loops + COLUMN_GAP
    exits = {str(node): str(name) for name, node in _mapping(snapshot.get("exits")).items()}
    cards: list[Card] = []
    for layer, row in sorted(rows.items()):
        for column, node in enumerate(row):
            spec = _mapping(nodes.get(node))
            cards.append(
                Card(
                    node=node,
                    label=_label(node, spec),
                    badge=_badge(spec),
                    layer=layer,
                    column=column,
                    x=left + column * (CARD_WIDTH + COLUMN_GAP),
                    y=top + layer * (CARD_HEIGHT + ROW_GAP),
                    start=node == start,
                    end=f"exit {exits[node]}"
                    if node in exits
                    else (None if successors.get(node) else "end"),
                )
            )
    columns = max((len(row) for row in rows.values()), default=0)
    width = left + columns * (CARD_WIDTH + COLUMN_GAP)
    height = top + len(rows) * (CARD_HEIGHT + ROW_GAP)
    by_node = {card.node: card for card in cards}
    canvas = _route(by_node, edges, width, height)
    return GraphLayout(
        name=str(snapshot.get("name", "")),
        cards=tuple(cards),
        edges=edges,
        width=width,
        height=height,
        canvas=canvas,
        by_node=by_node,
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _successors(raw: object, known: set[str]) -> dict[str, list[tuple[str, str | None]]]:
    """Each node's targets in the definition's order, with the switch case as label."""
    out: dict[str, list[tuple[str, str | None]]] = {}
    for edge in raw if isinstance(raw, list) else []:
        if not isinstance(edge, Mapping) or edge.get("from") not in known:
            continue
        source = str(edge["from"])
        targets: list[tuple[str, str | None]] = []
        if isinstance(edge.get("to"), str):
            targets.append((edge["to"], None))
        switch = _mapping(edge.get("switch"))
        for case, target in _mapping(switch.get("cases")).items():
            targets.append((str(target), str(case)))
        if isinstance(switch.get("default"), str):
            targets.append((switch["default"], "default"))
        merged: dict[str, list[str]] = {}
        for target, label in targets:
            if target in known:
                labels = merged.setdefault(target, [])
                if label is not None:
                    labels.append(label)
        out.setdefault(source, []).extend(
            (target, "|".join(labels) or None) for target, labels in merged.items()
        )
    return out


def _depth_first(
    roots: Iterable[str], successors: Mapping[str, list[tuple[str, str | None]]]
) -> tuple[list[str], set[tuple[str, str]]]:
    """Discovery order from the roots, and the back edges (to a node on the path)."""
    order: list[str] = []
    seen: set[str] = set()
    back: set[tuple[str, str]] = set()
    for root in roots:
        if root in seen:
            continue
        seen.add(root)
        order.append(root)
        on_path = {root}
        stack = [(root, iter(successors.get(root, ())))]
        while stack:  # iterative: a long chain must not hit the recursion limit
            node, pending = stack[-1]
            step = next(pending, None)
            if step is None:
                stack.pop()
                on_path.discard(node)
                continue
            target = step[0]
            if target in on_path:
                back.add((node, target))
            elif target not in seen:
                seen.add(target)
                order.append(target)
                on_path.add(target)
                stack.append((target, iter(successors.get(target, ()))))
    return order, back


def _layers(
    order: list[str],
    successors: Mapping[str, list[tuple[str, str | None]]],
    back: set[tuple[str, str]],
) -> dict[str, int]:
    """Longest path from the roots over forward edges (a topological relaxation)."""
    incoming: dict[str, int] = dict.fromkeys(order, 0)
    for source in order:
        for target, _ in successors.get(source, ()):
            if (source, target) not in back:
                incoming[target] += 1
    layer = dict.fromkeys(order, 0)
    ready = deque(node for node in order if incoming[node] == 0)
    while ready:
        node = ready.popleft()
        for target, _ in successors.get(node, ()):
            if (node, target) in back:
                continue
            layer[target] = max(layer[target], layer[node] + 1)
            incoming[target] -= 1
            if incoming[target] == 0:
                ready.append(target)
    return layer


def _label(node: str, spec: Mapping[str, Any]) -> str:
    """The card's header: the node path, an include exit as `MOUNT.EXIT`."""
    if spec.get("includeTransition") == "exit" and "exit" in spec:
        return f"{spec.get('mount', node)}.{spec['exit']}"
    return node


def _badge(spec: Mapping[str, Any]) -> str:
    transition = spec.get("includeTransition")
    if transition == "entry":
        return "include"
    if transition == "exit":
        return "exit"
    if spec.get("protected") is True:
        return "decision"
    kind = str(spec.get("kind", ""))
    return BADGES.get(kind, kind or "?")


# --- routing ----------------------------------------------------------------------------


class _Grid:
    """Line directions per cell, merged into box-drawing characters at the end."""

    def __init__(self, width: int, height: int) -> None:
        self.width = width
        self.height = height
        self.bits = [[0] * width for _ in range(height)]
        self.text: dict[tuple[int, int], str] = {}

    def path(self, points: list[tuple[int, int]]) -> None:
        for (x1, y1), (x2, y2) in itertools.pairwise(points):
            if (x1, y1) == (x2, y2):
                continue
            if x1 == x2:
                step = 1 if y2 > y1 else -1
                self._mark(x1, y1, _DOWN if step > 0 else _UP)
                for y in range(y1 + step, y2, step):
                    self._mark(x1, y, _UP | _DOWN)
                self._mark(x2, y2, _UP if step > 0 else _DOWN)
            else:
                step = 1 if x2 > x1 else -1
                self._mark(x1, y1, _RIGHT if step > 0 else _LEFT)
                for x in range(x1 + step, x2, step):
                    self._mark(x, y1, _LEFT | _RIGHT)
                self._mark(x2, y2, _LEFT if step > 0 else _RIGHT)

    def _mark(self, x: int, y: int, bits: int) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            self.bits[y][x] |= bits

    def put(self, x: int, y: int, text: str) -> None:
        for offset, char in enumerate(text):
            if 0 <= x + offset < self.width and 0 <= y < self.height:
                self.text[x + offset, y] = char

    def lines(self) -> tuple[str, ...]:
        rows = []
        for y, bits in enumerate(self.bits):
            chars = [self.text.get((x, y)) or _LINES.get(b, " ") for x, b in enumerate(bits)]
            rows.append("".join(chars))
        return tuple(rows)


def _route(
    cards: Mapping[str, Card], edges: tuple[Edge, ...], width: int, height: int
) -> tuple[str, ...]:
    grid = _Grid(width, height)
    labels: dict[str, list[str]] = {}
    lanes: dict[int, int] = {}
    loop = 0
    for edge in edges:
        source, target = cards[edge.source], cards[edge.target]
        sx, tx = _centre(source), _centre(target)
        bus_below = source.y + CARD_HEIGHT + 1
        bus_above = target.y - 2
        arrow = (tx, target.y - 1)
        if edge.back:
            lane = 1 + GUTTER_LANE * loop
            loop += 1
            grid.path(
                [
                    (sx, bus_below - 1),
                    (sx, bus_below),
                    (lane, bus_below),
                    (lane, bus_above),
                    (tx, bus_above),
                    arrow,
                ]
            )
        elif target.layer == source.layer + 1:
            grid.path([(sx, bus_below - 1), (sx, bus_below), (tx, bus_below), arrow])
        else:  # skips layers: down a lane of the channel left of the target's column
            used = lanes.get(target.column, 0)
            lanes[target.column] = used + 1
            lane = target.x - COLUMN_GAP + 1 + used % LANES
            grid.path(
                [
                    (sx, bus_below - 1),
                    (sx, bus_below),
                    (lane, bus_below),
                    (lane, bus_above),
                    (tx, bus_above),
                    arrow,
                ]
            )
        if edge.label is not None or edge.back:
            text = ("↺" if edge.back else "") + (edge.label or "")
            labels.setdefault(edge.target, []).append(text)
    for card in cards.values():
        if any(edge.target == card.node for edge in edges):
            grid.put(_centre(card), card.y - 1, "▼")
        if card.node in labels:
            text = ",".join(labels[card.node])
            grid.put(_centre(card) + 1, card.y - 1, _fit(text, LABEL_WIDTH))
    return grid.lines()


def _centre(card: Card) -> int:
    return card.x + CARD_WIDTH // 2


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


# --- states -----------------------------------------------------------------------------


def node_states(
    view: Mapping[str, Any] | None,
    replay_attempt: str | None = None,
    *,
    now_ms: int | None = None,
) -> dict[str, NodeState]:
    """Each node's state from the view's trace window (the newest attempts).

    Without `replay_attempt`, `display.currentNode`/`waitingOn` mark the current node
    (the viewer shows the server's display, it computes no run status). With it, only
    the attempts up to that one count, every state is flagged `replay`, and the
    replayed attempt's node is the current one. `now_ms` times a running attempt.
    """
    if view is None:
        return {}
    items = [i for i in _mapping(view.get("trace")).get("items", []) if isinstance(i, Mapping)]
    if replay_attempt is not None:
        ids = [item.get("attemptId") for item in items]
        items = items[: ids.index(replay_attempt) + 1] if replay_attempt in ids else []
    tally: dict[str, tuple[int, int | None, str]] = {}
    for item in items:
        node = str(item.get("node"))
        attempts, elapsed, _ = tally.get(node, (0, None, "pending"))
        spent = _spent(item, now_ms if replay_attempt is None else None)
        if spent is not None:
            elapsed = (elapsed or 0) + spent
        tally[node] = (attempts + 1, elapsed, str(item.get("outcome", "pending")))
    replaying = replay_attempt is not None
    current = _current(view, items, replaying)
    partial = bool(_mapping(view.get("trace")).get("omitted"))
    states = {
        node: NodeState(state, attempts, elapsed, node == current, replaying, partial)
        for node, (attempts, elapsed, state) in tally.items()
    }
    waiting = None if replaying else _mapping(view.get("display")).get("waitingOn")
    if isinstance(waiting, str) and waiting in states:
        # A checkpoint's attempt completes, then the run waits at it: show the wait.
        states[waiting] = replace(states[waiting], state="waiting")
    if current is not None and current not in states:
        states[current] = NodeState("pending", 0, None, True, replaying)
    return states


def _spent(item: Mapping[str, Any], now_ms: int | None) -> int | None:
    started = item.get("startedAt")
    finished = item.get("finishedAt", now_ms)
    if not isinstance(started, int) or not isinstance(finished, int):
        return None
    return max(0, finished - started)


def _current(
    view: Mapping[str, Any], items: list[Mapping[str, Any]], replaying: bool
) -> str | None:
    if replaying:
        return str(items[-1].get("node")) if items else None
    display = _mapping(view.get("display"))
    for key in ("waitingOn", "currentNode"):
        if isinstance(display.get(key), str):
            return str(display[key])
    return None


def focus_node(view: Mapping[str, Any] | None, states: Mapping[str, NodeState]) -> str | None:
    """The node follow centres: the current one, else the newest attempt's node."""
    for node, state in sorted(states.items()):
        if state.current:
            return node
    items = _mapping((view or {}).get("trace")).get("items") or []
    return str(items[-1].get("node")) if items and isinstance(items[-1], Mapping) else None


def format_elapsed(ms: int | None) -> str:
    """`0.4s`, `12.3s`, `3m05s`, `2h03m`; empty when unknown."""
    if ms is None:
        return ""
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


# --- rendering --------------------------------------------------------------------------


def render_graph(
    layout: GraphLayout, states: Mapping[str, NodeState], density: Density = "cards"
) -> list[Text]:
    """Draw `layout` with `states`: boxed cards on the canvas, or one line per node."""
    if density == "compact":
        return _render_compact(layout, states)
    chars = [list(line) for line in layout.canvas]
    spans: list[tuple[int, int, int, str]] = []
    for card in layout.cards:
        state = states.get(card.node, NodeState())
        style = _style(state)
        for offset, line in enumerate(_card_lines(card, state)):
            chars[card.y + offset][card.x : card.x + CARD_WIDTH] = list(line)
            if offset == 0 or offset == CARD_HEIGHT - 1:
                border = style if state.current else "dim" if state.state == "pending" else ""
                if border:
                    spans.append((card.y + offset, card.x, card.x + CARD_WIDTH, border))
            elif offset == 2:
                spans.append((card.y + offset, card.x + 1, card.x + CARD_WIDTH - 1, style))
            elif offset == 1:
                bold = "bold " + (REPLAY_STYLE if state.replay else "")
                spans.append((card.y + offset, card.x + 1, card.x + CARD_WIDTH - 1, bold.strip()))
    lines = [Text("".join(row), end="") for row in chars]
    for y, start, end, style in spans:
        lines[y].stylize(style, start, end)
    return lines


def _style(state: NodeState) -> str:
    if state.replay and state.state != "pending":
        return REPLAY_STYLE
    return STATE_STYLES.get(state.state, "")


def _card_lines(card: Card, state: NodeState) -> list[str]:
    inner = CARD_WIDTH - 2
    top_tag = "⟲ replay" if state.current and state.replay else "start" if card.start else ""
    top = _border("┌", "┐", top_tag, "now" if state.current and not state.replay else "")
    bottom = _border("└", "┘", card.end or "", "")
    mark = STATE_MARKS.get(state.state, "?")
    attempts, elapsed = _counts(state)
    return [
        top,
        "│" + _fit(card.label, inner).ljust(inner) + "│",
        "│" + _pair(f"{mark} {state.state.replace('_', ' ')}", attempts, inner) + "│",
        "│" + _pair(card.badge, elapsed, inner) + "│",
        bottom,
    ]


def _counts(state: NodeState) -> tuple[str, str]:
    """Attempts and time as shown; `+` when older attempts are outside the window."""
    more = "+" if state.partial else ""
    attempts = f"×{state.attempts}{more}" if state.attempts else ""
    elapsed = format_elapsed(state.elapsed_ms)
    return attempts, elapsed + more if elapsed else ""


def _border(left: str, right: str, tag: str, suffix: str) -> str:
    inner = CARD_WIDTH - 2
    words = " ".join(word for word in (tag, suffix) if word)
    text = f"─ {words} " if words else ""
    return left + _fit(text, inner).ljust(inner, "─") + right


def _pair(left: str, right: str, width: int) -> str:
    room = width - len(right) - (1 if right else 0)
    return _fit(left, room).ljust(room) + (" " + right if right else "")


def _render_compact(layout: GraphLayout, states: Mapping[str, NodeState]) -> list[Text]:
    """One line per node in layer order: state, ID, badge, attempts, time, targets."""
    width = max((len(card.label) for card in layout.cards), default=0)
    width = min(max(width, 8), 32)
    outgoing: dict[str, list[str]] = {}
    for edge in layout.edges:
        target = layout.by_node[edge.target].label
        text = f"{'↺ ' if edge.back else ''}{target}" + (f" [{edge.label}]" if edge.label else "")
        outgoing.setdefault(edge.source, []).append(text)
    lines = []
    for card in layout.cards:
        state = states.get(card.node, NodeState())
        mark = "⟲" if state.current and state.replay else ">" if state.current else " "
        status = f"{STATE_MARKS.get(state.state, '?')} {state.state.replace('_', ' ')}"
        attempts, elapsed = _counts(state)
        targets = ", ".join(outgoing.get(card.node, [])) or f"■ {card.end or 'end'}"
        start = "● " if card.start else "  "
        line = Text(end="")
        line.append(f"{mark}{start}")
        line.append(_fit(card.label, width).ljust(width), "bold" if state.current else "")
        line.append(f" {card.badge:<10} ")
        line.append(f"{status:<13}", _style(state))
        line.append(f" {attempts:>6} {elapsed:>7}  → {targets}")
        lines.append(line)
    return lines
