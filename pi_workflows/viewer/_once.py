"""`piw RUN_ID --once`: one plain-text 120 × 40 frame of a run, for scripts and tests.

It waits for the run's view (a subscription, which starts a server when none runs),
loads the definition it references (verified), prints the header, the graph, the
newest lines of a recorded conversation and the last steps, and exits. It reads the
view's newest trace window and at most `CONVERSATION_PAGES` session-event pages, so a
30,000-step run or a long conversation prints as fast as a short one.
"""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
from pi_workflows.wire.client import HostUnavailableError, PackageMismatchError, WorkflowClient
from pi_workflows.wire.conversation import (
    conversation_rows,
    load_recent,
    pages_conversation,
    plain_lines,
)
from pi_workflows.wire.live import RunNotFoundError, ViewKey, WatchTimeoutError

__all__ = ["FRAME_HEIGHT", "FRAME_WIDTH", "print_once", "render_frame"]

FRAME_WIDTH: Final = 120
FRAME_HEIGHT: Final = 40
LAST_STEPS: Final = 4
HEADER_LINES: Final = 4
GRAPH_LINES: Final = FRAME_HEIGHT - HEADER_LINES - 1 - LAST_STEPS
CONVERSATION_LINES: Final = 16
"""The lines of a recorded conversation under its title (taken from the graph's)."""
CONVERSATION_PAGES: Final = 4
HEAD_CHARS: Final = 300
"""The most characters of one text, arguments or result the frame shows."""

EXIT_FAILED: Final = 1
EXIT_UNAVAILABLE: Final = 3
EXIT_TIMEOUT: Final = 6
"""`piw view`'s exit codes (cli/_main.py COMMAND_EXITS; the CLI floor is above this one)."""


@dataclass(frozen=True, slots=True)
class Fetched:
    """What one frame shows: the view, its definition and its newest conversation."""

    view: Mapping[str, Any]
    definition: Mapping[str, Any] | None
    messages: Sequence[Mapping[str, Any]] = field(default_factory=list)
    """The folded messages of the newest session-event pages."""
    first: int = 0
    """The position of the first event `messages` were folded from."""


def print_once(target: Target, run_id: str, *, timeout: float) -> int:
    """Print one 120 × 40 frame of `run_id`'s view; return the exit code.

    `timeout` bounds everything (a server start, the connection, the view, the
    definition and the conversation): the fetch runs in a daemon thread, so a server
    that accepts the connection but never answers cannot hold the frame past it.
    """
    fetched: list[Fetched | BaseException] = []

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
    frame = render_frame(
        outcome.view,
        outcome.definition,
        now_ms=int(time.time() * 1000),
        messages=outcome.messages,
        first=outcome.first,
    )
    sys.stdout.write(frame)
    sys.stdout.flush()
    return 0


def _fetch(target: Target, run_id: str, timeout: float) -> Fetched:
    deadline = time.monotonic() + timeout
    view = _wait_for_view(target, run_id, timeout)
    ref = ((view.get("graph") or {}).get("definition")) or {}
    if "digest" not in ref and "sessionRecord" not in view:
        return Fetched(view, None)
    with open_client(target, timeout=max(1.0, deadline - time.monotonic())) as client:
        definition = _load_definition(client, run_id, ref)
        pages = load_recent(
            client, view, max_pages=CONVERSATION_PAGES, min_messages=CONVERSATION_LINES
        )
    if not pages:
        return Fetched(view, definition)
    return Fetched(view, definition, pages_conversation(pages), pages[0].first)


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
    client: WorkflowClient, run_id: str, ref: Mapping[str, Any]
) -> Mapping[str, Any] | None:
    """The verified definition snapshot, or None when the view holds no reference."""
    if "digest" not in ref:
        return None
    loaded = json.loads(client.run_content(run_id, ref))
    return loaded if isinstance(loaded, dict) else None


# --- the frame --------------------------------------------------------------------------


def render_frame(
    view: Mapping[str, Any],
    definition: Mapping[str, Any] | None,
    *,
    now_ms: int,
    messages: Sequence[Mapping[str, Any]] = (),
    first: int = 0,
) -> str:
    """The frame as text: exactly `FRAME_HEIGHT` lines of `FRAME_WIDTH` columns.

    Only a running run's elapsed time depends on `now_ms`; a finished run's frame
    depends on the view, the definition and the conversation alone. A run with a
    session record shows the newest lines of its conversation (`messages`, folded
    from the event at `first` on) between the graph and the last steps.
    """
    layout = None if definition is None else layout_definition(definition)
    if "sessionRecord" in view:
        height = GRAPH_LINES - CONVERSATION_LINES - 1
        middle = [*_graph(view, layout, height), *_conversation(view, messages, first)]
    else:
        middle = _graph(view, layout, GRAPH_LINES)
    lines = [*_header(view, now_ms), *middle, *_steps(view, layout)]
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


def _graph(view: Mapping[str, Any], layout: GraphLayout | None, height: int) -> list[str]:
    if layout is None:
        return ["(the definition is not available)"] + [""] * (height - 1)
    states = node_states(view)
    cards = [line.plain.rstrip() for line in render_graph(layout, states, "cards")]
    while cards and not cards[-1]:
        cards.pop()
    if layout.width <= FRAME_WIDTH and len(cards) <= height:
        return cards + [""] * (height - len(cards))
    compact = [line.plain.rstrip() for line in render_graph(layout, states, "compact")]
    focus = focus_node(view, states)
    order = [card.node for card in layout.cards]
    return _crop(compact, order.index(focus) if focus in order else 0, height)


def _crop(lines: list[str], focus: int, height: int) -> list[str]:
    """`height` of `lines` around `focus`, with a count of what is left out."""
    if len(lines) <= height:
        return lines + [""] * (height - len(lines))
    first = max(0, min(focus - height // 2, len(lines) - height))
    window = lines[first : first + height]
    if first > 0:
        window[0] = f"   ↑ {first + 1} more"
    hidden = len(lines) - (first + height)
    if hidden > 0:
        window[-1] = f"   ↓ {hidden + 1} more"
    return window


def _head(text: str) -> str:
    """`text`, or its first `HEAD_CHARS` characters and a note of its size."""
    if len(text) <= HEAD_CHARS:
        return text
    return f"{text[:HEAD_CHARS]} … ({len(text.encode('utf-8'))} bytes in all)"


def _conversation(
    view: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], first: int
) -> list[str]:
    """The conversation's title and its newest `CONVERSATION_LINES` lines (as `run
    show` prints them, each text bounded and wrapped), with a count of the earlier."""
    rows = list(conversation_rows(view, messages, _head, first=first))
    title = rows[0].text if rows else "conversation"
    lines = [wrapped for row in rows[1:] for line in plain_lines(row) for wrapped in _wrap(line)]
    if len(lines) > CONVERSATION_LINES:
        kept = lines[len(lines) - CONVERSATION_LINES + 1 :]
        hidden = len(lines) - len(kept)
        lines = [f"   ↑ {hidden} earlier lines (run show prints them)", *kept]
    heading = f"── {title} ".ljust(FRAME_WIDTH, "─")
    return [heading, *lines] + [""] * (CONVERSATION_LINES - len(lines))


def _wrap(line: str) -> list[str]:
    """A line broken to the frame's width, its further lines under its text."""
    if len(line) <= FRAME_WIDTH:
        return [line]
    indent = " " * (16 if line.startswith("    ") else 4)  # a message's text, or a turn's
    wrapped = textwrap.wrap(line, FRAME_WIDTH, subsequent_indent=indent, break_on_hyphens=False)
    return wrapped or [line]


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
