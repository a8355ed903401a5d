"""One status palette for every terminal renderer (`run list`, `run show`, `run watch`).

Every display status and every attempt outcome has one colour, and `ambiguous` (an
operator must act) looks like no other status.
"""

from __future__ import annotations

from typing import get_args

from rich.style import Style

from pi_workflows.cli._palette import STATUS_STYLES, styled
from pi_workflows.wire.protocol import DISPLAY_STATUSES
from pi_workflows.wire.views import TraceOutcome


def test_every_display_status_and_attempt_outcome_has_a_colour() -> None:
    statuses = {*DISPLAY_STATUSES, *get_args(TraceOutcome)}
    assert sorted(s for s in statuses if not STATUS_STYLES.get(s)) == []
    for status in statuses:
        assert Style.parse(STATUS_STYLES[status]), status  # a style rich can draw
        assert styled(status).style == STATUS_STYLES[status]


def test_ambiguous_looks_like_no_other_status() -> None:
    others = {style for status, style in STATUS_STYLES.items() if status != "ambiguous"}
    assert STATUS_STYLES["ambiguous"] not in others


def test_a_status_this_version_does_not_know_is_drawn_plain() -> None:
    assert styled("someday").style == ""
