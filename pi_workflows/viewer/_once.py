"""`piw RUN_ID --once`: one plain-text 120 × 40 frame of a run, for scripts and tests.

It waits for the run's view (a subscription, which starts a server when none runs),
loads the definition it references (verified), prints the header, the graph and the
last steps, and exits. It reads only the view's newest trace window, never its pages,
so a 30,000-step run prints as fast as a short one.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, Final

from rich.cells import set_cell_size

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.viewer._layout import (
    GraphLayout,
    focus_node,
    format_elapsed,
    layout_definition,
    node_states,
    render_graph,
)
from pi_workflows.viewer._target import Target, open_client, open_live
from pi_workflows.wire.client import HostUnavailableError, PackageMismatchError
from pi_workflows.wire.live import RunNotFoundError, ViewKey, WatchTimeoutError

__all__ = ["FRAME_HEIGHT", "FRAME_WIDTH", "print_once", "render_frame"]

FRAME_WIDTH: Final = 120
FRAME_HEIGHT: Final = 40
LAST_STEPS: Final = 4
HEADER_LINES: Final = 4
GRAPH_LINES: Final = FRAME_HEIGHT - HEADER_LINES - 1 - LAST_STEPS

EXIT_FAILED: Final = 1
EXIT_UNAVAILABLE: Final = 3
EXIT_TIMEOUT: Final = 6
"""`piw view`'s exit codes (cli/_main.py COMMAND_EXITS; the CLI floor is above this one)."""


def print_once(target: Target, run_id: str, *, timeout: float) -> int:
    """Print one 120 × 40 frame of `run_id`'s view; return the exit code.

    `timeout` bounds everything (a server start, the connection, the view and the
    definition): the fetch runs in a daemon thread, so a server that accepts the
    connection but never answers cannot hold the frame past it.
    """
    fetched: list[tuple[Mapping[str, Any], Mapping[str, Any] | None] | BaseException] = []

    def fetch() -> None:
        try:
            fetched.append(_fetch(target, run_id, timeout))
        except BaseException as exc:  # noqa: BLE001 (handed to the caller's thread)
            fetched.append(exc)

    worker = threading.Thread(target=fetch, name="piw-once", daemon=True)
    worker.start()
    worker.join(timeout)
    if not fetched:
        return _fail(f"no view of {run_id!r} within {timeout:g} s", EXIT_TIMEOUT)
    outcome = fetched[0]
    if isinstance(outcome, BaseException):
        return _failure(outcome, run_id, timeout)
    view, definition = outcome
    sys.stdout.write(render_frame(view, definition, now_ms=int(time.time() * 1000)))
    sys.stdout.flush()
    return 0


def _fetch(
    target: Target, run_id: str, timeout: float
) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
    deadline = time.monotonic() + timeout
    view = _wait_for_view(target, run_id, timeout)
    return view, _load_definition(target, run_id, view, max(1.0, deadline - time.monotonic()))


def _failure(exc: BaseException, run_id: str, timeout: float) -> int:
    """One clear line on stderr (never a user path) and `piw view`'s exit code."""
    if isinstance(exc, RunNotFoundError):
        return _fail(f"no run {run_id!r}; `pi-workflows run list` lists them", EXIT_FAILED)
    if isinstance(exc, TimeoutError):  # WatchTimeoutError too
        return _fail(f"no view of {run_id!r} within {timeout:g} s", EXIT_TIMEOUT)
    if isinstance(exc, PackageMismatchError):
        return _fail(str(exc), EXIT_UNAVAILABLE)
    if isinstance(exc, HostUnavailableError):
        return _fail(
            "no workflow server could be reached or started; check `pi-workflows server status`",
            EXIT_UNAVAILABLE,
        )
    if isinstance(exc, PiWorkflowsError | OSError | ValueError):
        return _fail(
            f"the server refused or broke the protocol ({type(exc).__name__})", EXIT_FAILED
        )
    if isinstance(exc, NotImplementedError):  # a transport not built yet (--connect)
        return _fail(str(exc), EXIT_FAILED)
    raise exc


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"piw: {message}\n")
    return code


def _wait_for_view(target: Target, run_id: str, timeout: float) -> Mapping[str, Any]:
    key = ViewKey.run(run_id)
    deadline = time.monotonic() + timeout
    with open_live(target, timeout=timeout, reconnect_timeout=timeout) as live:
        live.subscribe(key, timeout=timeout)
        while (view := live.view(key)) is None:
            left = deadline - time.monotonic()
            if left <= 0 or live.next_update(left) is None:
                raise WatchTimeoutError("no view in time")
        return dict(view)


def _load_definition(
    target: Target, run_id: str, view: Mapping[str, Any], timeout: float
) -> Mapping[str, Any] | None:
    """The verified definition snapshot, or None when the view holds no reference."""
    ref = ((view.get("graph") or {}).get("definition")) or {}
    if "digest" not in ref:
        return None
    with open_client(target, timeout=timeout) as client:
        loaded = json.loads(client.run_content(run_id, ref))
    return loaded if isinstance(loaded, dict) else None


