"""The graph layout as data: deterministic, loops in the gutter, labels on edges, and
nodes that never move when the run's states change."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pi_workflows import compute, define_workflow, include_workflow
from pi_workflows.engine import definition_snapshot
from pi_workflows.viewer._layout import (
    CARD_HEIGHT,
    CARD_WIDTH,
    NodeState,
    layout_definition,
    node_states,
    render_graph,
)

pytestmark = pytest.mark.timeout(30)


def _noop(ctx: Any) -> dict[str, Any]:
    return {}


LOOP = define_workflow(
    name="loop",
    start_at="init",
    nodes={name: compute(_noop) for name in ("init", "work", "check", "done", "give_up")},
    edges=[
        {"from": "init", "to": "work"},
        {"from": "work", "to": "check"},
        {
            "from": "check",
            "switch": {
                "on": "$.state",
                "cases": {"again": "work", "ok": "done"},
                "default": "give_up",
            },
        },
    ],
)
REVIEW = define_workflow(
    name="review",
    start_at="look",
    nodes={name: compute(_noop) for name in ("look", "pass_", "fail_")},
    edges=[
        {"from": "look", "switch": {"on": "$.ok", "cases": {"true": "pass_"}, "default": "fail_"}}
    ],
    exits={"passed": {"from": "pass_"}, "failed": {"from": "fail_"}},
)
SHIP = define_workflow(
    name="ship",
    start_at="prep",
    nodes={name: compute(_noop) for name in ("prep", "ship", "fix")},
    includes={"review": include_workflow(REVIEW)},
    edges=[
        {"from": "prep", "switch": {"on": "$.go", "cases": {"true": "review"}, "default": "ship"}},
        {"from": "review.passed", "to": "ship"},
        {"from": "review.failed", "to": "fix"},
    ],
)


def _plain(lines: list[Any]) -> list[str]:
    return [line.plain for line in lines]


def _view(*items: dict[str, Any], **display: Any) -> dict[str, Any]:
    return {
        "display": {"status": "running", "controls": [], **display},
        "trace": {"count": len(items), "omitted": 0, "items": list(items)},
    }


def _attempt(node: str, outcome: str, n: int, started: int, finished: int | None) -> dict[str, Any]:
    item = {"attemptId": f"a{n}", "node": node, "outcome": outcome, "visit": 1, "attempt": 1,
            "kind": "compute", "generation": 1, "startedAt": started}  # fmt: skip
    if finished is not None:
        item["finishedAt"] = finished
    return item


def test_the_same_definition_gets_the_same_layout_whatever_its_key_order() -> None:
    snapshot = definition_snapshot(SHIP)
    shuffled = json.loads(json.dumps(snapshot))
    shuffled["nodes"] = dict(reversed(list(shuffled["nodes"].items())))
    first, second = layout_definition(snapshot), layout_definition(shuffled)
    assert first == second
    assert _plain(render_graph(first, {})) == _plain(render_graph(second, {}))


def test_layers_follow_the_longest_path_and_cards_share_one_size() -> None:
    layout = layout_definition(definition_snapshot(SHIP))
    layer = {card.node: card.layer for card in layout.cards}
    assert layer["prep"] == 0 and layer["review"] == 1 and layer["review/look"] == 2
    assert layer["ship"] > layer["review/__piw_exit_passed"], "the longest path, not the shortest"
    positions = {(card.x, card.y) for card in layout.cards}
    assert len(positions) == len(layout.cards), "no two cards share a place"
    lines = _plain(render_graph(layout, {}))
    for card in layout.cards:
        box = [line[card.x : card.x + CARD_WIDTH] for line in lines[card.y : card.y + CARD_HEIGHT]]
        assert box[0][0] == "┌" and box[-1][-1] == "┘", card.node


def test_includes_show_their_mount_prefix_and_exits() -> None:
    layout = layout_definition(definition_snapshot(SHIP))
    cards = {card.node: card for card in layout.cards}
    assert cards["review"].badge == "include"
    assert cards["review/__piw_exit_passed"].label == "review.passed"
    assert cards["review/__piw_exit_passed"].badge == "exit"
    assert cards["review/look"].label == "review/look"
    assert cards["ship"].end == "end" and cards["prep"].start


def test_a_loop_runs_in_the_left_gutter_and_branches_carry_their_case() -> None:
    layout = layout_definition(definition_snapshot(LOOP))
    back = [edge for edge in layout.edges if edge.back]
    assert [(edge.source, edge.target, edge.label) for edge in back] == [("check", "work", "again")]
    lines = _plain(render_graph(layout, {}))
    leftmost = min(card.x for card in layout.cards)
    work, check = layout.by_node["work"], layout.by_node["check"]
    gutter = [line[:leftmost] for line in lines[work.y - 2 : check.y + CARD_HEIGHT + 2]]
    assert all("│" in cell or "╭" in cell or "╰" in cell for cell in gutter), gutter
    arrows = "\n".join(lines)
    assert "▼↺again" in arrows and "▼ok" in arrows and "▼default" in arrows


def test_states_never_move_a_node() -> None:
    layout = layout_definition(definition_snapshot(LOOP))
    idle = _plain(render_graph(layout, {}))
    busy_view = _view(
        _attempt("init", "completed", 1, 0, 100),
        _attempt("work", "running", 2, 100, None),
        currentNode="work",
    )
    busy = _plain(render_graph(layout, node_states(busy_view, now_ms=1600)))
    assert layout_definition(definition_snapshot(LOOP)) == layout
    assert len(idle) == len(busy) and [len(line) for line in idle] == [len(line) for line in busy]
    for card in layout.cards:  # the borders are where they were
        assert busy[card.y][card.x] == idle[card.y][card.x] == "┌"
    assert "▶ running" in busy[layout.by_node["work"].y + 2]
    assert "1.5s" in busy[layout.by_node["work"].y + 3]


def test_node_states_count_attempts_and_time_and_mark_the_wait() -> None:
    view = _view(
        _attempt("init", "completed", 1, 0, 100),
        _attempt("work", "completed", 2, 100, 300),
        _attempt("work", "completed", 3, 400, 700),
        _attempt("check", "completed", 4, 700, 800),
        status="waiting",
        waitingOn="check",
    )
    states = node_states(view)
    assert states["work"] == NodeState("completed", 2, 500, False, False)
    assert states["check"].state == "waiting" and states["check"].current
    assert "done" not in states, "a node that never ran is pending (the default)"


def test_a_replay_shows_the_states_as_of_its_attempt_and_never_looks_live() -> None:
    view = _view(
        _attempt("init", "completed", 1, 0, 100),
        _attempt("work", "failed", 2, 100, 300),
        _attempt("work", "running", 3, 400, None),
        currentNode="work",
    )
    states = node_states(view, replay_attempt="a2")
    assert states["work"] == NodeState("failed", 1, 200, True, True)
    assert all(state.replay for state in states.values())
    layout = layout_definition(definition_snapshot(LOOP))
    lines = _plain(render_graph(layout, states))
    assert "replay" in lines[layout.by_node["work"].y]
    live = _plain(render_graph(layout, node_states(view)))
    assert "replay" not in "\n".join(live) and " now " in live[layout.by_node["work"].y]


def test_compact_density_is_one_line_per_node_with_its_targets() -> None:
    layout = layout_definition(definition_snapshot(LOOP))
    lines = _plain(render_graph(layout, {}, "compact"))
    assert len(lines) == len(layout.cards)
    check = next(line for line in lines if line.split()[0] == "check")
    assert "↺ work [again]" in check and "done [ok]" in check and "give_up [default]" in check


def test_counts_of_a_long_run_are_marked_as_lower_bounds() -> None:
    """The view holds the newest attempts only: older ones are counted nowhere here."""
    view = _view(
        _attempt("work", "completed", 1, 0, 100), _attempt("work", "completed", 2, 100, 300)
    )
    view["trace"]["omitted"] = 29_998
    states = node_states(view)
    assert states["work"].partial and states["work"].attempts == 2
    layout = layout_definition(definition_snapshot(LOOP))
    card = layout.by_node["work"]
    lines = _plain(render_graph(layout, states))
    assert "×2+" in lines[card.y + 2] and "0.3s+" in lines[card.y + 3]
