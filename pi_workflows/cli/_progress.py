"""Progress of a maintenance command (`state prune --apply`, `state backup`) off a
terminal: its `maintenanceProgress` events as JSON lines (`--json`), or one line on
stderr when a stage starts. The terminal's rich bar stays with each command."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import click

from pi_workflows.cli._main import _print_json

__all__ = ["StageLines", "json_line"]


def json_line(event: dict[str, Any]) -> None:
    """One JSON line on stdout per progress event (`--json`)."""
    if event.get("kind") == "maintenanceProgress":
        body = event["payload"]
        _print_json({"stage": body["stage"], "done": body["done"], "total": body["total"]})
        sys.stdout.flush()


class StageLines:
    """One line on stderr when a stage starts (a pipe or a log gets no bar): the stage's
    words from `words` (`{total}` filled in), else its name."""

    def __init__(self, words: Mapping[str, str]) -> None:
        self._words = words
        self._stage: str | None = None

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("kind") != "maintenanceProgress":
            return
        body = event["payload"]
        if body["stage"] == self._stage:
            return
        self._stage = body["stage"]
        words = self._words.get(body["stage"], body["stage"])
        click.echo(words.format(total=body["total"]), err=True)
