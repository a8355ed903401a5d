"""Where the viewer's server is: a local state folder's socket, or a `piw serve` URL.

Everything the viewer sends or receives goes through `open_client` and `open_live`,
so the app, `--once` and the tests do not care which transport carries it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pi_workflows.wire.client import WorkflowClient
from pi_workflows.wire.live import LiveViews

__all__ = ["Target", "open_client", "open_live"]


@dataclass(frozen=True, slots=True)
class Target:
    """A local server (`state_dir`, started when absent) or a relay (`url`, ws://…/ws)."""

    state_dir: Path
    url: str | None = None
    client_id: str = "piw"

    def describe(self) -> str:
        """Where the viewer is connected, for its header (never a user path)."""
        return self.url if self.url is not None else "local server"


def open_client(target: Target, *, timeout: float = 30.0) -> WorkflowClient:
    """A command client (controls, pages, content) for `target`.

    Raises:
        RelayURLError: `target.url` is not a loopback `ws://` URL.
    """
    return WorkflowClient(
        target.state_dir, client_id=f"{target.client_id}-cmd", timeout=timeout, url=target.url
    )


def open_live(
    target: Target, *, timeout: float = 30.0, reconnect_timeout: float = 3600.0
) -> LiveViews:
    """Live views (the run list, one run) for `target`, reconnecting with backoff.

    Raises:
        RelayURLError: `target.url` is not a loopback `ws://` URL.
    """
    return LiveViews(
        target.state_dir,
        client_id=f"{target.client_id}-live",
        timeout=timeout,
        reconnect_timeout=reconnect_timeout,
        url=target.url,
    )