# --- the frame --------------------------------------------------------------------------


def render_frame(
    view: Mapping[str, Any], definition: Mapping[str, Any] | None, *, now_ms: int
) -> str:
    """The frame as text: exactly `FRAME_HEIGHT` lines of `FRAME_WIDTH` columns.

    Only a running run's elapsed time depends on `now_ms`; a finished run's frame
    depends on the view and the definition alone.
    """
    layout = None if definition is None else layout_definition(definition)
    lines = [*_header(view, now_ms), *_graph(view, layout), *_steps(view, layout)]
    lines = lines[:FRAME_HEIGHT] + [""] * (FRAME_HEIGHT - len(lines))
    return "".join(set_cell_size(line, FRAME_WIDTH) + "\n" for line in lines)


def _header(view: Mapping[str, Any], now_ms: int) -> list[str]:
    display = view.get("display") or {}
    title = view.get("title")
    first = f"piw  {view.get('runId', '?')}  {view.get('workflow', '?')}"
    if isinstance(title, str) and title:
        first += f"  · {title}"
    controls = ", ".join(str(c) for c in display.get("controls") or []) or "none"
    second = f"status: {display.get('status', '?')}   elapsed {_run_elapsed(view, now_ms):>7}"
    for word, key in (("at", "currentNode"), ("waiting on", "waitingOn")):
        if isinstance(display.get(key), str):
            second += f"   {word}: {display[key]}"
    second += f"   controls: {controls}"
    return [first, second, _detail(view), "─" * FRAME_WIDTH]


def _detail(view: Mapping[str, Any]) -> str:
    """The question a waiting run asks, or why it stopped or needs action, in words."""
    display = view.get("display") or {}
    for key in ("question", "reasonText", "action"):
        if isinstance(display.get(key), str):
            return " ".join(display[key].split())
    reason = view.get("failureReason")
    return " ".join(reason.split()) if isinstance(reason, str) else ""


def _run_elapsed(view: Mapping[str, Any], now_ms: int) -> str:
    created = view.get("createdAt")
    finished = view.get("finishedAt", now_ms)
    if not isinstance(created, int) or not isinstance(finished, int):
        return "-"
    return format_elapsed(max(0, finished - created))


def _graph(view: Mapping[str, Any], layout: GraphLayout | None) -> list[str]:
    if layout is None:
        return ["(the definition is not available)"] + [""] * (GRAPH_LINES - 1)
    states = node_states(view)
    cards = [line.plain.rstrip() for line in render_graph(layout, states, "cards")]
    while cards and not cards[-1]:
        cards.pop()
    if layout.width <= FRAME_WIDTH and len(cards) <= GRAPH_LINES:
        return cards + [""] * (GRAPH_LINES - len(cards))
    compact = [line.plain.rstrip() for line in render_graph(layout, states, "compact")]
    focus = focus_node(view, states)
    order = [card.node for card in layout.cards]
    return _crop(compact, order.index(focus) if focus in order else 0)


def _crop(lines: list[str], focus: int) -> list[str]:
    """`GRAPH_LINES` of `lines` around `focus`, with a count of what is left out."""
    if len(lines) <= GRAPH_LINES:
        return lines + [""] * (GRAPH_LINES - len(lines))
    first = max(0, min(focus - GRAPH_LINES // 2, len(lines) - GRAPH_LINES))
    window = lines[first : first + GRAPH_LINES]
    if first > 0:
        window[0] = f"   ↑ {first + 1} more"
    hidden = len(lines) - (first + GRAPH_LINES)
    if hidden > 0:
        window[-1] = f"   ↓ {hidden + 1} more"
    return window


def _steps(view: Mapping[str, Any], layout: GraphLayout | None) -> list[str]:
    cards = {} if layout is None else layout.by_node

    def label(node: object) -> str:
        card = cards.get(str(node))
        return str(node) if card is None else card.label

    trace = view.get("trace") or {}
    items = [item for item in trace.get("items") or [] if isinstance(item, Mapping)]
    title = f"── last steps ({trace.get('count', len(items))} in all) "
    lines = [title.ljust(FRAME_WIDTH, "─")]
    for item in reversed(items[-LAST_STEPS:]):
        started, finished = item.get("startedAt"), item.get("finishedAt")
        spent = (
            finished - started if isinstance(started, int) and isinstance(finished, int) else None
        )
        after = f"  → {label(item['next'])}" if isinstance(item.get("next"), str) else ""
        lines.append(
            f"  {label(item.get('node', '?')):<32} visit {item.get('visit', '?'):<5} "
            f"attempt {item.get('attempt', '?'):<2} {item.get('outcome', '?')!s:<12}"
            f" {format_elapsed(spent):>7}{after}"
        )
    return lines
